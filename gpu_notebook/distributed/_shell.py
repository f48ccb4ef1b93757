"""IPython syntax in a rank's cells: ``!cmd``, ``x = !cmd``, ``%magic``, ``%%time`` and ``display()``.

A rank does not run its cells through IPython's ``InteractiveShell.run_cell``: the rank's own exec returns the
last expression's value to the notebook, reports errors as data the driver groups across ranks, treats
``sys.exit(0)`` as the end of a script and stops at an interrupt, where ``run_cell`` prints values and
tracebacks itself and shows ``SystemExit`` as an error. What IPython adds that a user sees is its syntax, so a
cell that uses it is first turned into plain Python by a headless shell's ``transform_cell`` (``!ls`` becomes
``get_ipython().system('ls')``), then run by the same exec. The shell is created on the first such cell (or the
first ``display()``, or a cell that names ``display`` or ``IPython``) in each worker, sharing the rank's
``__main__`` module; other cells never import IPython. Its display publisher sends each display to the cell as a
mime bundle (see :mod:`._rich`).

Importing IPython and creating the shell cost once per worker, and a cell through ``transform_cell`` costs
more than through our exec alone, so only the cells that need the shell pay for it (``benchmarks/rank_shell.py``
measures each; the figures are in docs/benchmarks.md, "Rank shell"). The check that decides whether a cell
needs the shell is one regular-expression search.
"""

from __future__ import annotations

import builtins
import re
import types
from typing import Any

from gpu_notebook.distributed import _rich

__all__ = ["RankShell", "uses_ipython_syntax"]

# A line that starts with ! or % (after indentation), or assigns one: `files = !ls`, `t = %timeit -o f()`.
_SYNTAX = re.compile(r"^[ \t]*(?:[!%]|[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[ \t]*[!%])", re.MULTILINE)


# A cell that may display rich output through IPython (IPython.display, display(), a _repr_html_ object)
_DISPLAYS = re.compile(r"\bdisplay\b|\bIPython\b")


def uses_ipython_syntax(code: str) -> bool:
    """Whether ``code`` has a line that only IPython can run.

    Examples
    --------
    >>> [uses_ipython_syntax(c) for c in ("!nvidia-smi", "  %time f()", "files = !ls", "a != b", "x = 5 % 2")]
    [True, True, True, False, False]
    """
    return _SYNTAX.search(code) is not None


class RankShell:
    """The headless IPython shell of one rank, created when a cell first needs it."""

    def __init__(self, main: types.ModuleType) -> None:
        self.main = main
        self._shell: Any = None
        if not hasattr(builtins, "display"):  # as in a notebook, display() needs no import
            builtins.display = self._display  # type: ignore[attr-defined]

    def transform(self, code: str) -> str:
        """``code`` as plain Python: unchanged unless it uses IPython syntax; line numbers kept."""
        if not uses_ipython_syntax(code):
            if self._shell is None and _DISPLAYS.search(code):  # IPython.display's display() needs the shell
                try:
                    self.shell()
                except ImportError:  # no IPython on this worker: the cell cannot import it either
                    pass
            return code
        lines = code.splitlines()
        lead = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
        # IPython drops leading blank lines; put them back so tracebacks point at the notebook's lines
        return "\n" * lead + str(self.shell().transform_cell(code)).lstrip("\n")

    def shell(self) -> Any:
        """The shell (created on first use, with its history in memory and the rank's ``__main__``)."""
        if self._shell is None:
            try:
                from IPython.core.interactiveshell import InteractiveShell
                from traitlets.config import Config
            except ImportError as exc:
                raise ImportError(
                    f"this cell uses IPython syntax (!cmd, %magic or display()), and IPython cannot be imported "
                    f"on this worker: {exc}. Install ipython on the workers (e.g. %gpu_cluster start --pip ipython)"
                ) from None
            config = Config()
            config.HistoryManager.hist_file = ":memory:"  # not the notebook's history file, from every rank
            ns = self.main.__dict__
            exits: dict[str, Any] = {name: ns[name] for name in ("exit", "quit") if name in ns}
            self._shell = InteractiveShell.instance(config=config, user_module=self.main)
            self._shell.display_pub = _rich.rank_publisher(self._shell)  # display() goes to the cell
            ns.update(exits)  # IPython's exit() only asks a terminal to quit; ours ends the cell
        return self._shell

    def _display(self, *objs: Any, **kwargs: Any) -> Any:
        """``display()`` before the shell exists: create it (which installs IPython's own), then call that."""
        self.shell()
        from IPython.display import display

        return display(*objs, **kwargs)
