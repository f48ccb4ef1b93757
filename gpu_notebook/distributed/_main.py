"""A rank's ``__main__`` module, and how cell-defined classes and functions reach the rank's child processes.

Cells run in a real module registered as ``sys.modules["__main__"]`` (as IPython does for the notebook), so
pickle finds a cell-defined class by reference: ``torch.save(model)`` and ``torch.load`` work in the rank. The
module has no ``__file__`` and no ``__spec__``: a child started with spawn or forkserver then skips
re-importing ``__main__`` (``multiprocessing.spawn.get_preparation_data`` only re-imports a main module that
has one of them), instead of re-running Ray's worker script.

Such a child still has no cell-defined classes or functions of its own, so the rank sends them *by value*, as
cloudpickle does: :func:`install_by_value` gives multiprocessing's ``ForkingPickler`` (which
``torch.multiprocessing``, DataLoader workers and ``concurrent.futures`` also use) a ``reducer_override``
that pickles every class and function whose ``__module__`` is ``"__main__"`` with cloudpickle. The other
choice, making the cells' source importable in children, would re-run every cell's top-level code (data
loading, training) in each DataLoader worker. The child rebuilds the objects with :func:`loads_by_value`, and
its own pickles of them (a worker's batches of cell-defined objects) go back by value too, which cloudpickle
maps back to the rank's original classes. A forked child pickles them by reference instead: its parent (the
rank) has them in its ``__main__``.

The cloudpickle used is Ray's copy, loaded from its file on its own: ``import ray`` costs a spawned child
about 2 s on a small machine, loading the one file about 40 ms.
"""

from __future__ import annotations

import builtins
import importlib.util
import os
import pickle
import sys
import types
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["DEFAULT_ARGV", "Exit", "install_by_value", "loads_by_value", "new_main_module"]

DEFAULT_ARGV = ["<cell>"]  # sys.argv on a rank, as ["-c"] for `python -c`; cells may set their own

_CLOUDPICKLE_NAME = "_gpu_notebook_cloudpickle"  # the name Ray's cloudpickle file is loaded under


class Exit:
    """``exit()`` and ``quit()`` on a rank: end the cell (``SystemExit``), as they end a script.

    site's versions may be missing in a Ray worker, and they close ``sys.stdin`` first.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() or {self.name}(code) to end this rank's cell"

    def __call__(self, code: object = None) -> None:
        raise SystemExit(code)


def new_main_module() -> types.ModuleType:
    """A fresh ``__main__`` for a rank's cells, registered in ``sys.modules``; ``sys.argv`` set to a cell's."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, exit=Exit("exit"), quit=Exit("quit"))
    sys.modules["__main__"] = main
    sys.argv = list(DEFAULT_ARGV)
    return main


# ---- by-value pickling for child processes -----------------------------------------------------------------
_CP: Any = None
_ACTIVE = False  # pickling __main__ objects by value in this process (off in forked children)


def _cloudpickle() -> Any:
    """Ray's cloudpickle, loaded from its file without importing ray (see the module docstring)."""
    global _CP
    if _CP is None:
        mod = sys.modules.get(_CLOUDPICKLE_NAME)
        if mod is None:
            spec = importlib.util.find_spec("ray")
            if spec is None or spec.origin is None:
                raise ImportError(
                    "ray is not installed: cell-defined objects cannot be sent to child processes"
                )
            path = os.path.join(os.path.dirname(spec.origin), "cloudpickle", "cloudpickle.py")
            with open(path, encoding="utf-8") as f:
                source = f.read()
            mod = types.ModuleType(_CLOUDPICKLE_NAME)
            mod.__file__ = path
            sys.modules[_CLOUDPICKLE_NAME] = mod  # its functions are found under this name when unpickled
            exec(compile(source, path, "exec"), mod.__dict__)
        _CP = mod
    return _CP


def loads_by_value(payload: bytes) -> Any:
    """Rebuild a class or function pickled by value (in a child process); its own pickles go by value too."""
    _cloudpickle()
    install_by_value()
    return pickle.loads(payload)


def _reduce_main(self: Any, obj: Any) -> Any:
    """``ForkingPickler.reducer_override``: classes and functions of ``__main__`` by value, the rest as usual."""
    if (
        _ACTIVE
        and isinstance(obj, (type, types.FunctionType))
        and getattr(obj, "__module__", None) == "__main__"
    ):
        return loads_by_value, (_cloudpickle().dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),)
    return NotImplemented


def _off_in_forked_child() -> None:
    global _ACTIVE
    _ACTIVE = False


_installed = False


def install_by_value() -> None:
    """Pickle ``__main__``'s classes and functions by value in multiprocessing's pickler (idempotent)."""
    global _ACTIVE, _installed
    _ACTIVE = True
    if _installed:
        return
    ForkingPickler.reducer_override = _reduce_main  # type: ignore[method-assign]
    os.register_at_fork(after_in_child=_off_in_forked_child)
    _installed = True
