"""Every error message a user can meet, collected from the code: what docs/guide/troubleshooting.md must cover.

Walks ``gpu_notebook/`` with :mod:`ast` (nothing is imported, so it runs without Ray or torch) and finds each
place where one of our error classes, IPython's ``UsageError`` or a builtin error (``ValueError``, ``TypeError``,
...: :data:`EXTRA_CLASSES`) is built with a message written in the code:

- our error classes are ``GpuNotebookError`` and every class that derives from it, directly or through another
  of ours, in any module (found from the class definitions, so a new ``FooError(ClusterError)`` is included);
- a message is the first argument of the call: a string literal, an f-string, or ``+`` of those; a call that is
  raised as it is (``raise self._fail(f"...")``, a helper that builds the error) counts too;
- its **key** is what the troubleshooting page must contain: the literal text up to the first ``{...}`` of an
  f-string (its stable prefix), cut to at most :data:`KEY_CHARS` characters at a word boundary. An f-string
  that starts with a value (``f"unknown {cloud} instance type {name}"``) is keyed by its longest literal part
  instead, and the page must show its literal parts up to that one in order on one line (``unknown … instance
  type …``), so a common phrase elsewhere on the page does not count. A key shorter than :data:`MIN_KEY`
  characters says too little to look up and is not required.

Run it to see what the page misses: ``.venv/bin/python scripts/error_messages.py --missing``; ``--all`` lists
every message with where it is raised. ``tests/test_docs_troubleshooting.py`` fails when a key is missing from
the page, naming the key and where it is raised.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpu_notebook"
PAGE = ROOT / "docs" / "guide" / "troubleshooting.md"

#: the root of our errors; every class deriving from it (in any module) is one of ours
ROOT_ERROR = "GpuNotebookError"
#: IPython's usage error (what a wrong argument to a magic raises), and the builtin errors our code raises with a
#: message of its own: a wrong argument of the Python API, and what a magic passes on as a ``MagicError`` with the
#: same message (``%gpu_pull`` of a value the notebook cannot rebuild)
_BUILTIN = "ValueError TypeError RuntimeError KeyError LookupError TimeoutError OSError ImportError NameError"
EXTRA_CLASSES = frozenset({"UsageError", "IndexError", "AttributeError", *_BUILTIN.split()})
#: a key is cut to this many characters (at a word boundary): the start of a message is what a user searches for
KEY_CHARS = 90
#: a shorter key (``f"{exc}: {detail}"``) names nothing a user could search for
MIN_KEY = 12
#: fakes for tests: a user of the notebook never meets their errors
SKIP_DIRS = frozenset({"testing"})

_CODEC = "a chunk frame that does not decode: restore reports it as IntegrityError 'malformed frame: ...'"
_RING = "the samplers' ring buffer checks the rows the sampler itself makes"
#: messages the page need not cover, each with the reason (internal invariants a user cannot cause)
EXCLUDED: dict[str, str] = {
    "not a kernel id:": "the panel's feed folder guards its paths (_feed.kernel_dir): kernel ids come from Jupyter, "
    "the server extension's routes accept only their characters, and a caller's lookup of another id answers 404",
    "not a bundle": "raised and caught in the same function (distributed/_rich.py): a cut display becomes a line",
    "frame is truncated": _CODEC,
    "plane claims": _CODEC,
    "plane does not decompress:": _CODEC,
    "plane has the wrong length": _CODEC,
    "unknown plane kind": _CODEC,
    "not a chunk frame (bad magic)": _CODEC,
    "chunk frame version": _CODEC,
    "output buffer has": _CODEC,
    "raw frame has the wrong length": _CODEC,
    "unknown frame mode": _CODEC,
    "unknown frame flags": _CODEC,
    "delta frame needs its base chunk": _CODEC,
    "capacity must be >= 1": _RING,
    "row has shape": _RING,
    "rows have shape": _RING,
    "cuda_available has": "the process group's own check that it asked every rank (one answer per rank)",
    "/__init__.py sets no __version__": "gpu_notebook's own __init__.py always sets __version__",
    "the body ended after": "an S3 read cut short inside the store, which retries it as a dropped connection",
}


@dataclass(frozen=True)
class Message:
    """One error message in the code."""

    cls: str  # the error class built (ClusterError, UsageError, ...)
    key: str  # what the troubleshooting page must contain
    text: str  # the message as written, each {...} shown as {…}
    where: str  # path:line, relative to the repository
    area: str  # the package it is raised in (cluster, checkpoint, magics, ...)
    #: the literal parts up to the key's end, when the key is not the message's start (an f-string that starts
    #: with a value): the page must show them in this order on one line, so "instance type" alone is not enough
    parts: tuple[str, ...] = ()


def _py_files(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(package).parts))


def error_classes(files: list[Path] | None = None) -> set[str]:
    """The names of our error classes: ``GpuNotebookError`` and every class deriving from one of ours."""
    bases: dict[str, set[str]] = {}
    for path in files if files is not None else _py_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                names = {_name(b) for b in node.bases}
                bases.setdefault(node.name, set()).update(n for n in names if n)
    ours = {ROOT_ERROR}
    grew = True
    while grew:
        grew = False
        for cls, parents in bases.items():
            if cls not in ours and parents & ours:
                ours.add(cls)
                grew = True
    return ours


def _name(node: ast.expr) -> str | None:
    """``ClusterError`` for ``ClusterError`` and for ``errors.ClusterError``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _parts(node: ast.expr) -> list[str | None] | None:
    """A message expression as its literal parts, ``None`` for each ``{...}``; ``None`` when it is not
    written in the code (a variable, a call)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out: list[str | None] = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                out.append(v.value)
            else:
                out.append(None)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _parts(node.left), _parts(node.right)
        if left is None and right is None:
            return None
        return (left or [None]) + (right or [None])
    return None


def _clean(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int = KEY_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, at a word boundary."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut[: cut.rfind(" ")] if " " in cut else cut


def key_of(parts: list[str | None]) -> str:
    """The part of a message the page must contain (see the module docstring)."""
    key = _clean("".join(_prefix(parts)))
    if len(key) < MIN_KEY:
        literal = [_clean(p) for p in parts if p is not None]
        key = max(literal, key=len, default="")
    return _cut(key)


def _parts_to(parts: list[str | None], key: str) -> tuple[str, ...]:
    """The literal parts of a message up to the one ``key`` comes from, when ``key`` is not the start."""
    literal = [_clean(p) for p in parts if p is not None and _clean(p)]
    if _clean("".join(_prefix(parts))).startswith(key):
        return ()
    out: list[str] = []
    for p in literal:
        out.append(p)
        if key in p:
            break
    return tuple(out)


def _prefix(parts: list[str | None]) -> list[str]:
    out: list[str] = []
    for p in parts:
        if p is None:
            break
        out.append(p)
    return out


def messages(files: list[Path] | None = None) -> list[Message]:
    """Every message written in the code for one of our error classes or ``UsageError``, in file order."""
    files = files if files is not None else _py_files()
    classes = error_classes(files) | EXTRA_CLASSES
    found: list[Message] = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        area = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        tree = ast.parse(path.read_text(), str(path))
        # a call raised as it is (``raise self._fail(f"...")``) builds an error from its message too
        raised = {
            id(n.exc) for n in ast.walk(tree) if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call)
        }
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
            if (_name(node.func) not in classes and id(node) not in raised) or not node.args:
                continue
            parts = _parts(node.args[0])
            if parts is None:
                continue
            text = _clean("".join(p if p is not None else "{…}" for p in parts))
            key = key_of(parts)
            found.append(
                Message(str(_name(node.func)), key, text, f"{rel}:{node.lineno}", area, _parts_to(parts, key))
            )
    return found


def required(found: list[Message] | None = None) -> list[Message]:
    """The messages the page must cover: a key long enough to look up, and not excluded."""
    found = found if found is not None else messages()
    return [m for m in found if len(m.key) >= MIN_KEY and m.key not in EXCLUDED]


def normalise(page: str) -> str:
    """The page's text as the check reads it: markdown escapes undone, whitespace collapsed."""
    return _clean(page.replace("\\|", "|").replace("\\`", "`").replace("\\*", "*").replace("\\_", "_"))


def _in_order(line: str, parts: tuple[str, ...]) -> bool:
    at = 0
    for p in parts:
        at = line.find(p, at)
        if at < 0:
            return False
        at += len(p)
    return True


def missing(page_text: str, found: list[Message] | None = None) -> list[Message]:
    """The required messages the page does not show: its key (the stable start) anywhere, or, for a message
    that starts with a value, its literal parts in order on one line."""
    text = normalise(page_text)
    lines = [normalise(line) for line in page_text.splitlines()]
    out = []
    for m in required(found):
        if m.key not in text or (m.parts and not any(_in_order(line, m.parts) for line in lines)):
            out.append(m)
    return out


def _by_key(found: list[Message]) -> Iterator[tuple[str, list[Message]]]:
    seen: dict[str, list[Message]] = {}
    for m in found:
        seen.setdefault(m.key, []).append(m)
    yield from seen.items()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--missing", action="store_true", help="only the keys the troubleshooting page lacks")
    ap.add_argument("--all", action="store_true", help="every message, with where it is raised")
    args = ap.parse_args(argv)
    found = messages()
    if args.missing:
        page = PAGE.read_text() if PAGE.exists() else ""
        found = missing(page, found)
    elif not args.all:
        found = required(found)
    for key, ms in sorted(_by_key(found), key=lambda kv: (kv[1][0].area, kv[1][0].where)):
        where = ", ".join(m.where for m in ms)
        print(f"[{ms[0].area}] {ms[0].cls}: {key}\n    {ms[0].text}\n    {where}")
    print(f"{len(list(_by_key(found)))} keys", file=sys.stderr)
    return 1 if args.missing and found else 0


if __name__ == "__main__":
    sys.exit(main())
