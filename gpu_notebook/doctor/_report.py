"""Findings and the doctor's report: data, an HTML table with level colours, and a plain-text fallback."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypedDict, cast

from ._shapes import Facts

__all__ = ["OK", "WARNING", "ERROR", "LEVELS", "Finding", "DoctorReport"]

OK = "OK"
WARNING = "warning"
ERROR = "error"
LEVELS = (OK, WARNING, ERROR)
_ORDER = {ERROR: 0, WARNING: 1, OK: 2}
_COLOURS = {OK: "#1a7f37", WARNING: "#9a6700", ERROR: "#cf222e"}
_BACKGROUNDS = {OK: "#dafbe1", WARNING: "#fff8c5", ERROR: "#ffebe9"}


class FindingDict(TypedDict):
    """A :class:`Finding` as a plain dict (:meth:`Finding.to_dict`)."""

    check: str
    level: str  # one of LEVELS
    node: str
    rank: int | None
    message: str
    fix: str


@dataclass(frozen=True)
class Finding:
    """One result of one check.

    Attributes
    ----------
    check
        Short name of the check, e.g. ``"cuda-driver"``, ``"gpu-arch"``, ``"versions"``.
    level
        ``"OK"``, ``"warning"`` or ``"error"``.
    node
        Node label (host name or IP); ``"*"`` for cross-node findings.
    rank
        Global rank the finding is about, or ``None`` for a node-wide or cluster-wide finding.
    message
        What was found, one line.
    fix
        One-line fix; empty when nothing needs doing.
    """

    check: str
    level: str
    node: str
    rank: int | None
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, not {self.level!r}")

    def to_dict(self) -> FindingDict:
        """The finding as a plain dict."""
        return cast("FindingDict", asdict(self))


def _rank_label(ranks: Sequence[int | None]) -> str:
    real = sorted({r for r in ranks if r is not None})
    if not real:
        return "-"
    parts: list[str] = []
    start = prev = real[0]
    for r in real[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def _nodes_label(nodes: list[str], total: int) -> str:
    if len(nodes) > 1 and len(nodes) == total:
        return f"all {total} nodes"
    if len(nodes) > 3:
        return ", ".join(nodes[:3]) + f" +{len(nodes) - 3} more"
    return ", ".join(nodes)


@dataclass
class DoctorReport:
    """What ``diagnose`` found: ``.findings`` as data, shown as a coloured table in a notebook.

    Identical findings of several ranks on one node are shown as one row naming the ranks; ``.findings``
    keeps them all.
    """

    findings: list[Finding]
    facts: list[Facts] = field(default_factory=list)
    title: str = "gpu_notebook doctor"

    @property
    def errors(self) -> list[Finding]:
        """Findings of level error."""
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        """Findings of level warning."""
        return [f for f in self.findings if f.level == WARNING]

    @property
    def ok(self) -> bool:
        """True when nothing is an error."""
        return not self.errors

    def by_check(self, check: str) -> list[Finding]:
        """All findings of one check."""
        return [f for f in self.findings if f.check == check]

    def to_dicts(self) -> list[FindingDict]:
        """The findings as a list of plain dicts (e.g. for ``pandas.DataFrame``)."""
        return [f.to_dict() for f in self.findings]

    def rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """Display rows ``(level, check, nodes, ranks, message, fix)``, errors first.

        Identical findings (same level, check, message and fix) from several ranks or nodes become one row
        naming them all.
        """
        merged: dict[tuple[str, str, str, str], tuple[list[str], list[int | None]]] = {}
        for f in self.findings:
            nodes, ranks = merged.setdefault((f.level, f.check, f.message, f.fix), ([], []))
            if f.node not in nodes:
                nodes.append(f.node)
            ranks.append(f.rank)
        all_nodes = {f.node for f in self.findings if f.node != "*"}
        out = [
            (level, check, _nodes_label(nodes, len(all_nodes)), _rank_label(ranks), message, fix)
            for (level, check, message, fix), (nodes, ranks) in merged.items()
        ]
        order = {k: i for i, k in enumerate(dict.fromkeys(f.check for f in self.findings))}
        out.sort(key=lambda r: (_ORDER[r[0]], order[r[1]]))
        return out

    def summary(self) -> str:
        """``"2 errors, 1 warning, 14 OK"``."""
        n_err, n_warn = len(self.errors), len(self.warnings)
        n_ok = len(self.findings) - n_err - n_warn
        return f"{n_err} error{'s' * (n_err != 1)}, {n_warn} warning{'s' * (n_warn != 1)}, {n_ok} OK"

    def text(self) -> str:
        """Plain-text table."""
        rows = self.rows()
        header = ("level", "check", "node", "ranks", "message")
        widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(4)]
        lines = [f"{self.title}: {self.summary()}"]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header[:4], widths, strict=True)) + "  message")
        for level, check, node, ranks, message, fix in rows:
            cells = (level.upper() if level != OK else OK, check, node, ranks)
            lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + "  " + message)
            if fix:
                lines.append(" " * (sum(widths) + 8) + "  fix: " + fix)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<DoctorReport {self.summary()}>"

    def _repr_html_(self) -> str:
        esc = html.escape
        cell = "padding:2px 8px;text-align:left;vertical-align:top;border-bottom:1px solid #ddd"
        nowrap = cell + ";white-space:nowrap"
        head = "".join(
            f"<th style='{cell}'>{h}</th>" for h in ("level", "check", "node", "ranks", "message", "fix")
        )

        def table(rows: list[tuple[str, str, str, str, str, str]]) -> str:
            body = []
            for level, check, node, ranks, message, fix in rows:
                badge = (
                    f"<span style='color:{_COLOURS[level]};background:{_BACKGROUNDS[level]};"
                    f"padding:0 6px;border-radius:4px;font-weight:600'>{esc(level)}</span>"
                )
                body.append(
                    f"<tr class='gnb-doctor-{level.lower()}'><td style='{cell}'>{badge}</td>"
                    f"<td style='{nowrap}'><code>{esc(check)}</code></td><td style='{nowrap}'>{esc(node)}</td>"
                    f"<td style='{nowrap}'>{esc(ranks)}</td><td style='{cell}'>{esc(message)}</td>"
                    f"<td style='{cell}'><code>{esc(fix)}</code></td></tr>"
                )
            return (
                f"<table style='border-collapse:collapse;font-size:90%'><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(body)}</tbody></table>"
            )

        rows = self.rows()
        problems = [r for r in rows if r[0] != OK]
        fine = [r for r in rows if r[0] == OK]
        parts = [f"<div class='gnb-doctor'><b>{esc(self.title)}</b>: {esc(self.summary())}"]
        if problems:
            parts.append(table(problems))
        if fine:
            opened = "" if problems else " open"
            parts.append(
                f"<details{opened}><summary>{len(fine)} OK row{'s' * (len(fine) != 1)}</summary>"
                f"{table(fine)}</details>"
            )
        parts.append("</div>")
        return "".join(parts)

    @classmethod
    def merge(cls, reports: Iterable[DoctorReport], title: str | None = None) -> DoctorReport:
        """One report from several."""
        reports = list(reports)
        findings = [f for r in reports for f in r.findings]
        facts = [x for r in reports for x in r.facts]
        return cls(findings, facts, title or (reports[0].title if reports else "gpu_notebook doctor"))
