"""The automatic hang report: a cell whose ranks stopped making progress in a collective says so, with stacks.

While a cell runs on every rank of a group with a process group, the group asks the ranks for their collective
sequence numbers every :data:`PROBE_S` seconds: one batched ``ping`` (a control call, answered while the cell
runs), sent from the cell's wait loop and read at a later poll, so the wait never blocks on it. When the numbers
differ between ranks and none of them has moved for ``after_s`` seconds (``$GPU_NOTEBOOK_STALL_REPORT``, default
120; 0 turns the report off), the cell shows, once, what ``%gpu_cluster stacks`` shows: every rank's Python stack,
the sequence numbers, and the ranks with the fewest collectives issued, which have not entered the collective the
others wait in: usually the rank at fault (its stack says where it is instead).

A rank paused in the debugger (``breakpoint()``, see :mod:`._debug`) is no hang: while one is, the report
says once that it is paused instead, and the clock starts again after the pause.

Equal numbers on every rank are not reported: the ranks may all be computing (or sleeping) between collectives.
A rank that does work of its own while the others wait (an evaluation on rank 0 only) is reported too, once: that
is a wait in a collective, and the report says how to turn it off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gpu_notebook import _settings
from gpu_notebook.distributed import _batch, _stacks

__all__ = ["PROBE_S", "StallClock", "StallWatch", "paused_message", "stall_message", "watch_for"]

PROBE_S = (
    10.0  # how often the ranks' sequence numbers are asked for (at most; a third of the threshold if less)
)
ANSWER_S = 5.0  # a probe not answered by every rank within this is read as it stands (missing ranks unknown)


class StallClock:
    """The decision, without Ray: fed each probe's sequence numbers (None: that rank did not say), it answers
    True once, when the numbers differ between ranks and have not changed for ``after_s`` seconds.

    >>> c = StallClock(after_s=60)
    >>> c.observe((4, 4), 0), c.observe((4, 4), 100)  # equal: the ranks may all be computing
    (False, False)
    >>> c.observe((5, 4), 110), c.observe((5, 4), 160), c.observe((5, 4), 171), c.observe((5, 4), 300)
    (False, False, True, False)
    >>> c = StallClock(after_s=60)
    >>> c.observe((5, 4), 0), c.observe((6, 5), 50), c.observe((6, 5), 100)  # it moved at 50
    (False, False, False)
    """

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self.seqs: tuple[int | None, ...] | None = None
        self.since = 0.0  # when the current numbers were first seen
        self.reported = False

    def observe(self, seqs: Sequence[int | None], now: float) -> bool:
        seqs = tuple(seqs)
        if self.reported:
            return False
        if len({s for s in seqs if s is not None}) < 2:
            self.seqs = None
            return False
        if seqs != self.seqs:
            self.seqs, self.since = seqs, now
            return False
        if now - self.since > self.after_s:
            self.reported = True
            return True
        return False


def stall_message(report: _stacks.StacksReport, stalled_s: float, after_s: float) -> str:
    """What the cell shows: how long nothing moved, who is behind, then every rank's stacks."""
    low, high = report.behind()
    head = f"gpu_notebook: no collective has completed for {stalled_s:.0f} s: "
    if low:
        seqs = {r.rank: r.seq for r in report.ranks}
        lows = ", ".join(map(str, low))
        head += (
            f"rank{'s' if len(low) > 1 else ''} {lows} issued {seqs[low[0]]} collective(s), the others up to "
            f"{seqs[high[0]]}: rank{'s' if len(low) > 1 else ''} {lows} {'has' if len(low) == 1 else 'have'} "
            f"not entered the collective the others wait in (the stack below shows where instead)."
        )
    else:  # the numbers moved on between the probe and this report
        head += "the ranks' collective sequence numbers differ."
    tail = (
        f"The cell goes on waiting (torch.distributed's own timeout ends it; the stop button interrupts it). "
        f"This report comes once per cell, after {after_s:g} s: "
        f"${_settings.STALL_REPORT_VAR}=0 turns it off, =SECONDS changes the wait."
    )
    return f"{head}\n{report}\n{tail}"


def paused_message(ranks: Sequence[int]) -> str:
    """What the cell shows instead of a hang report while ranks are paused in the debugger."""
    names = ", ".join(map(str, ranks))
    return (
        f"gpu_notebook: rank{'s' if len(ranks) > 1 else ''} {names} paused in the debugger; the other ranks "
        f"wait for {'them' if len(ranks) > 1 else 'it'} (no hang)"
    )


class StallWatch:
    """Probes ``workers`` (all ranks of the group, in rank order) from the cell's wait loop; ``tick(now)`` at
    every poll. ``say`` shows the report in the cell."""

    def __init__(
        self,
        workers: Sequence[Any],
        after_s: float,
        say: Callable[[str], None],
        probe_s: float = PROBE_S,
    ) -> None:
        self.workers = list(workers)
        self.clock = StallClock(after_s)
        self.say = say
        self.probe_s = max(0.2, min(probe_s, after_s / 3))
        self._refs: list[Any] | None = None
        self._sent_at = 0.0
        self._next = time.monotonic() + self.probe_s
        self._said_paused = False
        self._paused_since: float | None = None  # when a probe first found a rank paused in the debugger

    def restart(self, now: float) -> None:
        """Start the clock again (after a pause in the debugger, during which nothing was probed)."""
        self.clock.seqs, self._refs, self._next = None, None, now + self.probe_s

    def tick(self, now: float) -> None:
        if self.clock.reported:
            return
        if self._refs is not None:
            got = _batch.answers(self._refs, 0)
            if now - self._sent_at < ANSWER_S and not all(ok for ok, _ in got):
                return  # not every rank answered yet: read again at a later poll
            self._refs = None
            seqs = [a.get("seq") if ok and isinstance(a, dict) else None for ok, a in got]
            paused = [r for r, (ok, a) in enumerate(got) if ok and isinstance(a, dict) and a.get("debugger")]
            if paused:  # a pause in the debugger is no hang: said once, and the clock starts after it
                self._paused_since = self._paused_since if self._paused_since is not None else now
                if now - self._paused_since > self.clock.after_s and not self._said_paused:
                    self._said_paused = True
                    self.say(paused_message(paused))
                self.clock.seqs = None
                return
            self._paused_since = None
            if self.clock.observe(seqs, now):
                report = _stacks.gather(self.workers)
                self.say(stall_message(report, now - self.clock.since, self.clock.after_s))
                return
        if now >= self._next:
            self._next = now + self.probe_s
            try:
                self._refs = [w.actor.ping.remote() for w in self.workers]
            except Exception:  # noqa: BLE001 - Ray is going away (the cluster stops): nothing to report
                self.clock.reported = True
            self._sent_at = now


def watch_for(
    workers: Sequence[Any], selected: Sequence[int], backend: str | None, say: Callable[[str], None]
) -> StallWatch | None:
    """The watch for a cell on ``selected`` of ``workers``: only on every rank of a group with a process group
    (a cell on some ranks has its own check: :mod:`._outside_wait`), and not when the report is off."""
    if backend is None or len(workers) < 2 or sorted(selected) != list(range(len(workers))):
        return None
    try:
        after = _settings.stall_report_s()
    except ValueError as exc:
        say(f"gpu_notebook: {exc}; this cell has no hang report")
        return None
    return StallWatch(workers, after, say) if after > 0 else None
