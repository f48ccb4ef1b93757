"""What a distributed cell gives back: per-rank values, and one readable error report for failed ranks."""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_notebook._display import format_ranks, rank_label
from gpu_notebook.errors import GpuNotebookError


class RankResults:
    """Per-rank values, indexed by rank and iterated in rank order (a list when every rank ran).

    Examples
    --------
    >>> r = RankResults({0: 1.5, 1: 2.5})
    >>> r[1], list(r), len(r)
    (2.5, [1.5, 2.5], 2)
    """

    def __init__(self, by_rank: dict[int, Any]) -> None:
        self._by_rank = dict(sorted(by_rank.items()))

    @property
    def ranks(self) -> list[int]:
        return list(self._by_rank)

    def __getitem__(self, rank: int | slice) -> Any:
        if isinstance(rank, slice):
            return list(self)[rank]
        if rank < 0:
            rank = self.ranks[rank]
        try:
            return self._by_rank[rank]
        except KeyError:
            raise IndexError(
                f"no result for rank {rank}; ranks that ran: {format_ranks(self.ranks)}"
            ) from None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._by_rank.values())

    def __len__(self) -> int:
        return len(self._by_rank)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankResults):
            return self._by_rank == other._by_rank
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def items(self) -> list[tuple[int, Any]]:
        return list(self._by_rank.items())

    def __repr__(self) -> str:
        if self.ranks == list(range(len(self))):
            return repr(list(self))
        return "RankResults({" + ", ".join(f"{r}: {v!r}" for r, v in self._by_rank.items()) + "})"


#: How a rank failed: "error" (the cell raised), "died" (process gone), "interrupted" (by the user), "timeout",
#: "hung" (still running after another rank failed), "value" (the cell ran but its value cannot be rebuilt in
#: the notebook), "stopped" (the cluster was stopped under the cell).
FailureKind = Literal["error", "died", "interrupted", "timeout", "hung", "value", "stopped"]


@dataclass
class RankFailure:
    """How one rank failed."""

    rank: int
    kind: FailureKind
    etype: str = ""
    evalue: str = ""
    traceback: str = ""
    last_output: list[str] = field(default_factory=list)
    detail: str = ""
    cell_lines: list[int] = field(default_factory=list)
    reason: str = ""  # kind "stopped": why the cluster was stopped ("budget of $5.00 reached: ...")


class DistributedError(GpuNotebookError, Exception):
    """One error for a distributed cell: each distinct traceback once, with the ranks that raised it.

    IPython shows :meth:`_render_traceback_` instead of a traceback of gpu_notebook's own code.
    """

    def __init__(
        self, failures: Sequence[RankFailure], note: str = "", world_size: int | None = None
    ) -> None:
        self.failures = sorted(failures, key=lambda f: f.rank)
        self.note = note
        self.world_size = world_size
        super().__init__(self.render())

    @property
    def ranks(self) -> list[int]:
        return [f.rank for f in self.failures]

    @property
    def stopped(self) -> str:
        """Why the cluster was stopped under the cell, when that is what ended it on every failed rank ("")."""
        reasons = {f.reason for f in self.failures if f.kind == "stopped"}
        if len(reasons) == 1 and all(f.kind == "stopped" for f in self.failures):
            return reasons.pop()
        return ""

    def groups(self) -> list[tuple[list[int], RankFailure]]:
        """Failures with identical text grouped together, in order of the lowest rank."""
        groups: dict[tuple[str, str, str, str], tuple[list[int], RankFailure]] = {}
        for f in self.failures:
            key = (f.kind, f.etype, f.evalue if f.kind != "error" else "", f.traceback or f.detail)
            if f.kind == "error":
                key = (f.kind, f.etype, f.evalue, f.traceback)
            groups.setdefault(key, ([], f))[0].append(f.rank)
        return list(groups.values())

    def render(self) -> str:
        lines = self._head()
        note = self.note
        if self.stopped:  # the group's note says the same stop again: keep only what was added to it (hints)
            note = "\n".join(ln for ln in note.splitlines() if not ln.startswith(lines[0]))
        died = [f.rank for f in self.failures if f.kind == "died"]
        for ranks, f in self.groups():
            who = rank_label(ranks)
            lines.append("")
            if f.kind == "error" and died and lost_peer(f):
                # a consequence of the death, not a second problem: gloo's socket error and its traceback
                # (kept in .failures) would read as one
                lines.append(
                    f"--- {who}: {f.etype}{_at(f)}: its collective lost the connection to "
                    f"{rank_label(died)}, whose worker died"
                )
            elif f.kind == "error":
                lines.append(f"--- {who}: {f.etype}: {f.evalue}{_at(f)}")
                lines.extend(f.traceback.rstrip("\n").splitlines())
            else:
                lines.append(f"--- {who}: {f.kind}: {f.detail}")
                if f.etype:
                    lines.append(f"{f.etype}: {f.evalue}")
            if f.last_output:
                lines.append(f"    last output of {who}:")
                lines.extend("    | " + line for line in f.last_output)
        if note:
            lines.append("")
            lines.append(note)
        return "\n".join(lines)

    def _head(self) -> list[str]:
        """The report's first line (what the cell failed of), and for a stopped cluster what that meant."""
        n = len(self.failures)
        total = f" of {self.world_size}" if self.world_size else ""
        where = f"{n}{total} rank(s) ({format_ranks(self.ranks)})"
        kinds = {f.kind for f in self.failures}
        if self.stopped:  # a budget or idle stop, or a stop from elsewhere: its reason is the one line
            return [
                f"Cluster stopped: {self.stopped}",
                f"The cell was running on {where}; the workers were ended and nothing was restarted. Start "
                f"a cluster again (%gpu_cluster start) to go on.",
            ]
        if kinds == {"interrupted"}:  # the stop button: not a failure of the user's code
            return [f"Interrupted: the cell was stopped on {where}"]
        if kinds == {"stopped"}:
            return [f"Cluster stopped while the cell ran on {where}"]
        if kinds == {"timeout"}:
            return [f"Timeout: the cell ran past --timeout on {where}"]
        return [f"DistributedError: {n}{total} rank(s) failed ({format_ranks(self.ranks)})"]

    def _render_traceback_(self) -> list[str]:
        return self.render().splitlines()

    def __str__(self) -> str:
        return self.render()


#: what a collective raises on a rank whose peer's process is gone (gloo's TCP pairs, NCCL's remote error)
_PEER_LOST = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|remote process exited|ncclRemoteError"
)


def lost_peer(failure: RankFailure) -> bool:
    """Whether the rank's error is its collective losing a peer (after another rank's process died)."""
    return failure.kind == "error" and bool(_PEER_LOST.search(failure.evalue))


def _at(failure: RankFailure) -> str:
    return f" at cell line {failure.cell_lines[-1]}" if failure.cell_lines else ""


@dataclass
class CellResult:
    """The outcome of running a cell (or a function) on a set of ranks."""

    ranks: list[int]
    values: RankResults
    outputs: dict[int, list[str]]
    duration_s: float
    failures: list[RankFailure] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures

    def raise_for_failures(self, world_size: int | None = None) -> None:
        if self.failures:
            raise DistributedError(self.failures, self.note, world_size)

    def value_lines(self) -> list[str]:
        """The ranks' values as ``%px`` shows them (``Out[ranks 0-1]: 1.0``), see :func:`value_lines`."""
        return value_lines(self.values.items())

    def add_push_hint(self, notebook: Container[str]) -> None:
        """Add :func:`push_hint` for the names in ``notebook`` (the notebook's variables) to :attr:`note`."""
        hint = push_hint(self.failures, notebook)
        if hint:
            self.note = f"{self.note}\n{hint}" if self.note else hint


def value_groups(values: Iterable[tuple[int, Any]]) -> list[tuple[list[int], str]]:
    """The distinct ``repr`` texts of the ranks' values, each with the ranks that gave it, in order of first rank;
    ``None`` (a cell without a value) is left out, and a ``__repr__`` that raises reads ``<repr failed: ...>``.

    >>> value_groups([(0, 1.0), (1, 1.0), (2, None), (3, "x")])
    [([0, 1], '1.0'), ([3], "'x'")]
    """
    groups: dict[str, list[int]] = {}
    for rank, value in values:
        if value is None:
            continue
        try:
            text = repr(value)
        except Exception as exc:  # noqa: BLE001 - a user object's __repr__ may raise anything; show the others
            text = f"<repr failed: {exc}>"
        groups.setdefault(text, []).append(rank)
    return [(ranks, text) for text, ranks in groups.items()]


def value_lines(values: Iterable[tuple[int, Any]]) -> list[str]:
    """Each distinct value once, as ``%px`` shows it: ``Out[rank 0]: 1.0``, ``Out[ranks 0-3]: 'ok'``; a value
    of several lines starts on the next line.

    >>> value_lines([(0, 1.0), (1, 1.0)])
    ['Out[ranks 0-1]: 1.0']
    """
    lines = []
    for ranks, text in value_groups(values):
        sep = "\n" if "\n" in text else " "
        lines.append(f"Out[{rank_label(ranks)}]:{sep}{text}")
    return lines


def push_hint(failures: Iterable[RankFailure], notebook: Container[str]) -> str:
    """What to do when a cell used a notebook variable the workers never got (their namespaces are separate):
    the names a ``NameError`` says are not defined and ``notebook`` has, with the ``%gpu_push`` that sends them
    ("" when there are none).

    >>> f = RankFailure(0, "error", "NameError", "name 'lr' is not defined")
    >>> push_hint([f], {"lr": 0.1})
    "'lr' is defined in the notebook, not on the workers (each worker has its own namespace): send it first with %gpu_push lr"
    """
    names: list[str] = []
    for f in failures:
        m = re.fullmatch(r"name '(\w+)' is not defined", f.evalue) if f.etype == "NameError" else None
        if m and m.group(1) in notebook and m.group(1) not in names:
            names.append(m.group(1))
    if not names:
        return ""
    which = ", ".join(repr(n) for n in names)
    return (
        f"{which} {'is' if len(names) == 1 else 'are'} defined in the notebook, not on the workers (each "
        f"worker has its own namespace): send {'it' if len(names) == 1 else 'them'} first with "
        f"%gpu_push {' '.join(names)}"
    )
