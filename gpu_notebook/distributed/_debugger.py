"""The debugger on a rank: pdb driven from the notebook, for a failed cell's traceback and for ``breakpoint()``.

A rank has no terminal: its pdb (:class:`RankPdb`, a :class:`pdb.Pdb`) reads its commands from a queue and
writes its answers into a buffer, both in a :class:`Session`. The notebook drives a session through the worker's
control calls (they run beside a cell): :meth:`RankDebugger.command` hands one command to the session and waits
until pdb asks for the next one (or the code runs on), then returns what pdb printed. See
:mod:`._debug` for the notebook's side.

Two ways in:

- **post-mortem**: the worker keeps the last failed cell's exception (:meth:`RankDebugger.keep`) until the next
  cell on the rank; :meth:`RankDebugger.post_mortem` opens pdb on its traceback in a thread of its own (no cell
  runs then, and the cell thread stays free for the next cell).
- **breakpoints**: ``sys.breakpointhook`` and ``pdb.set_trace`` start a session on the thread that called them;
  that thread (the cell's) then waits in pdb's prompt. The rank writes ``paused at cell line N`` into its output
  with a marker (:data:`._rich.PAUSED_MIME`) that tells the notebook to prompt; another marker says when it runs on.
  ``PYTHONBREAKPOINT=0`` turns ``breakpoint()`` off and ``PYTHONBREAKPOINT=module.func`` calls that instead, as
  in plain Python.

Frames of gpu_notebook's worker (and Ray's, below it) are left out of the stack pdb shows, so ``u`` stops at the
cell and ``w`` lists the user's frames only.
"""

from __future__ import annotations

import os
import pdb
import queue
import runpy
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any, TypedDict

from gpu_notebook.distributed import _rich

__all__ = ["DebugAnswer", "DebugState", "RankDebugger", "RankPdb", "Session"]

#: how long a command that lets the code run (``n``, ``s``, ``c``) waits for the code to stop again before its
#: answer is "running": a step usually stops within it, so its answer is the next line, as in a terminal
SETTLE_S = 0.5
#: how long a command waits for pdb to ask for it, when pdb is still busy setting up
READY_S = 10.0
#: how often the thread waiting in pdb's prompt looks whether it was interrupted
_SLICE_S = 0.05

# a frame of these files, and every frame outside it, is the worker's own: the stack pdb shows starts below it
_OUTER_FILES = frozenset(
    [os.path.join(os.path.dirname(os.path.abspath(__file__)), f) for f in ("_worker.py", "_script.py")]
    + [os.path.abspath(runpy.__file__)]
)


class DebugAnswer(TypedDict):
    """What :meth:`RankDebugger.command` returns: pdb's output, and whether the rank still waits in pdb."""

    output: str  # what pdb printed for the command (and since the last answer)
    paused: bool  # pdb waits for the next command on this rank
    where: str  # "cell line 12", "train.py line 30" ("" when not paused)
    kind: str  # "breakpoint", "post-mortem" ("" when no session)


class DebugState(TypedDict):
    """What :meth:`RankDebugger.state` returns: a pause, and the failure kept for post-mortem."""

    paused: bool
    where: str
    kind: str
    failure: dict[str, str] | None  # etype, evalue, where: the last failed cell's exception (None: none kept)


class Session:
    """One pdb conversation: its commands (a queue), its output (a buffer) and where it is.

    ``state``: "starting" (pdb sets up), "waiting" (for a command), "busy" (running one), "running" (the code
    runs on: after ``c``, ``n``, or not yet stopped), "ended" (pdb left: ``q``, a post-mortem's end, an
    interrupt).
    """

    def __init__(self, kind: str, debugger: RankDebugger) -> None:
        self.kind = kind
        self.debugger = debugger
        self.cond = threading.Condition()
        self.state = "starting"
        self.commands: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.out: list[str] = []
        self.where = ""
        self.driven = False  # a command from the notebook is in flight: a pause it leads to is its answer
        self.interrupted = False  # the stop button: the prompt raises KeyboardInterrupt in the waiting thread
        self.pdb = RankPdb(self)

    def _set(self, state: str) -> None:
        with self.cond:
            self.state = state
            self.cond.notify_all()

    # ---- pdb's side (the paused thread) ----------------------------------------------------------------------
    def readline(self) -> str:
        """pdb's next command: waits in slices, so an interrupt (the stop button) lands between two."""
        self._set("waiting")
        while True:
            if self.interrupted:
                raise KeyboardInterrupt
            try:
                line = self.commands.get(timeout=_SLICE_S)
            except queue.Empty:
                continue
            return line + "\n"

    def write(self, text: str) -> int:
        with self.cond:
            self.out.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    # ---- the notebook's side (a control call) ----------------------------------------------------------------
    def command(self, line: str | None, settle: float = SETTLE_S) -> DebugAnswer:
        """Send ``line`` (None: only collect what pdb printed) and wait for pdb's next prompt, or for the code
        to run on for ``settle`` seconds; pdb's output since the last answer."""
        with self.cond:
            self.cond.wait_for(lambda: self.state not in ("starting", "busy"), READY_S)
            if line is not None and self.state == "waiting":
                self.driven = True
                self.state = "busy"
                self.commands.put(line)
                resumed: float | None = None
                while self.state not in ("waiting", "ended"):
                    if self.state == "running":
                        resumed = time.monotonic() if resumed is None else resumed
                        if time.monotonic() - resumed >= settle:
                            break
                    self.cond.wait(0.02)
                self.driven = False
            text, self.out = "".join(self.out), []
            paused = self.state in ("waiting", "busy")
            return {
                "output": text,
                "paused": paused,
                "where": self.where if paused else "",
                "kind": self.kind,
            }

    def paused(self) -> bool:
        return self.state in ("starting", "waiting", "busy")


class RankPdb(pdb.Pdb):
    """pdb with the session as its terminal; the worker's frames are not in its stack."""

    def __init__(self, session: Session) -> None:
        super().__init__(stdin=session, stdout=session, nosigint=True, readrc=False)  # type: ignore[arg-type]
        self.session = session
        self.use_rawinput = False
        self.prompt = ""  # the notebook shows its own, "(Pdb rank 1) "

    def _cmdloop(self) -> None:
        # pdb's own loop catches KeyboardInterrupt and prompts again: the stop button must end the pause
        self.allow_kbdint = True
        self.cmdloop()
        self.allow_kbdint = False

    def setup(self, f: FrameType | None, tb: TracebackType | None) -> Any:
        stop = super().setup(f, tb)
        self.session.debugger.paused(self.session, self.curframe)
        return stop

    def interaction(self, frame: FrameType | None, traceback: TracebackType | None) -> None:
        try:
            super().interaction(frame, traceback)
        except BaseException:
            self.session._set("ended")
            self.session.debugger.resumed(self.session)
            raise
        # after ``c`` with no breakpoints set pdb stops tracing: the pause is over, nothing to wait for
        tracing = sys.gettrace() is not None and not self.quitting
        self.session._set("running" if tracing and self.session.kind == "breakpoint" else "ended")
        self.session.debugger.resumed(self.session)

    def get_stack(self, f: FrameType | None, t: TracebackType | None) -> tuple[list[Any], int]:
        """pdb's stack without the worker's frames and Ray's below them: it starts at the cell (or script)."""
        stack, i = super().get_stack(f, t)
        cut = -1
        for k, (frame, _) in enumerate(stack[: i + 1]):
            if os.path.abspath(frame.f_code.co_filename) in _OUTER_FILES:
                cut = k
        return stack[cut + 1 :], i - cut - 1

    def do_interact(self, arg: str) -> None:
        self.error("interact needs a terminal, and a rank has none: use p, pp or ! statements")


class RankDebugger:
    """A rank's debugger: its session (one at a time), the failure kept for post-mortem, the breakpoint hook.

    ``write`` sends text into the rank's output (the cell's); ``rank`` says the rank (for messages).
    """

    def __init__(self, write: Any) -> None:
        self._write = write
        self._lock = threading.Lock()
        self.session: Session | None = None
        self.failure: BaseException | None = None  # the last failed cell's exception, for post-mortem
        self.cell_file: str | None = None  # the running (or last) cell's file name, "<cell In[3]>"
        self._ignored_hook: str | None = None  # see install

    # ---- the worker's hooks ------------------------------------------------------------------------------------
    def install(self, ignored_hook: str | None = None) -> None:
        """``breakpoint()`` and ``pdb.set_trace()`` in this process pause in a session.

        ``ignored_hook``: a ``PYTHONBREAKPOINT`` value that means "ours" all the same: the one Ray sets in
        every worker (its own debugger, for VS Code), which the user did not choose.
        """
        self._ignored_hook = ignored_hook
        sys.breakpointhook = self.breakpointhook
        pdb.set_trace = self.pdb_set_trace

    def begin_cell(self, cell_file: str | None) -> Any:
        """A cell starts: end a post-mortem session and forget the last failure; returns it, for the worker to
        drop on another thread (its frames may hold a DataLoader whose shutdown waits)."""
        old, self.failure = self.failure, None
        s = self.session
        if s is not None and s.kind == "post-mortem" and s.paused():
            s.interrupted = True
        self.cell_file = cell_file
        return old

    def keep(self, exc: BaseException) -> None:
        """The cell failed with ``exc``: kept for post-mortem until the next cell."""
        self.failure = exc

    def interrupt(self) -> None:
        """The stop button: a pause on the cell's thread ends with KeyboardInterrupt."""
        s = self.session
        if s is not None and s.kind == "breakpoint" and s.paused():
            s.interrupted = True

    def where(self, frame: FrameType | None) -> str:
        """``"cell line 12"`` for the running cell, ``"cell In[2] line 5"``, ``"train.py line 30"``."""
        if frame is None:
            return ""
        name, line = frame.f_code.co_filename, frame.f_lineno
        if name == self.cell_file:
            return f"cell line {line}"
        if name.startswith("<") and name.endswith(">"):
            return f"{name[1:-1]} line {line}"
        return f"{os.path.basename(name)} line {line}"

    # ---- sessions --------------------------------------------------------------------------------------------
    def paused(self, session: Session, frame: FrameType | None) -> None:
        """pdb stopped (called from its setup): say so in the output unless a command of the notebook led here."""
        with session.cond:
            session.where = self.where(frame)
            session.state = "starting"  # until pdb asks for a command (the notebook's peek waits for that)
            session.cond.notify_all()
            announce = not session.driven and session.kind == "breakpoint"
        if announce:
            self._write(f"paused at {session.where}\n")
        if session.kind == "breakpoint":
            self._marker(True)

    def resumed(self, session: Session) -> None:
        if session.kind == "breakpoint":
            self._marker(False)

    def _marker(self, paused: bool) -> None:
        self._write(_rich.encode({"data": {_rich.PAUSED_MIME: {"paused": paused}, "text/plain": ""}}))

    def breakpointhook(self, *args: Any, **kwargs: Any) -> Any:
        """``sys.breakpointhook``: pause here, unless ``PYTHONBREAKPOINT`` says otherwise (as plain Python)."""
        hook = os.environ.get("PYTHONBREAKPOINT", "")
        if hook == "0":
            return None
        if hook and hook != self._ignored_hook:
            return sys.__breakpointhook__(*args, **kwargs)
        self.set_trace(sys._getframe(1))
        return None

    def pdb_set_trace(self, *, header: str | None = None) -> None:
        """``pdb.set_trace()``: pause in the caller, as ``breakpoint()``."""
        self.set_trace(sys._getframe(1), header)

    def set_trace(self, frame: FrameType, header: str | None = None) -> None:
        """Pause in ``frame`` at its next line; a pause of another thread is waited for first (one at a time)."""
        s = Session("breakpoint", self)
        if header is not None:
            s.write(header + "\n")
        while True:
            with self._lock:
                cur = self.session
                if cur is None or cur.kind != "breakpoint" or not cur.paused():
                    self.session = s
                    break
            time.sleep(_SLICE_S)
        s.pdb.set_trace(frame)

    def post_mortem(self) -> DebugAnswer:
        """Open pdb on the kept failure's traceback, in a thread of its own; its first answer (where it is)."""
        s = self.session
        if s is not None and s.kind == "post-mortem" and s.paused():
            return s.command(None)  # already open: attach to it
        exc = self.failure
        if exc is None:
            return {"output": "", "paused": False, "where": "", "kind": ""}
        tb = exc.__traceback__
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in _OUTER_FILES:
            tb = tb.tb_next
        if tb is None:  # the failure was in the worker's own code: nothing of the user's to show
            return {"output": "", "paused": False, "where": "", "kind": ""}
        s = Session("post-mortem", self)
        with self._lock:
            self.session = s
        s.write(f"{type(exc).__name__}: {exc}\n")

        def run() -> None:
            try:
                s.pdb.reset()
                s.pdb.interaction(None, tb)
            except BaseException:  # noqa: BLE001 - an interrupt or pdb's own quit: the session ends either way
                s._set("ended")

        threading.Thread(target=run, name="gpu_notebook-debugger", daemon=True).start()
        return s.command(None)

    def command(self, line: str | None, settle: float = SETTLE_S) -> DebugAnswer:
        """Send a pdb command to the open session (None: collect its output only)."""
        s = self.session
        if s is None or not s.paused():
            return {"output": "", "paused": False, "where": "", "kind": s.kind if s else ""}
        return s.command(line, settle)

    def is_paused(self) -> bool:
        s = self.session
        return s is not None and s.paused()

    def state(self) -> DebugState:
        s = self.session
        paused = s is not None and s.paused()
        exc = self.failure
        failure = None
        if exc is not None:
            tb, where = exc.__traceback__, ""
            while tb is not None:
                where = self.where(tb.tb_frame) if tb.tb_frame.f_code.co_filename == self.cell_file else where
                tb = tb.tb_next
            failure = {"etype": type(exc).__name__, "evalue": str(exc)[:300], "where": where}
        return {
            "paused": paused,
            "where": s.where if paused and s is not None else "",
            "kind": s.kind if paused and s is not None else "",
            "failure": failure,
        }
