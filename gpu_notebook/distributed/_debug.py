"""The notebook's side of the rank debugger: the ``(Pdb rank 1)`` prompt, for breakpoints and post-mortem.

The ranks run pdb themselves (:mod:`._debugger`); this module reads a command with ``input()`` (in a Jupyter
kernel that is the stdin channel: the notebook's input box in JupyterLab, Notebook 7 and VS Code), sends it to
the rank through a control call of its worker, and prints the answer. A :class:`Console` talks to the ranks
paused at once: a pdb command goes to the current rank, ``rank N`` switches, ``all CMD`` runs ``CMD`` on every
paused rank and shows each answer under its rank, ``c`` continues the current rank and ``all c`` every one.

Where it opens:

- **a running cell** (:func:`watch`, called from the group's wait loop at each poll): a rank that pauses writes
  a marker into its output; the cell's wait opens the prompt at once, while a background cell
  (``--noblock``, whose thread never prompts: :data:`PROMPT` is False there) notes which ranks wait and leaves
  them to ``%gpu_debug``. While a rank is paused, a failure of another rank does not start the "left hanging"
  clock, and the stall report says "paused in the debugger" instead of reporting a hang.
- **``%gpu_debug``** (:func:`debug`): attaches to paused ranks, or opens post-mortem on the kept traceback of a
  failed rank (the lowest by default), whose prompt names the ranks that failed alike.
"""

from __future__ import annotations

import contextvars
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpu_notebook._display import format_ranks
from gpu_notebook.distributed import _batch
from gpu_notebook.distributed._debugger import DebugAnswer, DebugState
from gpu_notebook.errors import GpuNotebookError

__all__ = ["PROMPT", "Console", "DebugError", "debug", "paused_ranks", "states", "watch"]

#: whether a cell run in this context may prompt when a rank pauses (a background cell's thread sets False)
PROMPT: contextvars.ContextVar[bool] = contextvars.ContextVar("gpu_notebook_debug_prompt", default=True)

#: the commands of the console itself, shown once when it opens on a breakpoint
HELP = (
    "gpu_notebook debugger: pdb commands go to the rank in the prompt; `rank N` switches to another paused "
    "rank, `all CMD` runs CMD on every paused rank (`all c` continues them all); `c` continues this rank."
)

Read = Callable[[str], str]
Write = Callable[[str], None]


class DebugError(GpuNotebookError, LookupError):
    """``%gpu_debug`` found nothing to debug, or cannot prompt (the message says why)."""


def _input(prompt: str) -> str:
    import builtins

    return builtins.input(prompt)  # looked up at each prompt: ipykernel puts its own in while a cell runs


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _ray() -> Any:
    import ray

    return ray


def states(
    workers: Sequence[Any], ranks: Sequence[int] | None = None, timeout: float = 5.0
) -> dict[int, DebugState]:
    """Each rank's debugger state (a pause, a kept failure), in one batched call; ranks that do not answer are
    left out."""
    ranks = list(range(len(workers))) if ranks is None else list(ranks)
    try:
        refs = [workers[r].actor.debug_state.remote() for r in ranks]
    except Exception:  # noqa: BLE001 - Ray is going away (the cluster stops): nobody is paused
        return {}
    return {r: a for r, (ok, a) in zip(ranks, _batch.answers(refs, timeout), strict=True) if ok}


def paused_ranks(workers: Sequence[Any], ranks: Sequence[int] | None = None) -> list[int]:
    """The ranks whose code waits in the debugger at a breakpoint."""
    return sorted(r for r, s in states(workers, ranks).items() if s["paused"] and s["kind"] == "breakpoint")


class Console:
    """The prompt loop over the paused ranks of ``workers`` (all of them may be asked, ``ranks`` are watched).

    ``read`` asks for a line (default ``input``), ``write`` shows text (default stdout). ``alike``: in a
    post-mortem, the ranks that failed as the debugged one did (named in the prompt).
    """

    def __init__(
        self,
        workers: Sequence[Any],
        ranks: Sequence[int],
        read: Read | None = None,
        write: Write | None = None,
        alike: Sequence[int] = (),
    ) -> None:
        self.workers = list(workers)
        self.ranks = list(ranks)
        self.read = read or _input
        self.write = write or _stdout
        self.alike = list(alike)
        self.paused: list[int] = []
        self.where: dict[int, str] = {}

    def prompt(self, rank: int) -> str:
        if len(self.alike) > 1:
            return f"(Pdb rank {rank}; ranks {format_ranks(self.alike)} failed alike) "
        return f"(Pdb rank {rank}) "

    def send(self, rank: int, line: str | None) -> DebugAnswer:
        """One command to one rank; its answer (a rank that does not answer is no longer paused)."""
        ray = _ray()
        try:
            answer: DebugAnswer = ray.get(self.workers[rank].actor.debug_command.remote(line))
        except ray.exceptions.RayError as exc:
            return {
                "output": f"*** rank {rank} did not answer: {exc}\n",
                "paused": False,
                "where": "",
                "kind": "",
            }
        self._note(rank, answer)
        return answer

    def send_all(self, line: str) -> dict[int, DebugAnswer]:
        """One command to every paused rank at once; their answers by rank."""
        ray = _ray()
        refs = {r: self.workers[r].actor.debug_command.remote(line) for r in self.paused}
        out: dict[int, DebugAnswer] = {}
        for r, ref in refs.items():
            try:
                out[r] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                out[r] = {"output": f"*** did not answer: {exc}\n", "paused": False, "where": "", "kind": ""}
            self._note(r, out[r])
        return out

    def _note(self, rank: int, answer: DebugAnswer) -> None:
        if answer["paused"]:
            self.where[rank] = answer["where"]
            if rank not in self.paused:
                self.paused.append(rank)
        elif rank in self.paused:
            self.paused.remove(rank)

    def refresh(self) -> None:
        """Ask the watched ranks which are paused now (one may have paused since the prompt opened)."""
        for r, s in states(self.workers, self.ranks).items():
            if s["paused"] and s["kind"] == "breakpoint":
                self.where[r] = s["where"]
                if r not in self.paused:
                    self.paused.append(r)
            elif r in self.paused:
                self.paused.remove(r)
        self.paused.sort()

    def others(self, current: int) -> str:
        rest = [f"rank {r} at {self.where.get(r, '?')}" for r in self.paused if r != current]
        return f" (also paused: {', '.join(rest)})" if rest else ""

    def loop(self, current: int, first: str = "") -> None:
        """Prompt until no watched rank is paused. KeyboardInterrupt (the stop button) propagates."""
        if current not in self.paused:
            self.paused.append(current)
            self.paused.sort()
        self.write(first)
        while self.paused:
            if current not in self.paused:
                current = self.paused[0]
                self.write(
                    f"now rank {current}, paused at {self.where.get(current, '?')}{self.others(current)}\n"
                )
                self.write(self.send(current, None)["output"])
                continue
            try:
                line = self.read(self.prompt(current))
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - no input box (nbclient, a script without stdin): go on
                self.cannot_prompt(exc)
                return
            current = self.one(current, line)

    def one(self, current: int, line: str) -> int:
        """Run one line typed at the prompt; the rank current after it."""
        word, _, rest = line.strip().partition(" ")
        if word == "rank":
            try:
                rank = int(rest)
            except ValueError:
                self.write("*** usage: rank N (a paused rank)\n")
                return current
            self.refresh()
            if rank not in self.paused:
                paused = format_ranks(self.paused) if self.paused else "none"
                self.write(f"*** rank {rank} is not paused in the debugger (paused: {paused})\n")
                return current
            self.write(self.send(rank, None)["output"])
            return rank
        if word == "all" and rest.strip():
            self.refresh()
            for r, answer in sorted(self.send_all(rest).items()):
                text = answer["output"] or ("(runs on)\n" if not answer["paused"] else "")
                self.write("".join(f"[rank {r}] {ln}\n" for ln in text.splitlines()))
            return current
        answer = self.send(current, line)
        self.write(answer["output"])
        if not answer["paused"] and self.ranks != [current]:
            self.refresh()
        return current

    def cannot_prompt(self, exc: BaseException) -> None:
        """No input box: the paused ranks continue (a cell run by nbclient must not wait for ever)."""
        ranks = list(self.paused)
        for r in ranks:
            self.send(r, "c")
        self.write(
            f"gpu_notebook: rank {format_ranks(ranks)} paused in the debugger, but this frontend cannot ask for "
            f"input ({type(exc).__name__}: {exc}); continued\n"
        )


def watch(run: Any, now: float) -> None:
    """At each poll of a running cell: a rank that paused gets a prompt (a foreground cell) or a note (a
    background cell); while a rank is paused, a failed rank's "left hanging" clock waits."""
    streamer = run.streamer
    if any(streamer.debugger.values()) and run.first_failure_at is not None:
        run.first_failure_at = now  # a paused rank is no hang: the others' grace starts after the pause
    if not streamer.pause_news:
        return
    streamer.pause_news = False
    if not PROMPT.get():
        ranks = sorted(r for r, p in streamer.debugger.items() if p)
        if ranks:
            who = f"ranks {format_ranks(ranks)} wait" if len(ranks) > 1 else f"rank {ranks[0]} waits"
            streamer.say(f"gpu_notebook: {who} in the debugger: %gpu_debug attaches")
        return
    console = Console(run.workers, run.selected, write=streamer.sink or _stdout)
    console.refresh()
    if console.paused:
        streamer.say(HELP)
        current = console.paused[0]
        head = console.others(current)
        console.loop(
            current, (f"rank {current}{head}\n" if head else "") + console.send(current, None)["output"]
        )
    if run.stall is not None:
        run.stall.restart(time.monotonic())


def debug(group: Any, rank: int | None = None, read: Read | None = None, write: Write | None = None) -> None:
    """What ``%gpu_debug`` does: attach to the ranks paused at a breakpoint, else open post-mortem on the
    kept traceback of ``rank`` (default: the lowest rank that failed).

    Raises
    ------
    DebugError
        Nothing to debug: no rank is paused, and none (or not ``rank``) keeps a failure.
    KeyboardInterrupt
        The stop button, at a breakpoint's prompt (the caller interrupts the cell); a post-mortem just ends.
    """
    workers = group.workers
    found = states(workers)
    paused = sorted(r for r, s in found.items() if s["paused"] and s["kind"] == "breakpoint")
    if paused:
        if rank is not None and rank not in paused:
            raise DebugError(f"rank {rank} is not paused in the debugger: rank {format_ranks(paused)} is")
        console = Console(workers, range(len(workers)), read, write)
        console.refresh()
        current = rank if rank is not None else paused[0]
        console.loop(current, HELP + "\n" + console.send(current, None)["output"])
        return
    failed = {r: s["failure"] for r, s in found.items() if s["failure"] is not None}
    if not failed:
        raise DebugError(
            "no rank has a failure to debug: %gpu_debug opens pdb on the traceback of a rank's last "
            "failed %%distributed cell or %gpu_run (kept until its next cell), or at a breakpoint() that paused"
        )
    if rank is None:
        rank = min(failed)
    elif rank not in failed:
        raise DebugError(f"rank {rank} has no failure to debug: rank {format_ranks(sorted(failed))} failed")
    mine = failed[rank]
    alike = sorted(r for r, f in failed.items() if (f["etype"], f["where"]) == (mine["etype"], mine["where"]))
    first = _ray().get(workers[rank].actor.debug_post_mortem.remote())
    if not first["paused"]:
        raise DebugError(f"rank {rank}'s failure has no frame of your code to debug")
    console = Console(workers, [rank], read, write, alike=alike)
    try:
        console.loop(rank, first["output"])
    except KeyboardInterrupt:
        console.send(rank, "q")
        (write or _stdout)("the debugger was closed\n")
