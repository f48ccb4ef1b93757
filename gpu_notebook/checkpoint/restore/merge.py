"""Loading a restored state into the ``into=`` objects in place, after checking every shape first (all the
mismatches in one :class:`ShapeMismatchError`, and nothing loaded when there is one)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .._errors import ShapeMismatchError

__all__ = ["load_into"]


def _shape_of(v: Any) -> tuple[tuple[int, ...], str] | None:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return tuple(v.shape), str(v.dtype).replace("torch.", "")
    return None


def load_into(target: Any, state: Any, tree: Any, path: str = "") -> None:
    """Load ``state`` into ``target`` in place, checking shapes first (all mismatches in one error)."""
    mismatches: list[tuple[str, object, object]] = []
    _check_shapes(target, state, path, mismatches)
    if mismatches:
        raise ShapeMismatchError(mismatches)
    _apply(target, state)


def _check_shapes(target: Any, state: Any, path: str, out: list[tuple[str, object, object]]) -> None:
    if hasattr(target, "load_state_dict") and hasattr(target, "state_dict"):
        try:
            import torch

            is_module = isinstance(target, torch.nn.Module)
        except ImportError:  # pragma: no cover
            is_module = False
        if not is_module and _check_optimizer(target, state, path, out):
            return
        if is_module and isinstance(state, dict):
            sd = target.state_dict()
            for k in sd.keys() | state.keys():
                name = f"{path}/{k}" if path else k
                if k not in state:
                    out.append((name, "missing", _shape_of(sd[k])))
                elif k not in sd:
                    out.append((name, _shape_of(state[k]), "not in target"))
                else:
                    a, b = _shape_of(state[k]), _shape_of(sd[k])
                    if a is not None and b is not None and a != b:
                        out.append((name, f"{list(a[0])} {a[1]}", f"{list(b[0])} {b[1]}"))
        return
    if isinstance(target, dict):
        if not isinstance(state, dict):
            out.append((path or "<root>", type(state).__name__, "dict"))
            return
        for k, v in target.items():
            if k in state:
                _check_shapes(v, state[k], f"{path}/{k}" if path else str(k), out)
            else:
                out.append((f"{path}/{k}" if path else str(k), "missing", type(v).__name__))
        return
    if isinstance(target, list | tuple) and isinstance(state, list | tuple):
        for i, (t, s) in enumerate(zip(target, state, strict=False)):
            _check_shapes(t, s, f"{path}/{i}", out)
        return
    a, b = _shape_of(state), _shape_of(target)
    if a is not None and b is not None and a != b:
        out.append((path or "<root>", f"{list(a[0])} {a[1]}", f"{list(b[0])} {b[1]}"))


#: per-parameter state of torch's optimizers shaped like its parameter (compared with it when an optimizer has no
#: state yet; others, e.g. Adafactor's factored moments, only with the optimizer's own state)
_PARAM_SHAPED = frozenset(
    ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer", "square_avg", "grad_avg",
     "acc_delta", "sum", "ax", "prev", "step_size")
)  # fmt: skip


def _check_optimizer(target: Any, state: Any, path: str, out: list[tuple[str, object, object]]) -> bool:
    """Check a ``torch.optim.Optimizer`` state dict against the optimizer (True when ``target`` is one): its
    parameter groups (torch refuses others in ``load_state_dict``, but only after the objects before it in
    ``into`` were loaded) and the shapes of its per-parameter state (which torch loads unchecked)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(target, torch.optim.Optimizer):
        return False
    if not isinstance(state, dict) or not isinstance(state.get("param_groups"), list):
        return True  # load_state_dict says what is wrong
    saved, groups = state["param_groups"], target.param_groups
    where = f"{path}/param_groups" if path else "param_groups"
    if len(saved) != len(groups):
        out.append((where, f"{len(saved)} group(s)", f"{len(groups)} group(s)"))
        return True
    params: dict[Any, Any] = {}
    for i, (sg, g) in enumerate(zip(saved, groups, strict=True)):
        ids = list(sg.get("params", [])) if isinstance(sg, dict) else []
        if len(ids) != len(g["params"]):
            out.append((f"{where}/{i}", f"{len(ids)} parameter(s)", f"{len(g['params'])} parameter(s)"))
            continue
        params.update(zip(ids, g["params"], strict=True))
    builtin = type(target).__module__.startswith("torch.optim")
    per_param = state.get("state")
    for pid, st in per_param.items() if isinstance(per_param, dict) else []:
        p = params.get(pid)
        if p is None or not isinstance(st, dict):
            continue
        own = target.state.get(p, {})
        for k, v in st.items():
            a = _shape_of(v)
            if a is None or not a[0]:
                continue  # not a tensor, or a scalar (a step counter)
            b = _shape_of(own.get(k))
            if b is None and builtin and k in _PARAM_SHAPED:
                b = _shape_of(p)
            if b is not None and a[0] != b[0]:
                name = f"{path}/state/{pid}/{k}" if path else f"state/{pid}/{k}"
                out.append((name, f"{list(a[0])} {a[1]}", f"{list(b[0])} {b[1]}"))
    return True


def _apply(target: Any, state: Any) -> None:
    if hasattr(target, "load_state_dict"):
        target.load_state_dict(state)
        return
    if isinstance(target, dict):
        for k, v in target.items():
            if k in state:
                if (
                    _is_tensor(v)
                    or isinstance(v, np.ndarray)
                    or hasattr(v, "load_state_dict")
                    or isinstance(v, dict | list)
                ):
                    _apply(v, state[k])
        return
    if isinstance(target, list):
        for t, s in zip(target, state, strict=False):
            _apply(t, s)
        return
    if _is_tensor(target):
        import torch

        with torch.no_grad():
            target.copy_(state)
        return
    if isinstance(target, np.ndarray):
        target[...] = state


def _is_tensor(v: Any) -> bool:
    return "torch" in sys.modules and isinstance(v, sys.modules["torch"].Tensor)
