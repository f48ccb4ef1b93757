"""Where is each rank? Every thread's Python stack on every rank, gathered while a cell runs.

:func:`capture` runs in a rank's process, on a control thread (the worker's ``ctl`` concurrency group answers
while a cell runs): it reads ``sys._current_frames()`` and formats each thread's stack, hiding the frames of
gpu_notebook and Ray (and the thread bootstrap around them) so that the cell's own lines stand out; it says how
many it hid. It also reports the rank's collective sequence number (:func:`._process_group.collective_seq`).

:func:`gather` asks every rank at once (one batched Ray call) and returns a :class:`StacksReport`: per rank, the
thread running the cell first, then the user's other threads; ranks that did not answer in time are named.
Ranks whose sequence numbers differ are named too: a rank that has issued fewer collectives than another has not
entered the collective that one may be waiting in.

A thread blocked in C code that holds the GIL stops every thread of its process, the control threads too: such
a rank does not answer (its stack needs py-spy or faulthandler's SIGABRT dump, see :mod:`._remains`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook.distributed import _batch
from gpu_notebook.distributed._process_group import collective_seq

__all__ = ["RankStacks", "StacksReport", "ThreadStack", "capture", "gather"]

DEFAULT_TIMEOUT_S = 5.0  # how long a rank has to answer

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the gpu_notebook package


def _package_dir(name: str) -> str | None:
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else None


def _hidden_dirs() -> tuple[str, ...]:
    return tuple(d + os.sep for d in (_OURS, _package_dir("ray")) if d)


# stdlib files that only start threads: hidden when they are the outer frames of a stack
_BOOTSTRAP = (os.sep + "threading.py", os.sep + "concurrent" + os.sep + "futures" + os.sep)


def _thread_stack(
    frame: Any, hidden_dirs: tuple[str, ...], extra_hidden: Collection[str]
) -> tuple[list[str], int]:
    """The formatted frames of one thread (outermost first) without ours and Ray's, and how many were hidden."""
    summary = traceback.extract_stack(frame)
    kept: list[traceback.FrameSummary] = []
    hidden = 0
    for f in summary:
        path = os.path.abspath(f.filename) if not f.filename.startswith("<") else f.filename
        ours = path.startswith(hidden_dirs) or path in extra_hidden or "_raylet" in path
        bootstrap = not kept and any(b in path for b in _BOOTSTRAP)
        if ours or bootstrap:
            hidden += 1
        else:
            kept.append(f)
    return traceback.format_list(kept), hidden


NATIVE_TIMEOUT_S = 15.0  # for py-spy to read a rank's process


def _py_spy() -> str | None:
    """The py-spy program: next to this Python (a venv's bin), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def native_frames(native_tid: int | None) -> str:
    """The native and Python frames of thread ``native_tid`` of this process, from ``py-spy dump --native`` (it
    stops the process while it reads it, a fraction of a second), or a line saying why there are none."""
    if native_tid is None:
        return "no cell runs: no native frames"
    exe = _py_spy()
    if exe is None:
        return "no native frames: py-spy is not installed on this worker (pip install py-spy, or start with --pip py-spy)"
    try:
        r = subprocess.run(
            [exe, "dump", "--pid", str(os.getpid()), "--native"],
            capture_output=True,
            text=True,
            timeout=NATIVE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no native frames: py-spy did not answer ({type(exc).__name__})"
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["no message"])[-1]
        return (
            f"no native frames: py-spy could not read this process ({why}); it needs ptrace: in a container "
            "docker run --cap-add SYS_PTRACE, on a host sysctl kernel.yama.ptrace_scope=0"
        )
    blocks = re.split(r"\n(?=Thread )", r.stdout)
    mine = [
        b for b in blocks if b.startswith(f"Thread {native_tid} ") or b.startswith(f"Thread {native_tid:#x} ")
    ]
    if not mine:
        return "no native frames: py-spy did not list the cell's thread"
    return mine[0].rstrip()


def capture(
    exec_tid: int | None,
    extra_hidden: Collection[str] = (),
    rank: int | None = None,
    native_tid: int | None = None,
    native: bool = False,
) -> dict[str, Any]:
    """This process's threads' stacks (not the calling thread's); ``exec_tid``: the thread running the cell
    (``native_tid``: its native id, for ``native``: py-spy's native frames of it).

    Plain dicts and strings, so that the answer always pickles.
    """
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    dirs = _hidden_dirs()
    threads: list[dict[str, Any]] = []
    idle = 0
    for tid, frame in sys._current_frames().items():
        if tid == me:
            continue
        frames, hidden = _thread_stack(frame, dirs, extra_hidden)
        is_cell = tid == exec_tid
        if not frames and not is_cell:
            idle += 1  # a thread of Ray's or ours, waiting for work
            continue
        threads.append(
            {"name": names.get(tid, str(tid)), "cell": is_cell, "frames": frames, "hidden": hidden}
        )
    threads.sort(key=lambda t: not t["cell"])
    return {
        "rank": rank,
        "pid": os.getpid(),
        "busy": exec_tid is not None,
        "seq": collective_seq(),
        "threads": threads,
        "idle_threads": idle,
        "native": native_frames(native_tid if exec_tid is not None else None) if native else None,
    }


@dataclass(frozen=True)
class ThreadStack:
    """One thread's stack on a rank: its frames (formatted, outermost first) and how many were hidden."""

    name: str
    cell: bool  # the thread running the cell
    frames: list[str]
    hidden: int


@dataclass(frozen=True)
class RankStacks:
    """What one rank answered (``answered`` False: nothing within the timeout)."""

    rank: int
    answered: bool
    pid: int | None = None
    busy: bool = False  # a cell (or call) is running
    seq: int | None = None  # collectives issued on the default group (None: no group, or not known)
    threads: list[ThreadStack] = field(default_factory=list)
    idle_threads: int = 0  # Ray's and gpu_notebook's own waiting threads, not shown
    native: str | None = None  # the cell thread's native frames (py-spy), when asked for


@dataclass(frozen=True)
class StacksReport:
    """Every rank's stacks: ``ranks`` in rank order; ``str()`` is the text ``%gpu_cluster stacks`` shows."""

    ranks: list[RankStacks]
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def not_answering(self) -> list[int]:
        return [r.rank for r in self.ranks if not r.answered]

    def behind(self) -> tuple[list[int], list[int]]:
        """(ranks with the fewest collectives issued, ranks with the most) when their numbers differ."""
        seqs = {r.rank: r.seq for r in self.ranks if r.answered and r.seq is not None}
        if len(set(seqs.values())) < 2:
            return [], []
        low, high = min(seqs.values()), max(seqs.values())
        return [r for r, s in seqs.items() if s == low], [r for r, s in seqs.items() if s == high]

    def __str__(self) -> str:
        out: list[str] = [] if self.ranks else ["no ranks: the worker group has no workers"]
        for r in self.ranks:
            if not r.answered:
                out.append(
                    f"== rank {r.rank}: not answering (no reply within {self.timeout_s:g} s: its process died, "
                    f"or C code holds the GIL)"
                )
                continue
            seq = "" if r.seq is None else f", collectives issued: {r.seq}"
            out.append(f"== rank {r.rank} (pid {r.pid}, {'running a cell' if r.busy else 'idle'}{seq})")
            for t in r.threads:
                what = "the cell's thread" if t.cell else f"thread {t.name!r}"
                out.append(f"-- {what} ({t.hidden} frames of Ray and gpu_notebook hidden):")
                out.extend(line.rstrip("\n") for line in t.frames)
            if r.native is not None:
                out.append("-- the cell's thread, native frames (py-spy):")
                out.extend("  " + line for line in r.native.splitlines())
            if r.idle_threads:
                out.append(f"-- {r.idle_threads} more threads of Ray and gpu_notebook, waiting (hidden)")
        low, high = self.behind()
        if low:
            seqs = {r.rank: r.seq for r in self.ranks}
            out.append(
                f"collectives out of step: {_who(low)} issued {seqs[low[0]]}, {_who(high)} {seqs[high[0]]}: "
                f"{_who(low)} {'has' if len(low) == 1 else 'have'} not entered the collective that "
                f"{_who(high)} may be waiting in"
            )
        if self.not_answering:
            out.append(f"not answering: {_who(self.not_answering)}")
        return "\n".join(out)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def _who(ranks: Sequence[int]) -> str:
    """``"rank 1"``, ``"ranks 1, 3"``."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def gather(workers: Sequence[Any], timeout: float = DEFAULT_TIMEOUT_S, native: bool = False) -> StacksReport:
    """Every rank's stacks (``workers``: the group's :class:`._worker.Worker` records, in rank order)."""
    try:
        refs = [w.actor.stacks.remote(native) for w in workers]
    except Exception:  # noqa: BLE001 - Ray itself is going away: nobody answers
        return StacksReport([RankStacks(rank, False) for rank in range(len(workers))], timeout)
    ranks: list[RankStacks] = []
    for rank, (ok, got) in enumerate(_batch.answers(refs, timeout)):
        if not ok or not isinstance(got, dict):
            ranks.append(RankStacks(rank, False))
            continue
        threads = [ThreadStack(t["name"], t["cell"], list(t["frames"]), t["hidden"]) for t in got["threads"]]
        ranks.append(
            RankStacks(
                rank,
                True,
                got["pid"],
                got["busy"],
                got["seq"],
                threads,
                got["idle_threads"],
                got.get("native"),
            )
        )
    return StacksReport(ranks, timeout)
