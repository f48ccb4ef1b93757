"""Framework objects kept in checkpoints (hyper-parameters, callback and loop states), made storable without
pickling the tensors.

A framework's checkpoint is mostly tensors and plain values, which the checkpoint format stores as they are. A
few values are not plain: an ``argparse.Namespace`` or a ``pathlib`` path among the hyper-parameters, an enum,
a set. :func:`to_safe` turns those into tagged plain dicts (``{MARK: kind, "value": ...}``) and
:func:`from_safe` turns them back. Anything else is refused with :class:`UnsafeValueError` naming its path,
unless ``pickle_objects=True``: then that one object is pickled on its own, and a pickled object that holds a
tensor (or an array) is still refused, so tensors always go through the chunked, delta-compressed path.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import pickle
from typing import Any

from .._errors import UnsafeValueError

__all__ = ["MARK", "to_safe", "from_safe"]

#: the key of a tagged value (a user dict holding it is itself tagged as "dict", so it cannot be mistaken)
MARK = "__gpu_notebook_value__"

_PLAIN = (type(None), bool, int, float, str, bytes)


def _is_torch_value(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("torch") or mod.startswith("numpy")


def to_safe(obj: Any, path: str = "", pickle_objects: bool = False) -> Any:
    """``obj`` with every value the checkpoint format cannot store made storable (see the module docstring)."""
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, dict):
        out = {k: to_safe(v, f"{path}/{k}", pickle_objects) for k, v in obj.items()}
        if MARK in out:
            return {MARK: "dict", "value": list(out.items())}
        return out
    if isinstance(obj, list):
        return [to_safe(v, f"{path}/{i}", pickle_objects) for i, v in enumerate(obj)]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(to_safe(v, f"{path}/{i}", pickle_objects) for i, v in enumerate(obj))
    if _is_torch_value(obj) or (hasattr(obj, "state_dict") and callable(obj.state_dict)):
        return obj  # tensors, arrays, dtypes, modules, optimizers: the checkpoint format stores them itself
    if isinstance(obj, argparse.Namespace):
        return {MARK: "namespace", "value": to_safe(vars(obj), path, pickle_objects)}
    if isinstance(obj, pathlib.PurePath):
        return {MARK: "path", "value": str(obj)}
    if isinstance(obj, set | frozenset):
        kind = "set" if isinstance(obj, set) else "frozenset"
        return {MARK: kind, "value": [to_safe(v, f"{path}/$item", pickle_objects) for v in obj]}
    if not pickle_objects:
        raise UnsafeValueError(
            f"{path or '<root>'}: a {type(obj).__qualname__} has no safe representation in a checkpoint; keep "
            "plain values (or a Namespace, a path, a set) there, or pass pickle_objects=True to pickle such "
            "objects (tensors are never pickled; restoring then also needs pickle_objects=True)"
        )
    return {MARK: "pickle", "value": _pickle_no_tensors(obj, path)}


class _NoTensorPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if _is_torch_value(obj) and hasattr(obj, "shape"):
            raise UnsafeValueError(
                f"{self.path or '<root>'}: this {type(obj).__qualname__} holds a tensor or an array: store it as "
                "a tensor (or in a dict), not inside an object that would be pickled"
            )
        return None

    path = ""


def _pickle_no_tensors(obj: Any, path: str) -> bytes:
    buf = io.BytesIO()
    p = _NoTensorPickler(buf, protocol=5)
    p.path = path
    p.dump(obj)
    return buf.getvalue()


def from_safe(obj: Any, pickle_objects: bool = False, path: str = "") -> Any:
    """Undo :func:`to_safe` (a pickled object only with ``pickle_objects=True``)."""
    if isinstance(obj, dict):
        kind = obj.get(MARK) if len(obj) == 2 and "value" in obj else None
        if kind is None:
            return {k: from_safe(v, pickle_objects, f"{path}/{k}") for k, v in obj.items()}
        val = obj["value"]
        if kind == "dict":
            return {k: from_safe(v, pickle_objects, f"{path}/{k}") for k, v in val}
        if kind == "namespace":
            return argparse.Namespace(**from_safe(val, pickle_objects, path))
        if kind == "path":
            return pathlib.Path(val)
        if kind in ("set", "frozenset"):
            items = [from_safe(v, pickle_objects, path) for v in val]
            return set(items) if kind == "set" else frozenset(items)
        if kind == "pickle":
            if not pickle_objects:
                raise UnsafeValueError(
                    f"{path or '<root>'}: this checkpoint holds a pickled object; unpickling it can run code. "
                    "Pass pickle_objects=True only if you trust the store."
                )
            return pickle.loads(val)  # noqa: S301 - asked for with pickle_objects=True
        raise UnsafeValueError(f"{path or '<root>'}: unknown tagged value {kind!r}")
    if isinstance(obj, list):
        return [from_safe(v, pickle_objects, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(from_safe(v, pickle_objects, f"{path}/{i}") for i, v in enumerate(obj))
    return obj
