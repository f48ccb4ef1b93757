"""What a distributed cell gives back: per-rank values, and one readable error report for failed ranks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook.distributed._ranks import format_ranks
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


@dataclass
class RankFailure:
    """How one rank failed."""

    rank: int
    # "error" (the cell raised), "died" (process gone), "interrupted", "timeout", "hung", "value" (the cell
    # ran but its value cannot be rebuilt in the notebook), "stopped" (the cluster was stopped under the cell)
    kind: str
    etype: str = ""
    evalue: str = ""
    traceback: str = ""
    last_output: list[str] = field(default_factory=list)
    detail: str = ""
    cell_lines: list[int] = field(default_factory=list)


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
        lines: list[str] = []
        n = len(self.failures)
        total = f" of {self.world_size}" if self.world_size else ""
        kinds = {f.kind for f in self.failures}
        if kinds == {"interrupted"}:  # the stop button: not a failure of the user's code
            head = f"Interrupted: the cell was stopped on {n}{total} rank(s) ({format_ranks(self.ranks)})"
        elif kinds == {"stopped"}:  # a budget or idle stop, or a stop from elsewhere: the note says which
            head = f"Cluster stopped while the cell ran on {n}{total} rank(s) ({format_ranks(self.ranks)})"
        elif kinds == {"timeout"}:
            head = f"Timeout: the cell ran past --timeout on {n}{total} rank(s) ({format_ranks(self.ranks)})"
        else:
            head = f"DistributedError: {n}{total} rank(s) failed ({format_ranks(self.ranks)})"
        lines.append(head)
        for ranks, f in self.groups():
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"
            lines.append("")
            if f.kind == "error":
                where = ""
                if f.cell_lines:
                    where = f" at cell line {f.cell_lines[-1]}"
                lines.append(f"--- {who}: {f.etype}: {f.evalue}{where}")
                lines.extend(f.traceback.rstrip("\n").splitlines())
            else:
                lines.append(f"--- {who}: {f.kind}: {f.detail}")
                if f.etype:
                    lines.append(f"{f.etype}: {f.evalue}")
            if f.last_output:
                lines.append(f"    last output of {who}:")
                lines.extend("    | " + line for line in f.last_output)
        if self.note:
            lines.append("")
            lines.append(self.note)
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        return self.render().splitlines()

    def __str__(self) -> str:
        return self.render()


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
