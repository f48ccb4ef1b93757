"""Helpers shared by the magics: argument parsing, how failures are shown, the current cluster, progress lines.

A failing magic fails its cell, so "Run All", nbclient and papermill stop there, and it is shown in one short
message, never with our internals' traceback. There are three kinds: a usage mistake raises IPython's own
:class:`~IPython.core.error.UsageError` (IPython prints ``UsageError: <message>`` and no traceback; the message
ends with the usage and where the help is); one of our errors (:class:`~gpu_notebook.errors.GpuNotebookError`)
propagates with a ``_render_traceback_`` that IPython calls instead of formatting the traceback
(``ClusterError: <message>``); an optional dependency that is not installed becomes :class:`MissingExtra`, one of
ours (``...: pip install 'gpu_notebook[EXTRA]'``). Anything else is a bug and keeps its traceback; an error with
its own notebook display (the per-rank report of a failed ``%%distributed`` cell) keeps that. :class:`reported`
does this around a magic's body.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

from gpu_notebook._display import Progress, stage_printer
from gpu_notebook.errors import GpuNotebookError
from gpu_notebook.magics._args import split

F = TypeVar("F", bound=Callable[..., Any])

#: the top-level module an ImportError names -> the extra of gpu_notebook that installs it
EXTRAS = {
    "ray": "ray",
    "torch": "torch",
    "boto3": "aws",
    "botocore": "aws",
    "zstandard": "checkpoint",
    "blake3": "checkpoint",
    "pynvml": "monitor",
    "prometheus_client": "monitor",
    "ipywidgets": "widgets",
    "plotly": "widgets",
    "anywidget": "widgets",
    "googleapiclient": "gcp",
    "azure": "azure",
    "kubernetes": "kubernetes",
}


class BadArguments(UsageError):
    """Never raised: :func:`parse` raises a plain :class:`UsageError` (IPython shows only that exact class
    without a traceback). Kept so that ``except BadArguments`` in a magic still imports."""


class MagicError(GpuNotebookError):
    """A failure a magic found itself (no such cluster, a name not defined in the notebook)."""


class MissingExtra(MagicError, ImportError):
    """An optional dependency is not installed; the message says which extra of gpu_notebook installs it."""


def parse(magic_func: Callable[..., Any], line: str) -> argparse.Namespace:
    """Parse a magic's arguments: the line is split as a shell splits it (quotes removed, see
    :func:`~gpu_notebook.magics._args.split`), each option's value checked by its type (see
    :mod:`~gpu_notebook.magics._args`). A mistake raises a :class:`UsageError` that names the option and the value
    and ends with the usage of the subcommand typed."""
    try:
        argv = split(line)
    except UsageError as exc:
        raise usage_error(magic_func, str(exc)) from None
    try:
        args: argparse.Namespace = magic_func.parser.parse_args(argv)  # type: ignore[attr-defined]  # set by @magic_arguments
        return args
    except (UsageError, SystemExit) as exc:
        msg = _option_named(str(exc)) if isinstance(exc, UsageError) else "bad arguments"
        raise usage_error(magic_func, msg, _typed_command(magic_func, argv)) from None


_ARGUMENT_RE = re.compile(r"^argument ([^:]+): ")


def _option_named(msg: str) -> str:
    """argparse's ``argument --workers/-n: ...`` as ``--workers: ...`` (the option as the usage spells it)."""
    m = _ARGUMENT_RE.match(msg)
    if m is None:
        return msg
    flag = _long_flag(m.group(1).split("/"))
    rest = msg[m.end() :]
    if flag in ("command", "args"):
        return rest
    return f"{flag}: {rest}"


def _typed_command(magic_func: Callable[..., Any], argv: list[str]) -> str | None:
    """The subcommand the user typed (the first word that is one), or None."""
    table = getattr(magic_func, "subcommand_options", None) or {}
    return next((a for a in argv if not a.startswith("-") and a in table), None)


def subcommands(
    table: Mapping[str, Sequence[Option]], positionals: Mapping[str, str] | None = None
) -> Callable[[F], F]:
    """Declare which options each subcommand of a magic takes, so a usage error shows only the usage of the
    subcommand typed (``positionals``: what follows the subcommand, e.g. ``{"scale": "N"}``)."""

    def mark(func: F) -> F:
        func.subcommand_options = dict(table)  # type: ignore[attr-defined]
        func.subcommand_positionals = dict(positionals or {})  # type: ignore[attr-defined]
        return func

    return mark


def _usage_of(magic_func: Callable[..., Any], command: str | None) -> str:
    parser = magic_func.parser  # type: ignore[attr-defined]  # set by @magic_arguments
    table = getattr(magic_func, "subcommand_options", None) or {}
    if command is None or command not in table:
        if table:
            return f"usage: %{parser.prog} COMMAND [options]; COMMAND is one of {', '.join(table)}\n"
        # IPython's help formatter writes "::" and "%name" (a cell magic's name with one %)
        usage = str(parser.format_usage()).strip().removeprefix("::").strip()
        usage = usage.replace(f"%{parser.prog}", help_name(magic_func), 1)
        return f"usage: {usage}\n"
    words = [f"%{parser.prog}", command]
    pos = magic_func.subcommand_positionals.get(command)  # type: ignore[attr-defined]
    if pos:
        words.append(pos)
    words += [f"[{o.usage}]" for o in table[command]]
    return "usage: " + " ".join(words) + "\n"


def usage_error(magic_func: Callable[..., Any], msg: str, command: str | None = None) -> UsageError:
    """A :class:`UsageError` (that exact class: IPython prints its subclasses with a traceback) whose message is
    ``msg``, the usage of the magic's subcommand ``command`` (of the whole magic without one) and where its help
    is."""
    exc = UsageError(f"{msg}\n\n{_usage_of(magic_func, command)}Try {help_name(magic_func)}? for help.")
    exc.with_usage = True  # type: ignore[attr-defined]  # reported() leaves it as it is
    return exc


def print_usage(magic_func: Callable[..., Any], msg: str) -> None:
    """``UsageError: msg``, the magic's usage line and where its help is, on stderr (as IPython shows it)."""
    print(f"UsageError: {usage_error(magic_func, msg)}", file=sys.stderr)


def shown_short(exc: BaseException, msg: str | None = None) -> BaseException:
    """``exc`` with a ``_render_traceback_`` that IPython calls instead of formatting its traceback: one line,
    ``ClusterError: <message>`` (never our internals' frames). Returns ``exc``, to be raised."""
    text = str(exc) if msg is None else msg
    lines = [f"{type(exc).__name__}: {text}"]
    exc._render_traceback_ = lambda: list(lines)  # type: ignore[attr-defined]
    return exc


def help_name(magic_func: Callable[..., Any]) -> str:
    """How to ask for a magic's help: ``%gpu_push`` for a line magic, ``%%distributed`` for a cell magic
    (``%distributed?`` finds nothing)."""
    name = magic_func.parser.prog  # type: ignore[attr-defined]  # set by @magic_arguments
    owner = getattr(magic_func, "__self__", None)
    cell_magics = getattr(owner, "magics", {}).get("cell", {})
    return (
        f"%%{name}"
        if name in cell_magics and name not in getattr(owner, "magics", {}).get("line", {})
        else f"%{name}"
    )


def missing_extra(exc: ImportError) -> str | None:
    """The message for an optional dependency that is not installed; ``None`` when ``exc`` is not one (a bug).

    An ImportError without a module name is one the library raised on purpose; its message says what to install.
    """
    if exc.name is None:
        return str(exc)
    extra = EXTRAS.get(exc.name.partition(".")[0])
    if extra is None:
        return None
    msg = str(exc)
    return msg if "pip install" in msg else f"{msg}: pip install 'gpu_notebook[{extra}]'"


class reported:
    """Around a magic's body: our failures fail the cell with one short message (see the module docstring);
    bugs keep their traceback.

    Used as ``with reported(self.gpu_cost): return self._cmd_show(args)``.

    Parameters
    ----------
    magic_func
        The magic, for its usage line.
    strip_quotes
        Show a ``KeyError`` of ours by its message (its ``str()`` is the message quoted); other messages are
        shown as they are, quotes included (``bad rank selection 'abc'``).
    command
        The subcommand being run: a usage error shows its usage.
    """

    def __init__(
        self, magic_func: Callable[..., Any], strip_quotes: bool = False, command: str | None = None
    ) -> None:
        self.magic_func = magic_func
        self.strip_quotes = strip_quotes
        self.command = command

    def __enter__(self) -> reported:
        return self

    def __exit__(
        self, etype: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is None:
            return False
        if isinstance(exc, UsageError):
            if type(exc) is UsageError and getattr(exc, "with_usage", False):
                return False
            raise usage_error(self.magic_func, str(exc), self.command) from None
        if hasattr(exc, "_render_traceback_"):
            return False  # an error with its own display (DistributedError's per-rank report) keeps it
        if isinstance(exc, GpuNotebookError):
            quoted = self.strip_quotes and isinstance(exc, KeyError) and len(exc.args) == 1
            shown_short(exc, str(exc.args[0]) if quoted else str(exc))
            return False
        if isinstance(exc, ImportError):
            missing = missing_extra(exc)
            if missing is not None:
                raise shown_short(MissingExtra(missing)) from None
        return False


@contextmanager
def usage_errors(*types: type[Exception]) -> Iterator[None]:
    """Inside, one of ``types`` (not one of ours) means a value the user typed is wrong: a UsageError.

    For the one library call whose documented ``ValueError`` is about its arguments (``Cluster(workers=0)``).
    """
    try:
        yield
    except GpuNotebookError:
        raise
    except types as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class Option:
    """One magic option: what ``@argument`` takes, kept so the magic knows each option's default and name."""

    flags: tuple[str, ...]  # "--workers", "-n"
    kwargs: dict[str, Any] = field(default_factory=dict)  # argparse's keywords (type, default, help, ...)

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments."""
        return str(self.kwargs.get("dest") or self.flag.lstrip("-").replace("-", "_"))

    @property
    def flag(self) -> str:
        """The long form, as the usage says it (the first one: ``--ranks`` of ``--ranks``/``--targets``)."""
        return _long_flag(self.flags)

    @property
    def usage(self) -> str:
        """How the usage line shows it: ``--workers WORKERS``, ``--spot``, ``--backend {auto,gloo,nccl}``."""
        if self.kwargs.get("action") in ("store_true", "store_false"):
            return self.flag
        if "choices" in self.kwargs:
            value = "{" + ",".join(str(c) for c in self.kwargs["choices"]) + "}"
        else:
            value = str(self.kwargs.get("metavar") or self.dest.upper())
        if self.kwargs.get("nargs") == "+":
            value = f"{value} [{value} ...]"
        return f"{self.flag} {value}"

    @property
    def default(self) -> Any:
        """The value when the option is not given."""
        if "default" in self.kwargs:
            return self.kwargs["default"]
        return False if self.kwargs.get("action") == "store_true" else None


def _long_flag(flags: Sequence[str]) -> str:
    """The first long flag (``--out`` of ``-o``, ``--out``): argparse names an option by it too."""
    return next((f for f in flags if f.startswith("--")), max(flags, key=len))


class _Refused(argparse.Action):
    """An option given where it means something else: a usage error with ``message``, whatever its value."""

    def __init__(self, option_strings: Sequence[str], dest: str, message: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.message = message

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        raise UsageError(self.message)


def refused(*flags: str, message: str) -> Option:
    """An option a magic does not take because the name means something else in another magic, refused with
    ``message`` (which names the option to use) when given, with or without a value; hidden from the help.

    ``--workers`` counts workers in ``%gpu_cluster start``; on a magic that selects ranks it would read as a
    count, so it is refused there rather than taken as ``--ranks``.
    """
    return Option(
        tuple(flags), {"action": _Refused, "nargs": "?", "help": argparse.SUPPRESS, "message": message}
    )


def option(*flags: str, **kwargs: Any) -> Option:
    """An :class:`Option`: ``option("--workers", "-n", type=int, help=...)``, as ``@argument`` is called."""
    return Option(tuple(flags), dict(kwargs))


def options(*opts: Option) -> Callable[[F], F]:
    """A decorator that adds a group of options to a magic (in this order in its help), as ``@argument`` each."""

    def add(func: F) -> F:
        for opt in reversed(opts):  # @argument decorators apply bottom-up and are listed top-down
            func = argument(*opt.flags, **opt.kwargs)(func)
        return func

    return add


def refuse_others(args: argparse.Namespace, table: Mapping[str, Sequence[Option]], command: str) -> None:
    """A usage error for the first option given that ``command`` does not take (per ``table``): an option
    is never silently ignored (``stop --budget 5`` must not look as if it did something)."""
    mine = {o.dest for o in table[command]}
    for opts in table.values():
        for o in opts:
            if o.dest not in mine and getattr(args, o.dest, o.default) != o.default:
                raise UsageError(f"{o.flag} does not apply to {command}")


def progress_printer() -> Progress:
    """A progress callback that prints each stage with the elapsed time (the shared stage printer)."""
    return stage_printer()


def error(msg: str) -> None:
    """``Error: msg`` on stderr: for a note that does not fail the cell (a failure raises instead)."""
    print(f"Error: {msg}", file=sys.stderr)


def show(obj: Any) -> None:
    """Display a result object: its HTML in notebooks, its full text table in terminals and saved text."""
    from IPython.display import display

    text_fn = getattr(obj, "text", None)
    text = text_fn() if callable(text_fn) else str(obj)
    bundle = {"text/plain": text}
    html_fn = getattr(obj, "_repr_html_", None)
    if callable(html_fn):
        html = html_fn()
        if html:
            bundle["text/html"] = html
    display(bundle, raw=True)


__all__ = [
    "EXTRAS",
    "BadArguments",
    "MagicError",
    "MissingExtra",
    "Option",
    "error",
    "help_name",
    "missing_extra",
    "option",
    "options",
    "parse",
    "print_usage",
    "progress_printer",
    "refuse_others",
    "refused",
    "reported",
    "show",
    "shown_short",
    "subcommands",
    "usage_error",
    "usage_errors",
]
