"""Writing a restored state (or a sub-tree of it) to a file any tool reads: ``.safetensors`` or a ``torch.save``
file that loads with ``torch.load(..., weights_only=True)``.

safetensors refuses tensors that share storage (tied weights): each alias after the first is written as its own
copy (a clone), so every name of the state dict is in the file and ``load_state_dict`` finds it. safetensors holds
tensors only: numbers, strings and other plain values are left out and named in the result. The ``torch.save``
export keeps the structure (dicts, lists, tuples, tensors, numbers, strings, None) and refuses anything else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import CheckpointError

__all__ = [
    "ExportError",
    "ExportResult",
    "export_state",
    "format_of",
    "select_tree",
    "write_export",
]

_PLAIN = (bool, int, float, str, type(None))


class ExportError(CheckpointError, ValueError):
    """A checkpoint cannot be exported as asked (a key ``select`` does not find, a value the format cannot hold)."""


@dataclass
class ExportResult:
    """What an export wrote."""

    path: str
    format: str  # "safetensors" or "torch"
    tensors: int
    nbytes: int
    #: names of values a safetensors file cannot hold (numbers, strings, ...): left out
    dropped: list[str] = field(default_factory=list)
    #: names of tensors that shared storage with an earlier one (tied weights): written as their own copy
    cloned: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        extra = f", {len(self.dropped)} non-tensor value(s) left out" if self.dropped else ""
        tied = f", {len(self.cloned)} tied tensor(s) copied" if self.cloned else ""
        return f"<export {self.path} ({self.format}): {self.tensors} tensors, {self.nbytes} B{extra}{tied}>"


def format_of(dest: str, fmt: str | None) -> str:
    """``"safetensors"`` or ``"torch"``: ``fmt`` if given, else from the file's suffix."""
    if fmt is not None:
        f = {"pt": "torch", "pth": "torch", "torch": "torch", "safetensors": "safetensors"}.get(fmt.lower())
        if f is None:
            raise ExportError(f"unknown export format {fmt!r}: use 'safetensors' or 'torch'")
        return f
    suffix = os.path.splitext(dest)[1].lower()
    if suffix == ".safetensors":
        return "safetensors"
    if suffix in (".pt", ".pth"):
        return "torch"
    raise ExportError(
        f"cannot tell the export format of {dest!r}: name it *.safetensors, *.pt or *.pth, or pass format= (--format)"
    )


def select_tree(state: Any, select: str | None) -> Any:
    """The sub-tree of ``state`` at the key path ``select`` (``"model"``, ``"model.encoder"``). A path may go on
    into a flat state dict's dotted names: ``"model.encoder"`` of ``{"model": {"encoder.w": t}}`` is ``{"w": t}``."""
    if not select:
        return state
    parts = select.split(".")
    node, i = state, 0
    while i < len(parts):
        if isinstance(node, Mapping):
            for j in range(len(parts), i, -1):  # the longest key first: state dict names hold dots
                key = ".".join(parts[i:j])
                if key in node:
                    node, i = node[key], j
                    break
            else:
                prefix = ".".join(parts[i:]) + "."
                sub = {
                    k[len(prefix) :]: v
                    for k, v in node.items()
                    if isinstance(k, str) and k.startswith(prefix)
                }
                if sub:
                    return sub
                keys = ", ".join(repr(k) for k in list(node)[:10])
                raise ExportError(
                    f"select {select!r}: no key {parts[i]!r} in the checkpoint (keys there: {keys})"
                )
        elif isinstance(node, (list, tuple)) and parts[i].isdigit() and int(parts[i]) < len(node):
            node, i = node[int(parts[i])], i + 1
        else:
            raise ExportError(f"select {select!r}: {'.'.join(parts[:i]) or 'the state'} is not a dict")
    return node


def _tensor(v: Any) -> Any:
    """A CPU torch tensor for a tensor or array leaf, else None."""
    import torch

    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, np.ndarray) and v.dtype != object:
        return torch.from_numpy(np.ascontiguousarray(v))
    return None


def _flatten(tree: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            _flatten(v, f"{prefix}{k}.", out)
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            _flatten(v, f"{prefix}{i}.", out)
    else:
        out[prefix[:-1]] = tree


def _safetensors(tree: Any, path: str, metadata: dict[str, str]) -> ExportResult:
    import torch
    from safetensors.torch import save_file

    leaves: dict[str, Any] = {}
    _flatten(tree if isinstance(tree, (Mapping, list, tuple)) else {"tensor": tree}, "", leaves)
    tensors: dict[str, Any] = {}
    dropped, cloned, seen = [], [], set()
    for name, v in leaves.items():
        t = _tensor(v)
        if t is None:
            dropped.append(name)
            continue
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if (
            (ptr is not None and ptr in seen)
            or not t.is_contiguous()
            or t.nbytes != t.untyped_storage().nbytes()
        ):
            if ptr in seen:
                cloned.append(name)
            t = t.clone(memory_format=torch.contiguous_format)
        if ptr is not None:
            seen.add(ptr)
        tensors[name] = t
    save_file(tensors, path, metadata=metadata)
    return ExportResult(
        path, "safetensors", len(tensors), sum(t.nbytes for t in tensors.values()), dropped, cloned
    )


def _plain(v: Any, name: str, count: list[int]) -> Any:
    """``v`` with only what ``torch.load(weights_only=True)`` accepts; anything else raises, naming it."""
    t = _tensor(v)
    if t is not None:
        count[0] += 1
        count[1] += t.nbytes
        return t
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Mapping):
        return {k: _plain(x, f"{name}.{k}" if name else str(k), count) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        items = [_plain(x, f"{name}.{i}" if name else str(i), count) for i, x in enumerate(v)]
        return items if isinstance(v, list) else tuple(items)
    raise ExportError(
        f"cannot export {name or 'the state'} ({type(v).__name__}) to a torch.save file that loads with "
        "weights_only=True: only tensors, dicts, lists, tuples, numbers, strings and None; select a sub-tree "
        "without it (select=)"
    )


def write_export(
    state: Any, dest: str | os.PathLike[str], fmt: str, metadata: dict[str, str]
) -> ExportResult:
    """Write ``state`` to ``dest`` (atomically: a partial file never has its name)."""
    path = os.fspath(dest)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        if fmt == "safetensors":
            res = _safetensors(state, tmp, metadata)
        else:
            import torch

            count = [0, 0]
            torch.save(_plain(state, "", count), tmp)
            res = ExportResult(tmp, "torch", count[0], count[1])
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    res.path = path
    return res


def export_state(
    ckpt: Any, ckpt_id: str | None, dest: str | os.PathLike[str], select: str | None, fmt: str | None
) -> ExportResult:
    """Restore checkpoint ``ckpt_id`` (latest if None) of the Checkpointer ``ckpt`` on the CPU, without its
    per-rank sections and without unpickling anything, and write its sub-tree ``select`` to ``dest``."""
    kind = format_of(os.fspath(dest), fmt)
    doc = ckpt.manifest(ckpt_id)
    state = ckpt.restore(doc["id"], map_location="cpu", allow_pickle=False, per_rank="drop")
    meta = {"format": "pt", "gpu_notebook.checkpoint": str(doc["id"]), "step": str(doc.get("step", ""))}
    if select:
        meta["select"] = select
    tree = select_tree(state, select)
    if select and not isinstance(tree, (Mapping, list, tuple)):  # one tensor: it keeps its last name
        tree = {select.rsplit(".", 1)[-1]: tree}
    return write_export(tree, dest, kind, meta)
