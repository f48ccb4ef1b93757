"""Turning training state into a safe JSON tree plus named tensor leaves, and back.

``flatten(state)`` walks dicts, lists, tuples, ``nn.Module`` / optimizer / scheduler objects (anything with
``state_dict()``), tensors and numpy arrays. Tensors become *leaves* (named by their path, e.g.
``model/fc.weight`` or ``optim/state/0/exp_avg``); everything else must be a plain Python value
(None, bool, int, float incl. nan/inf, str, bytes, torch.dtype/device/Size) and is written into the JSON
tree. Anything else raises :class:`UnsafeValueError` unless ``allow_pickle=True`` is given, in which case
it is pickled into a leaf that restore refuses unless it too is given ``allow_pickle=True``.

Tree nodes: JSON scalars as themselves; lists as JSON lists; everything else as a one-key object
``{"$tag": ...}``: ``$dict`` ([[key, value], ...], keeps non-string keys), ``$tuple``, ``$float``
("nan", "inf", "-inf"), ``$bytes`` (base64), ``$tensor`` / ``$ndarray`` / ``$pickle`` (leaf name),
``$dtype``, ``$device``, ``$size``, ``$state`` ({"kind", "class", "value"}).

Groups: with ``group_bytes``, small contiguous CPU tensors (norm weights, biases, step counters: most of a
model's tensors and little of its bytes) are copied together, per dtype, into one buffer: a
*group* leaf (named ``GROUP_PREFIX + dtype``) that the save encodes as one tensor; the group lists its members
(``Leaf.members``: their names and shapes, in the order of their bytes in it), which have no leaf of their own. Per
tensor this costs a name and a shape instead of a leaf, a buffer, a copy call and, later, a chunk, a frame and a
manifest entry of its own.
"""

from __future__ import annotations

import base64
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import UnsafeValueError
from ._nogc import no_gc

__all__ = ["Leaf", "flatten", "unflatten", "leaf_from_bytes", "DTYPES", "GROUP_PREFIX"]

#: the name of a group leaf is this and its dtype (a leaf's own name is a path: it never starts with a NUL)
GROUP_PREFIX = "\x00group/"
#: small tensors of a dtype are grouped when there are at least this many of them
GROUP_MIN = 8

#: dtype name -> element width in bytes
DTYPES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "complex64": 8, "complex128": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip


@dataclass
class Leaf:
    """One tensor (or pickled value) of the state, as contiguous raw little-endian bytes."""

    name: str
    kind: str  # "tensor" | "ndarray" | "pickle"
    dtype: str
    shape: list[int]
    data: np.ndarray  # uint8, contiguous, owned copy (the snapshot)
    #: a group leaf (kind "group"): its members' names and shapes, in the order of their bytes in it (the members
    #: have no leaf of their own: at 10,000 small tensors a leaf each cost 3 ms per save in the walk alone)
    members: list[tuple[str, list[int]]] | None = None
    #: another rank encodes this leaf (a spread snapshot of a replicated state, see ``Spread``): ``data`` is
    #: empty and ``size`` holds its byte count
    remote: bool = False
    #: its byte count where ``data`` does not hold its bytes (-1: it does): a remote leaf
    size: int = -1

    @property
    def nbytes(self) -> int:
        return self.size if self.size >= 0 else int(self.data.nbytes)

    @property
    def width(self) -> int:
        """Width of the delta/byte-plane unit (complex numbers split into their two floats)."""
        return {"complex64": 4, "complex128": 8}.get(self.dtype, DTYPES.get(self.dtype, 1))


def _key_str(k: Any) -> str:
    s = str(k)
    return s.replace("/", "%2F")


def _tensor_dtype(name: str, t: Any) -> str:
    """The format's name of tensor ``t``'s dtype; :class:`UnsafeValueError` for a tensor it cannot hold."""
    import torch

    if t.is_sparse or t.layout != torch.strided:
        raise UnsafeValueError(f"{name}: sparse tensors are not supported by the checkpoint format")
    if getattr(t, "is_quantized", False):
        raise UnsafeValueError(f"{name}: quantized tensors are not supported by the checkpoint format")
    dtype = str(t.dtype).replace("torch.", "")
    if dtype not in DTYPES:
        raise UnsafeValueError(f"{name}: dtype {t.dtype} is not supported by the checkpoint format")
    return dtype


def _tensor_leaf(
    name: str,
    t: Any,
    copy: bool,
    alloc: Callable[..., np.ndarray] | None = None,
    pending: set[Any] | None = None,
) -> Leaf:
    """A leaf holding a host copy of tensor ``t``.

    A tensor on an accelerator is copied into a page-locked host buffer from ``alloc(nbytes, pinned=True)``
    with ``non_blocking=True`` and its device is added to ``pending``: the caller must wait for those devices
    (:func:`wait_for_copies`) before the bytes are read. The copies are ordered on the tensor's current stream,
    so training work queued after them cannot change the bytes being copied.
    """
    import torch

    dtype = _tensor_dtype(name, t)
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    nbytes = t.numel() * t.element_size()
    if copy and alloc is not None and nbytes:
        # copy into a recycled host buffer: fresh allocations page-fault, which is slow on some hosts
        if t.device.type == "cpu":
            buf = alloc(nbytes)
            if t.is_contiguous():
                # torch's copy, on its intra-op threads as clone() is (one per core; one for several ranks on a
                # host: torchrun's OMP_NUM_THREADS=1, which %%distributed's workers get too). Our own encoding
                # threads are idle here: a save waits for the one before it. A single-threaded memcpy (np.copyto,
                # until 2026-12-05) made the stall of a 40 MB state 7-8 ms against 5-6.5
                torch.from_numpy(buf).copy_(t.reshape(-1).view(torch.uint8))
            else:
                torch.from_numpy(buf).view(t.dtype).view(t.shape).copy_(t)
        else:
            buf = alloc(nbytes, pinned=True)
            host = torch.from_numpy(buf).view(t.dtype).view(t.shape)
            asynchronous = pending is not None and host.is_pinned()
            host.copy_(t, non_blocking=asynchronous)
            if asynchronous:
                pending.add(t.device)  # type: ignore[union-attr]
        return Leaf(name, "tensor", dtype, list(t.shape), buf)
    if t.device.type != "cpu":
        host = t.to("cpu").contiguous()
    elif copy:
        host = t.contiguous().clone() if t.is_contiguous() else t.contiguous()
    else:
        host = t.contiguous()
    flat = host.reshape(-1)
    data = flat.view(torch.uint8).numpy() if flat.numel() else np.zeros(0, dtype=np.uint8)
    return Leaf(name, "tensor", dtype, list(t.shape), data)


def flatten(
    state: Any,
    allow_pickle: bool = False,
    copy: bool = True,
    alloc: Callable[..., np.ndarray] | None = None,
    group_bytes: int = 0,
    spread: Any = None,
) -> tuple[Any, list[Leaf]]:
    """Split ``state`` into a JSON-safe tree and a list of leaves (copied: a point-in-time snapshot).

    Parameters
    ----------
    state
        Any mix of dicts/lists/tuples, objects with ``state_dict()``, tensors, numpy arrays and plain values.
    allow_pickle
        Pickle values that have no safe representation instead of raising.
    copy
        Copy tensors (needed for background saves; CUDA tensors are always copied to host).
    alloc
        ``alloc(nbytes, pinned=False)`` returns a writable ``uint8`` buffer for a copy (lets callers recycle
        buffers); ``pinned=True`` asks for page-locked memory (copies from a GPU then run asynchronously, all of
        them waited for before ``flatten`` returns).
    group_bytes
        With ``copy`` and ``alloc``: contiguous CPU tensors under this many bytes are copied into group
        buffers, one per dtype (see the module docstring); 0: none are.
    spread
        A replicated state whose encoding the ranks share (a ``save.spread.Spread``: its ``rank``, ``min_bytes``
        and ``owner(name, nbytes)``): this rank copies the tensors of at least ``min_bytes`` it owns, and rank 0
        everything else; the other leaves are ``remote`` (listed, not copied). The walk, names included, is the
        same on every rank.

    Raises
    ------
    UnsafeValueError
        A value has no safe representation (naming its path) and ``allow_pickle`` is False.
    """
    f = _Flattener(allow_pickle, copy, alloc)
    f.group_bytes = group_bytes if copy and alloc is not None else 0
    f.spread = spread
    try:
        with no_gc():
            tree = f.walk(state, "")
            f.copy_groups()
    finally:
        wait_for_copies(f.pending)
    return tree, f.leaves


class _Flattener:
    """One walk of :func:`flatten`: the leaves found so far (with unique names) and the devices copied from."""

    def __init__(self, allow_pickle: bool, copy: bool, alloc: Callable[..., np.ndarray] | None) -> None:
        self.allow_pickle = allow_pickle
        self.copy = copy
        self.alloc = alloc
        self.leaves: list[Leaf] = []
        self.seen_names: set[str] = set()
        self.pending: set[Any] = set()  # devices with asynchronous copies to host in flight
        self.group_bytes = 0
        self.spread: Any = None  # a spread snapshot: which rank encodes each big tensor (see ``flatten``)
        self.grouped: dict[str, list[tuple[str, Any]]] = {}  # dtype -> (member name, its tensor), in order
        # torch's plain tensor class and strided layout, where torch is loaded (a state without torch values
        # needs neither, and importing torch here would cost seconds): the walk's fast path for the commonest leaf
        torch = sys.modules.get("torch")
        self.tensor_type: type | None = getattr(torch, "Tensor", None)
        self.strided: Any = getattr(torch, "strided", None)
        # torch dtype -> its name, of the dtypes grouped
        self.grouped_dtypes: dict[Any, str] = (
            {getattr(torch, n): n for n in _GROUPED if hasattr(torch, n)} if torch is not None else {}
        )

    def tiny(self, t: Any, path: str) -> Any:
        """The node of a small CPU tensor copied later with the others of its dtype (None: not one)."""
        if t.layout is not self.strided:
            return None
        dtype = self.grouped_dtypes.get(t.dtype)
        if dtype is None:
            return None
        nbytes = t.nbytes
        # (the grouped dtypes are neither complex, so never conjugate views, nor quantized)
        if not 0 < nbytes < self.group_bytes or not t.is_cpu or not t.is_contiguous() or t.is_neg():
            return None
        name = self.unique(path)
        self.grouped.setdefault(dtype, []).append((name, t))
        return {"$tensor": name}

    def copy_groups(self) -> None:
        """Copy the small tensors into their group buffers, one per dtype: the 1-D ones first (one ``torch.cat``
        of them as they are), then the 0-D ones (one ``torch.stack``), then the others (one ``torch.cat`` of a
        flat view of each: a view costs about a microsecond, ten times the rest of a member's copy). The group
        leaf lists its members (names, shapes) in the order of their bytes (``Leaf.members``)."""
        if not self.grouped:
            return
        import torch

        assert self.alloc is not None
        for dtype, members in self.grouped.items():
            if len(members) < GROUP_MIN:  # a few small tensors: each its own leaf (a group buys nothing)
                for name, t in members:
                    self.leaves.append(_tensor_leaf(name, t, self.copy, self.alloc, self.pending))
                continue
            by_dims: tuple[list[tuple[str, Any]], ...] = ([], [], [])  # 1-D, 0-D, others
            for m in members:
                nd = m[1].dim()
                by_dims[0 if nd == 1 else 1 if nd == 0 else 2].append(m)
            counts = [sum(t.numel() for _, t in part) for part in by_dims]  # elements of each part
            buf = self.alloc(sum(counts) * DTYPES[dtype])
            group = Leaf(GROUP_PREFIX + dtype, "group", dtype, [sum(counts)], buf)
            out = torch.from_numpy(buf).view(getattr(torch, dtype))
            at = 0
            with torch.no_grad():
                for k, (part, n) in enumerate(zip(by_dims, counts, strict=True)):
                    if not part:
                        continue
                    ts = [t for _, t in part]
                    dst = out[at : at + n]
                    if k == 0:
                        torch.cat(ts, out=dst)
                    elif k == 1:
                        torch.stack(ts, out=dst)
                    else:
                        torch.cat([t.reshape(-1) for t in ts], out=dst)
                    at += n
            group.members = [(name, list(t.shape)) for part in by_dims for name, t in part]
            self.leaves.append(group)
        self.grouped = {}

    def add_leaf(self, leaf: Leaf) -> str:
        leaf.name = self.unique(leaf.name)
        self.leaves.append(leaf)
        return leaf.name

    def unique(self, path: str) -> str:
        """The name of the leaf at ``path``: the path, made unique (two keys can map to one path)."""
        name = path
        i = 1
        while name in self.seen_names:
            name = f"{path}~{i}"
            i += 1
        self.seen_names.add(name)
        return name

    def tensor(self, t: Any, path: str) -> Any:
        """The node of a plain tensor: copied alone, into its group (a small one), or, in a spread snapshot, left
        to the rank that encodes it."""
        sp = self.spread
        if sp is not None:
            nbytes = t.numel() * t.element_size()
            if nbytes >= sp.min_bytes or sp.rank:  # (rank 0 encodes every small tensor, in its groups)
                name = self.unique(path)
                if nbytes >= sp.min_bytes and sp.owner(name, nbytes) == sp.rank:
                    leaf = _tensor_leaf(name, t, self.copy, self.alloc, self.pending)
                else:
                    dtype = _tensor_dtype(name, t)  # (an unsupported tensor fails the save on every rank)
                    leaf = Leaf(name, "tensor", dtype, list(t.shape), _EMPTY, remote=True, size=nbytes)
                self.leaves.append(leaf)
                return {"$tensor": name}
        if self.group_bytes:
            node = self.tiny(t, path)
            if node is not None:
                return node
        return {"$tensor": self.add_leaf(_tensor_leaf(path, t, self.copy, self.alloc, self.pending))}

    def remote(self, path: str, kind: str, dtype: str, shape: list[int], nbytes: int) -> str:
        """A leaf another rank of a spread snapshot encodes (rank 0: everything but the big tensors)."""
        return self.add_leaf(Leaf(path, kind, dtype, shape, _EMPTY, remote=True, size=nbytes))

    def walk(self, obj: Any, path: str) -> Any:
        if type(obj) is self.tensor_type and self.tensor_type is not None:  # the commonest leaf, first
            return self.tensor(obj, path)
        if obj is None or isinstance(obj, bool | str):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            if math.isnan(obj) or math.isinf(obj):
                return {"$float": repr(obj)}
            return float(obj)
        if isinstance(obj, dict):
            return self._dict(obj, path)
        if isinstance(obj, list):
            return [self.walk(v, f"{path}/{i}") for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return {"$tuple": [self.walk(v, f"{path}/{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, bytes | bytearray):
            return {"$bytes": base64.b64encode(bytes(obj)).decode()}
        if isinstance(obj, np.ndarray):
            return self._ndarray(obj, path)
        if isinstance(obj, np.generic):
            return self.walk(obj.item(), path)
        if (type(obj).__module__ or "").startswith("torch"):
            node = self._torch(obj, path)
            if node is not None:
                return node
        if hasattr(obj, "state_dict") and callable(obj.state_dict):
            return self._state(obj, path)
        return self.pickled(obj, path)

    def _dict(self, obj: dict[Any, Any], path: str) -> Any:
        if all(isinstance(k, str) for k in obj) and not any(k.startswith("$") for k in obj):
            return {k: self.walk(v, f"{path}/{_key_str(k)}" if path else _key_str(k)) for k, v in obj.items()}
        return {
            "$dict": [
                [self.walk(k, f"{path}/$key"), self.walk(v, f"{path}/{_key_str(k)}" if path else _key_str(k))]
                for k, v in obj.items()
            ]
        }

    def _ndarray(self, obj: np.ndarray, path: str) -> Any:
        if obj.dtype.name not in DTYPES or obj.dtype.hasobject:
            return self.pickled(obj, path)
        if self.spread is not None and self.spread.rank:
            return {"$ndarray": self.remote(path, "ndarray", obj.dtype.name, list(obj.shape), obj.nbytes)}
        arr = np.ascontiguousarray(obj).astype(obj.dtype.newbyteorder("<"), copy=True)
        return {
            "$ndarray": self.add_leaf(
                Leaf(path, "ndarray", arr.dtype.name, list(obj.shape), arr.reshape(-1).view(np.uint8))
            )
        }

    def _torch(self, obj: Any, path: str) -> Any:
        """The node of a torch value (None: not one of torch's value types)."""
        import torch

        if isinstance(obj, torch.Tensor):
            if type(obj) is not torch.Tensor and not isinstance(obj, torch.nn.Parameter):
                return self.pickled(obj, path)
            return self.tensor(obj, path)
        if isinstance(obj, torch.dtype):
            return {"$dtype": str(obj).replace("torch.", "")}
        if isinstance(obj, torch.device):
            return {"$device": str(obj)}
        if isinstance(obj, torch.Size):
            return {"$size": list(obj)}
        return None

    def _state(self, obj: Any, path: str) -> Any:
        kind = "other"
        try:
            import torch

            if isinstance(obj, torch.nn.Module):
                kind = "module"
            elif isinstance(obj, torch.optim.Optimizer):
                kind = "optimizer"
        except ImportError:  # pragma: no cover
            pass
        return {
            "$state": {
                "kind": kind,
                "class": type(obj).__qualname__,
                "value": self.walk(obj.state_dict(), path),
            }
        }

    def pickled(self, obj: Any, path: str) -> Any:
        if not self.allow_pickle:
            raise UnsafeValueError(
                f"{path or '<root>'}: a {type(obj).__qualname__} has no safe representation; store plain values, "
                "tensors, arrays or objects with state_dict(), or pass allow_pickle=True"
            )
        if self.spread is not None and self.spread.rank:  # (its size is not known without pickling it)
            return {"$pickle": self.remote(path, "pickle", "uint8", [0], 0)}
        import pickle

        raw = np.frombuffer(pickle.dumps(obj, protocol=5), dtype=np.uint8).copy()
        return {"$pickle": self.add_leaf(Leaf(path, "pickle", "uint8", [raw.nbytes], raw))}


_EMPTY = np.zeros(0, dtype=np.uint8)
#: the dtypes grouped (those torch.cat supports on every torch version this package runs with)
_GROUPED = frozenset(
    ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
)


def leaf_nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def wait_for_copies(devices: set[Any]) -> None:
    """Wait until the copies queued on each device's current stream are done (the snapshot is then complete)."""
    if not devices:
        return
    import torch

    for dev in devices:
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()
        else:  # other accelerators (mps, xpu, ...): the whole device
            mod = getattr(torch, dev.type, None)
            sync = getattr(mod, "synchronize", None)
            if sync is not None:
                sync()


def leaf_from_bytes(meta: dict[str, Any], data: np.ndarray, allow_pickle: bool = False) -> Any:
    """Rebuild a leaf's value from its manifest entry and raw bytes."""
    kind = meta.get("kind", "tensor")
    dtype = meta["dtype"]
    shape = meta["shape"]
    if kind == "pickle":
        if not allow_pickle:
            raise UnsafeValueError(
                f"{meta.get('name')}: this checkpoint holds a pickled value; restoring it can run code. "
                "Pass allow_pickle=True only if you trust the store."
            )
        import pickle

        return pickle.loads(data.tobytes())
    if kind == "ndarray":
        return (
            data.view(np.dtype(dtype).newbyteorder("<")).reshape(shape).copy()
            if data.nbytes
            else np.zeros(shape, dtype)
        )
    import torch

    tdt = getattr(torch, dtype)
    if data.nbytes == 0:
        return torch.empty(shape, dtype=tdt)
    t = torch.from_numpy(data)  # data is a fresh writable array owned by us
    return t.view(tdt).reshape(shape)


def unflatten(tree: Any, values: dict[str, Any]) -> Any:
    """Rebuild the state from the tree and the decoded leaves (``$state`` nodes become their state dicts)."""
    return _unflatten_node(tree, values)


def _unflatten_node(node: Any, values: dict[str, Any]) -> Any:
    # (a module-level function, not a closure that calls itself: such a closure is a reference cycle that would
    # keep ``values``, every restored tensor, alive after the caller drops them, until the cyclic collector ran)
    if isinstance(node, list):
        return [_unflatten_node(v, values) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((tag, val),) = node.items()
        if tag.startswith("$"):
            if tag == "$dict":
                return {_hashable(_unflatten_node(k, values)): _unflatten_node(v, values) for k, v in val}
            if tag == "$tuple":
                return tuple(_unflatten_node(v, values) for v in val)
            if tag == "$float":
                return float(val)
            if tag == "$bytes":
                return base64.b64decode(val)
            if tag in ("$tensor", "$ndarray", "$pickle"):
                return values[val]
            if tag == "$dtype":
                import torch

                dt = getattr(torch, val, None) if isinstance(val, str) else None
                if not isinstance(dt, torch.dtype):  # a name from the store: only ever a dtype
                    raise ValueError(f"$dtype {val!r} is not a torch dtype")
                return dt
            if tag == "$device":
                import torch

                return torch.device(val)
            if tag == "$size":
                import torch

                return torch.Size(val)
            if tag == "$state":
                return _unflatten_node(val["value"], values)
            raise ValueError(f"unknown tree tag {tag!r}")
    return {k: _unflatten_node(v, values) for k, v in node.items()}


def _hashable(k: Any) -> Any:
    return tuple(k) if isinstance(k, list) else k


def tree_leaf_names(tree: Any) -> list[str]:
    """All leaf names a tree references."""
    out: list[str] = []
    _leaf_names(tree, out)
    return out


def _leaf_names(node: Any, out: list[str]) -> None:
    if isinstance(node, list):
        for v in node:
            _leaf_names(v, out)
    elif isinstance(node, dict):
        if len(node) == 1:
            ((tag, val),) = node.items()
            if tag in ("$tensor", "$ndarray", "$pickle"):
                out.append(val)
                return
        for v in node.values():
            _leaf_names(v, out)
