"""One lazy-import helper for package ``__init__`` modules.

A package lists which of its public names live in which private module; the helper returns a module-level
``__getattr__`` that imports that module on first access (so ``import gpu_notebook.monitor`` stays cheap: no
ray, torch, boto3 or NVML) and a ``__dir__`` that lists ``__all__`` (so tab completion shows the lazy names).

Example, in ``gpu_notebook/monitor/__init__.py``::

    __getattr__, __dir__ = lazy_module(__name__, __all__, {"Monitor": "._monitor"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_module"]


def lazy_module(
    package: str, public: Iterable[str], lazy: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for a package whose names in ``lazy`` load on first use.

    Parameters
    ----------
    package:
        The package's ``__name__``.
    public:
        Its ``__all__``: what ``dir()`` lists.
    lazy:
        Public name -> module that defines it, absolute or relative to ``package`` (``"._monitor"``).
    """
    names = sorted(set(public))
    table = dict(lazy)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
