"""Run a script file or a module on a rank as torchrun would (``%gpu_run train.py --lr 0.1``, ``-m pkg.mod``).

What the script sees is what ``torchrun`` gives it: ``sys.argv`` is ``[the path as typed, *args]`` (with
``-m``: ``[the module's file, *args]``, as ``python -m``), ``__name__ == "__main__"``, ``__file__`` the absolute
path, ``sys.path[0]`` the script's directory (``-m``: the working directory), and the working directory is where
it was launched: the notebook's (on the workers' shared filesystem), or the workers' ``--working-dir`` copy.
A rank outlives its script, so everything the script changed in the process that the rank's cells rely on is put
back afterwards: ``sys.argv``, ``sys.path``, ``sys.modules["__main__"]`` (the rank's cell namespace), the working
directory, and the modules the script imported from the user's own files (so an edited helper module is
imported afresh by the next run, as it would be by a new torchrun; third-party modules such as torch stay).

A file is found on the rank by its content: the same bytes at the same path (the notebook's filesystem) or at the
same place in the workers' working dir are run where they are; otherwise the source sent with the call (at most
:data:`MAX_SCRIPT_BYTES`) is written to a file in the rank's temporary directory and run from there, so
tracebacks show its lines. ``SystemExit`` leaves :func:`run_script` as it would leave the script: the rank
worker reports ``sys.exit(0)`` as a clean end and a non-zero code as a failure.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib.machinery
import os
import re
import runpy
import sys
import tempfile
import types
from dataclasses import dataclass, field

from gpu_notebook._display import fmt_bytes
from gpu_notebook.errors import GpuNotebookError

__all__ = ["MAX_SCRIPT_BYTES", "Script", "ScriptError", "run_script", "script_for"]

#: The largest script sent to the workers with the call (larger ones must already be on the worker's node).
MAX_SCRIPT_BYTES = 2**20

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


class ScriptError(GpuNotebookError, RuntimeError):
    """A script to run cannot be found, read or sent (the message says what to do)."""


@dataclass(frozen=True)
class Script:
    """What a rank needs to run one script or module (made in the notebook by :func:`script_for`)."""

    target: str  # the path as typed, or the module's dotted name
    args: tuple[str, ...] = ()  # its command-line arguments (sys.argv[1:])
    module: bool = False  # run a module (python -m) instead of a file
    argv0: str = ""  # sys.argv[0] for a file: the path as typed (relative to the working dir when inside it)
    path: str | None = None  # the file's absolute path in the notebook's filesystem
    relpath: str | None = None  # its path inside the workers' working dir, when it is inside it
    sha256: str = ""  # the file's content hash: how a rank recognises its own copy
    size: int = 0  # the file's size in bytes
    source: bytes | None = field(default=None, repr=False)  # the file's bytes, when small enough to send
    limit: int = MAX_SCRIPT_BYTES  # the most that may be sent
    cwd: str | None = None  # where to run it (the notebook's directory); None: the worker's own (working dir)


def script_for(
    target: str,
    args: tuple[str, ...] | list[str] = (),
    *,
    module: bool = False,
    working_dir: str | None = None,
    cwd: str | None = None,
    max_bytes: int = MAX_SCRIPT_BYTES,
) -> Script:
    """The :class:`Script` for ``target`` (a file, relative to ``cwd``; or a module with ``module=True``).

    ``working_dir`` is the workers' working dir (``--working-dir``) when they have one: they then run in their
    copy of it; otherwise in ``cwd`` (default: this process's), as torchrun runs in the directory it is started
    from. The file's bytes travel with the call when they are at most ``max_bytes``.

    Raises
    ------
    ScriptError
        The file does not exist or cannot be read, or the module name is not a dotted name.
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    run_in = None if working_dir else cwd
    if module:
        if not _MODULE_NAME.match(target):
            raise ScriptError(f"-m {target}: not a module name (a dotted name such as pkg.train)")
        return Script(target=target, args=tuple(args), module=True, cwd=run_in)
    path = os.path.abspath(os.path.join(cwd, os.path.expanduser(target)))
    if os.path.isdir(path):
        raise ScriptError(f"{target} is a directory, not a script file (for a package, use -m pkg.module)")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ScriptError(f"{target}: no such file (looked in {cwd})") from None
    except OSError as exc:
        raise ScriptError(f"{target}: cannot be read ({exc.strerror or exc})") from None
    relpath = None
    root = os.path.realpath(working_dir) if working_dir else ""
    if working_dir:
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) == root:
            relpath = os.path.relpath(real, root)
    argv0 = target
    if relpath is not None and not os.path.isabs(target) and os.path.realpath(cwd) != os.path.realpath(root):
        argv0 = relpath  # the workers run in their working dir: the path as typed would not lead there
    return Script(
        target=target,
        args=tuple(args),
        argv0=argv0,
        path=path,
        relpath=relpath,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        source=data if len(data) <= max_bytes else None,
        limit=max_bytes,
        cwd=run_in,
    )


def too_large(script: Script) -> str:
    """Why ``script`` was not sent with the call (it is over the size limit) and what to do instead."""
    return (
        f"{script.target} is {fmt_bytes(script.size, binary=True)}, over the "
        f"{fmt_bytes(script.limit, binary=True)} a script sent with the call may take: put it in the "
        f"workers' working dir (%gpu_cluster start --working-dir DIR), or on a filesystem every node shares"
    )


# ---- on the rank ---------------------------------------------------------------------------------------------
def run_script(script: Script) -> None:
    """Run ``script`` in this process as torchrun would (see the module docstring); returns None.

    Its exceptions propagate as they would end the script (``SystemExit`` too).
    """
    saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
    had_main, saved_main = "__main__" in sys.modules, sys.modules.get("__main__")
    before = set(sys.modules)
    try:
        if script.cwd and os.path.isdir(script.cwd):
            os.chdir(script.cwd)
        if script.module:
            sys.argv = [script.target, *script.args]  # runpy sets argv[0] to the module's file
            sys.path.insert(0, os.getcwd())  # as python -m does
            runpy.run_module(script.target, run_name="__main__", alter_sys=True)
        else:
            path = _file_on_this_node(script)
            sys.argv = [script.argv0 or script.target, *script.args]
            sys.path.insert(0, os.path.dirname(path))  # as python script.py does
            _run_file(path)
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if had_main:
            sys.modules["__main__"] = saved_main  # type: ignore[assignment]
        else:
            sys.modules.pop("__main__", None)
        _forget_user_modules(before, (os.getcwd(), script.cwd, os.path.dirname(script.path or "")))
        try:
            os.chdir(saved_cwd)
        except OSError:  # the script removed the directory the rank ran in: stay where it left us
            pass


def _run_file(path: str) -> None:
    """Execute the file at ``path`` as ``__main__`` (what ``python path`` does after setting sys.argv)."""
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __spec__=None,
        __package__=None,
    )
    rank_main = sys.modules.get("__main__")
    for name in ("exit", "quit"):  # the rank's own exit()/quit() (site's may be missing in a Ray worker)
        if rank_main is not None and name in rank_main.__dict__:
            main.__dict__[name] = rank_main.__dict__[name]
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _file_on_this_node(script: Script) -> str:
    """The path of ``script``'s file on this node: where it already is, or a copy of the source sent along."""
    places = []
    if script.relpath is not None:
        places.append(os.path.join(os.getcwd(), script.relpath))  # the workers' copy of the working dir
    if script.path is not None:
        places.append(script.path)
    for place in places:
        if os.path.isfile(place) and _sha256(place) == script.sha256:
            return os.path.abspath(place)
    if script.source is None:
        raise ScriptError(
            f"this worker's node has no copy of {script.target} as the notebook has it, and it was not sent: "
            f"{too_large(script)}"
        )
    folder = os.path.join(tempfile.gettempdir(), "gpu_notebook-scripts", script.sha256[:16])
    os.makedirs(folder, exist_ok=True)
    copy = os.path.join(folder, os.path.basename(script.path or script.target) or "script.py")
    if _sha256(copy) != script.sha256:
        tmp = f"{copy}.{os.getpid()}.tmp"  # ranks on one node write the same copy: each renames its own
        with open(tmp, "wb") as f:
            f.write(script.source)
        os.replace(tmp, copy)
    return copy


def _forget_user_modules(before: set[str], roots: tuple[str | None, ...]) -> None:
    """Drop the modules the script imported from the user's directories, so the next run imports them afresh."""
    dirs = [os.path.realpath(r) + os.sep for r in roots if r]
    # installed code stays imported (torch, the standard library, gpu_notebook itself: its state is the rank's)
    keep = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file or name.partition(".")[0] == "gpu_notebook":
            continue
        real = os.path.realpath(file)
        if "site-packages" in real or "dist-packages" in real or real.startswith(keep):
            continue
        if any(real.startswith(d) for d in dirs):
            sys.modules.pop(name, None)
