"""Loading a restored state into the ``into=`` objects in place, after checking every target first.

Every target is checked before anything is written: its type (a module's state goes into a module, an
optimizer's into an optimizer of the same class, a tensor into a tensor; a plain value is never copied into a
tensor), its keys, shapes and dtypes, and an optimizer's parameter groups. All the mismatches are raised together in
one :class:`ShapeMismatchError` naming each key with what the checkpoint holds and what the target is; nothing is
loaded when there is one.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .._errors import ShapeMismatchError

__all__ = ["load_into"]

Mismatches = list[tuple[str, object, object]]


def _shape_of(v: Any) -> tuple[tuple[int, ...], str] | None:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return tuple(v.shape), str(v.dtype).replace("torch.", "")
    return None


def _shape_text(v: Any) -> str:
    s = _shape_of(v)
    return f"{list(s[0])} {s[1]}" if s else type(v).__name__


def load_into(target: Any, state: Any, tree: Any, path: str = "") -> None:
    """Load ``state`` into ``target`` in place, checking every target first (all mismatches in one error).

    ``tree`` is the checkpoint's JSON tree (see :mod:`..format.tree`): it says which saved values were a
    module's, an optimizer's (and of which class) or another object's state dict.
    """
    mismatches: Mismatches = []
    _check(target, state, tree, path, mismatches)
    if mismatches:
        raise ShapeMismatchError(mismatches)
    _apply(target, state)


# ---------------------------------------------------------------------- what was saved, what the target is
def _saved_kind(node: Any) -> tuple[str, str] | None:
    """(kind, class) of a ``$state`` tree node (an object saved by its state dict), else None."""
    if isinstance(node, dict) and len(node) == 1 and isinstance(node.get("$state"), dict):
        st = node["$state"]
        return str(st.get("kind", "other")), str(st.get("class", "?"))
    return None


def _child(node: Any, key: Any) -> Any:
    """The tree node of ``key`` in the node of a dict, list or tuple (None when the tree does not say)."""
    if isinstance(node, dict) and len(node) == 1:
        ((tag, val),) = node.items()
        if tag == "$state" and isinstance(val, dict):
            return _child(val.get("value"), key)
        if tag == "$dict" and isinstance(val, list):
            for pair in val:
                if isinstance(pair, list) and len(pair) == 2 and pair[0] == key:
                    return pair[1]
            return None
        if tag == "$tuple" and isinstance(val, list):
            return val[key] if isinstance(key, int) and 0 <= key < len(val) else None
        if isinstance(tag, str) and tag.startswith("$"):
            return None
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    return None


def _describe_saved(state: Any, node: Any) -> str:
    kind = _saved_kind(node)
    if kind is not None:
        what = {"module": "a module's", "optimizer": "an optimizer's"}.get(kind[0], "an object's")
        return f"{what} state ({kind[1]})"
    if _is_tensor(state):
        return f"a tensor {_shape_text(state)}"
    if isinstance(state, np.ndarray):
        return f"an array {_shape_text(state)}"
    if isinstance(state, dict):
        return "a dict"
    if isinstance(state, list | tuple):
        return f"a {type(state).__name__} of {len(state)}"
    text = repr(state)
    return f"a plain value ({type(state).__name__} {text if len(text) <= 40 else text[:37] + '...'})"


def _describe_target(target: Any) -> str:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(target, torch.nn.Module):
        return f"a module ({type(target).__qualname__})"
    if torch is not None and isinstance(target, torch.optim.Optimizer):
        return f"an optimizer ({type(target).__qualname__})"
    if _is_tensor(target):
        return f"a tensor {_shape_text(target)}"
    if isinstance(target, np.ndarray):
        return f"an array {_shape_text(target)}"
    if hasattr(target, "load_state_dict"):
        return f"an object with load_state_dict ({type(target).__qualname__})"
    return f"a {type(target).__name__}"


# ---------------------------------------------------------------------- the checks
def _check(target: Any, state: Any, node: Any, path: str, out: Mismatches) -> None:
    name = path or "<root>"
    torch = sys.modules.get("torch")
    kind = _saved_kind(node)
    if hasattr(target, "load_state_dict") and hasattr(target, "state_dict"):
        is_module = torch is not None and isinstance(target, torch.nn.Module)
        is_optim = torch is not None and isinstance(target, torch.optim.Optimizer)
        expected = "module" if is_module else "optimizer" if is_optim else "other"
        if not isinstance(state, dict) or (kind is not None and kind[0] != expected):
            out.append((name, _describe_saved(state, node), _describe_target(target)))
            return
        if is_optim:
            if kind is not None and kind[1] != type(target).__qualname__:
                out.append((name, _describe_saved(state, node), _describe_target(target)))
                return
            _check_optimizer(target, state, path, out)
        elif is_module:
            _check_module(target, state, path, out)
        return
    if isinstance(target, dict):
        if not isinstance(state, dict) or kind is not None:
            out.append((name, _describe_saved(state, node), "a dict"))
            return
        for k, v in target.items():
            sub = f"{path}/{k}" if path else str(k)
            if k in state:
                _check(v, state[k], _child(node, k), sub, out)
            else:
                out.append((sub, "nothing (no such key)", _describe_target(v)))
        return
    if isinstance(target, list | tuple):
        if not isinstance(state, list | tuple) or len(state) != len(target):
            out.append((name, _describe_saved(state, node), f"a {type(target).__name__} of {len(target)}"))
            return
        for i, (t, s) in enumerate(zip(target, state, strict=True)):
            _check(t, s, _child(node, i), f"{path}/{i}", out)
        return
    if _is_tensor(target) or isinstance(target, np.ndarray):
        same_type = _is_tensor(state) if _is_tensor(target) else isinstance(state, np.ndarray)
        if not same_type:
            out.append((name, _describe_saved(state, node), _describe_target(target)))
            return
        if _shape_of(state) != _shape_of(target):
            out.append((name, _shape_text(state), _shape_text(target)))
    # any other target (a plain value) cannot be loaded in place: it is left as it is (the returned state has it)


def _check_module(target: Any, state: dict[Any, Any], path: str, out: Mismatches) -> None:
    sd = target.state_dict()
    for k in sd.keys() | state.keys():
        name = f"{path}/{k}" if path else str(k)
        if k not in state:
            out.append((name, "missing", _shape_text(sd[k])))
        elif k not in sd:
            out.append((name, _shape_text(state[k]), "not in target"))
        else:
            a, b = _shape_of(state[k]), _shape_of(sd[k])
            if a is not None and b is not None and a != b:
                out.append((name, f"{list(a[0])} {a[1]}", f"{list(b[0])} {b[1]}"))
            elif (a is None) != (b is None):
                out.append((name, _describe_saved(state[k], None), _describe_target(sd[k])))


#: per-parameter state of torch's optimizers shaped like its parameter (compared with it when an optimizer has no
#: state yet; others, e.g. Adafactor's factored moments, only with the optimizer's own state)
_PARAM_SHAPED = frozenset(
    ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer", "square_avg", "grad_avg",
     "acc_delta", "sum", "ax", "prev", "step_size")
)  # fmt: skip


def _check_optimizer(target: Any, state: dict[Any, Any], path: str, out: Mismatches) -> None:
    """Check a ``torch.optim.Optimizer`` state dict against the optimizer: its parameter groups (torch refuses
    others in ``load_state_dict``, but only after the objects before it in ``into`` were loaded) and the shapes of
    its per-parameter state (which torch loads unchecked)."""
    saved, groups = state.get("param_groups"), target.param_groups
    where = f"{path}/param_groups" if path else "param_groups"
    if not isinstance(saved, list) or not isinstance(state.get("state"), dict):
        out.append((path or "<root>", "a dict without an optimizer's 'state' and 'param_groups'",
                    _describe_target(target)))  # fmt: skip
        return
    if len(saved) != len(groups):
        out.append((where, f"{len(saved)} group(s)", f"{len(groups)} group(s)"))
        return
    params: dict[Any, Any] = {}
    for i, (sg, g) in enumerate(zip(saved, groups, strict=True)):
        ids = list(sg.get("params", [])) if isinstance(sg, dict) else []
        if len(ids) != len(g["params"]):
            out.append((f"{where}/{i}", f"{len(ids)} parameter(s)", f"{len(g['params'])} parameter(s)"))
            continue
        params.update(zip(ids, g["params"], strict=True))
    builtin = type(target).__module__.startswith("torch.optim")
    for pid, st in state["state"].items():
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


# ---------------------------------------------------------------------- loading (after the checks)
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
