"""What a rank sends back to the notebook: a cell's value made safe to send (and the check of what it pushes).

Torch tensors are moved to the CPU (the notebook may have no GPU), values that cannot be pickled become
:class:`Unpicklable`, and values over a size limit become :class:`TooLarge` (so ``model.state_dict()`` as a
cell's last line does not copy every rank's weights into the kernel). Split from :mod:`._worker`, which runs
them at the end of each cell.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from gpu_notebook._display import fmt_bytes

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "TooLarge", "Unpicklable", "check_pushable", "sendable", "to_cpu"]

DEFAULT_MAX_RESULT_BYTES = 64 * 2**20  # the largest value (pickled) a cell or call sends back by default


def check_pushable(values: dict[str, Any]) -> None:
    """Raise a TypeError naming the first of ``values`` (name -> value, for the ranks) that cannot be pickled."""
    from ray import cloudpickle

    for name, value in values.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling runs the value's own code: anything it raises
            raise TypeError(
                f"cannot send variable {name!r} to the workers: it cannot be pickled ({exc})"
            ) from None


class Unpicklable:
    """Stands in for a value that could not be sent back to the notebook: keeps its type name and repr."""

    def __init__(self, type_name: str, text: str, reason: str) -> None:
        self.type_name, self.text, self.reason = type_name, text, reason

    def __repr__(self) -> str:
        # labelled: shown as the value's own repr, it would read as if the value had come back
        return f"<{self.type_name} not sent (it cannot be pickled: {self.reason}): {self.text}>"


class TooLarge:
    """Stands in for a value too large to send back with a cell: says what it was and how to fetch it."""

    def __init__(
        self,
        type_name: str,
        nbytes: int,
        limit: int,
        length: int | None = None,
        rank: int | None = None,
        measured: str = "pickled",
    ) -> None:
        self.type_name, self.nbytes, self.limit, self.length = type_name, nbytes, limit, length
        self.rank, self.measured = rank, measured

    def __repr__(self) -> str:
        what = self.type_name if self.length is None else f"{self.type_name} of {self.length} entries"
        rank = "R" if self.rank is None else str(self.rank)
        return (
            f"<{what} not sent: {fmt_bytes(self.nbytes, binary=True)} {self.measured}, over the "
            f"{fmt_bytes(self.limit, binary=True)} limit for values sent back. Assign it to a variable and fetch one "
            f"copy with `%gpu_pull NAME --rank {rank}`, or save it from the workers; raise the limit with "
            f"`%%distributed --max-result 1G` (or max_result_bytes=)>"
        )


_MAX_DEPTH = 8  # how deep _sendable looks into lists, tuples and dicts for tensors
_MAX_ITEMS = 100_000  # ... and in how long ones (a long list of numbers holds no tensors worth the walk)


def _walkable(value: Any, depth: int) -> bool:
    return depth < _MAX_DEPTH and isinstance(value, (list, tuple, dict)) and len(value) <= _MAX_ITEMS


def _tensors(value: Any, torch: Any, depth: int = 0) -> Any:
    """Every torch tensor in ``value`` and in the lists, tuples and dicts it holds."""
    if isinstance(value, torch.Tensor):
        yield value
    elif _walkable(value, depth):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _tensors(v, torch, depth + 1)


def _tensor_bytes(t: Any) -> int:
    try:  # pickling a tensor writes its whole storage (a view of a large tensor too)
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001 - tensor subclasses without a storage: count the elements
        return int(t.nelement() * t.element_size())


def _to_cpu(value: Any, torch: Any, depth: int = 0) -> Any:
    """``value`` with every tensor not on the CPU replaced by a CPU copy; containers copied only if needed.

    Keeps container types (an OrderedDict state_dict keeps its ``_metadata``, a namedtuple stays one).
    """
    if isinstance(value, torch.Tensor):
        if value.device.type in ("cpu", "meta"):
            return value
        out = value.detach().cpu()
        if isinstance(value, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=value.requires_grad)
        return out.requires_grad_(True) if value.requires_grad else out
    if not _walkable(value, depth):
        return value
    if isinstance(value, (list, tuple)):
        items = [_to_cpu(v, torch, depth + 1) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        if type(value) is list:
            return items
        if type(value) is tuple:
            return tuple(items)
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        if isinstance(value, list):
            new_list = copy.copy(value)
            new_list[:] = items
            return new_list
        return value
    if isinstance(value, dict):
        changed = {k: c for k, v in value.items() if (c := _to_cpu(v, torch, depth + 1)) is not v}
        if not changed:
            return value
        new = copy.copy(value)  # the same type, attributes (state_dict's _metadata) and default_factory
        new.update(changed)
        return new
    return value


def _sendable(value: Any, max_bytes: int | None = DEFAULT_MAX_RESULT_BYTES, rank: int | None = None) -> Any:
    """What to send back for a cell's value.

    Tensors move to the CPU (in lists, tuples and dicts too, e.g. a state_dict); a value that cannot be
    pickled becomes an :class:`Unpicklable` with its repr, one whose pickle is over ``max_bytes`` a
    :class:`TooLarge` (tensors over the limit are not even copied to the CPU).
    """
    if value is None:
        return None
    torch = sys.modules.get("torch")  # without torch imported there are no tensors to look for
    if torch is not None and isinstance(getattr(torch, "Tensor", None), type):
        if max_bytes is not None:
            total = sum(_tensor_bytes(t) for t in _tensors(value, torch))
            if total > max_bytes:
                return TooLarge(type(value).__name__, total, max_bytes, _length(value), rank, "of tensors")
        try:
            value = _to_cpu(value, torch)
        except Exception:  # noqa: BLE001 - pickling below decides
            pass
    try:
        import ray.cloudpickle as cp

        size = len(cp.dumps(value))
    except Exception as exc:  # noqa: BLE001 - pickling runs the value's own code: anything it raises
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - so does repr
            text = f"<{type(value).__name__} object>"
        return Unpicklable(type(value).__name__, text, str(exc))
    if max_bytes is not None and size > max_bytes:
        return TooLarge(type(value).__name__, size, max_bytes, _length(value), rank)
    return value


def _length(value: Any) -> int | None:
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return len(value)
    return None


sendable = _sendable
to_cpu = _to_cpu
