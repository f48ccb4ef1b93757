"""How checks say what they found: a small :class:`Findings` builder, and the node labels findings carry.

A check knows once which check, node and rank it is about; after that each result is one line::

    out = Findings("shm", node)
    out.warn("/dev/shm is missing", "mount a tmpfs at /dev/shm (or --ipc=host)")
    return out.findings

A check that reports on several ranks or under several check names overrides ``check=``, ``node=`` or
``rank=`` for one finding.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterator, Sequence

from ._report import ERROR, OK, WARNING, Finding
from ._shapes import Facts

__all__ = ["Findings", "node_labels"]


class _Keep(enum.Enum):
    """The builder's own rank (``None`` cannot say that: it means "node-wide")."""

    RANK = "rank"


_KEEP = _Keep.RANK


class Findings:
    """Collects the :class:`Finding`\\s of one check about one node (and rank), in order.

    Parameters
    ----------
    check
        The check's short name, e.g. ``"cuda-driver"``.
    node
        The node label (``"*"`` for cluster-wide findings).
    rank
        The rank the findings are about, or ``None`` for node-wide findings.
    """

    def __init__(self, check: str, node: str, rank: int | None = None) -> None:
        self.check = check
        self.node = node
        self.rank = rank
        self.findings: list[Finding] = []

    def add(
        self,
        level: str,
        text: str,
        fix: str = "",
        *,
        check: str | None = None,
        node: str | None = None,
        rank: int | None | _Keep = _KEEP,
    ) -> Findings:
        """Record one finding of ``level`` (``OK``, ``WARNING`` or ``ERROR``); returns the builder."""
        self.findings.append(
            Finding(
                check or self.check,
                level,
                self.node if node is None else node,
                self.rank if rank is _KEEP else rank,
                text,
                fix,
            )
        )
        return self

    def ok(
        self,
        text: str,
        fix: str = "",
        *,
        check: str | None = None,
        node: str | None = None,
        rank: int | None | _Keep = _KEEP,
    ) -> Findings:
        """Record that all is well (``fix`` may still hint at something optional)."""
        return self.add(OK, text, fix, check=check, node=node, rank=rank)

    def warn(
        self,
        text: str,
        fix: str = "",
        *,
        check: str | None = None,
        node: str | None = None,
        rank: int | None | _Keep = _KEEP,
    ) -> Findings:
        """Record something that works, but slowly or fragilely, and how to fix it."""
        return self.add(WARNING, text, fix, check=check, node=node, rank=rank)

    def error(
        self,
        text: str,
        fix: str = "",
        *,
        check: str | None = None,
        node: str | None = None,
        rank: int | None | _Keep = _KEEP,
    ) -> Findings:
        """Record something that breaks training, and how to fix it."""
        return self.add(ERROR, text, fix, check=check, node=node, rank=rank)

    def extend(self, findings: Sequence[Finding]) -> Findings:
        """Append findings built elsewhere."""
        self.findings.extend(findings)
        return self

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def __repr__(self) -> str:
        return f"<Findings {self.check} on {self.node}: {len(self.findings)}>"


def node_labels(facts: Sequence[Facts]) -> dict[int, str]:
    """Index in ``facts`` -> node label: the host name, or ``host/ip`` when host names collide."""
    by_host: dict[str, set[str | None]] = defaultdict(set)
    for f in facts:
        by_host[f.get("hostname") or "?"].add(f.get("node_ip"))
    labels = {}
    for i, f in enumerate(facts):
        host = f.get("hostname") or "?"
        labels[i] = host if len(by_host[host]) <= 1 else f"{host}/{f.get('node_ip')}"
    return labels
