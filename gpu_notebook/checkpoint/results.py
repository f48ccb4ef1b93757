"""What the inspection and clean-up methods of a :class:`Checkpointer` return: dataclasses with a readable
``repr`` (what ``%gpu_checkpoint show|diff|gc`` prints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._display import fmt_bytes
from .format.manifest import CheckpointInfo

__all__ = ["GcResult", "DiffResult", "ShowResult"]


@dataclass
class GcResult:
    """What :meth:`Checkpointer.gc` removed (or, in a dry run, would remove)."""

    kept: list[str]  # ids of the checkpoints kept
    manifests: list[str] = field(default_factory=list)  # ids of the checkpoints deleted
    objects: list[str] = field(default_factory=list)  # keys of the objects deleted
    bytes: int = 0  # their size
    leases: int = 0  # live leases of saves in flight (in any process) whose objects were kept
    young: int = 0  # unreferenced objects kept because they are younger than the grace period
    young_bytes: int = 0  # their size
    grace_s: float = 0.0  # the grace period

    def _kept_text(self, keep: str = "kept") -> str:
        busy = f"; {self.leases} save(s) in flight {keep} what they reuse" if self.leases else ""
        if self.young:
            busy += (
                f"; {self.young} unreferenced object(s) ({fmt_bytes(self.young_bytes, unit='MB')}) younger than the grace "
                f"period ({self.grace_s:g} s) kept, in case a save in flight wrote them (a later gc deletes "
                "them; --grace 0 now, if no save is running on this store)"
            )
        return busy

    def __repr__(self) -> str:
        return (
            f"gc: kept {len(self.kept)} checkpoint(s), deleted {len(self.manifests)} checkpoint(s) and "
            f"{len(self.objects)} object(s), freed {fmt_bytes(self.bytes, unit='MB')}{self._kept_text()}"
        )

    def dry_run_text(self) -> str:
        """What a dry run found, said as what gc would do (nothing was deleted)."""
        return (
            f"gc (dry run, nothing deleted): would keep {len(self.kept)} checkpoint(s), would delete "
            f"{len(self.manifests)} checkpoint(s) and {len(self.objects)} object(s), would free "
            f"{fmt_bytes(self.bytes, unit='MB')}{self._kept_text('keep')}"
        )


@dataclass
class DiffResult:
    """What differs between two checkpoints (see :meth:`Checkpointer.diff`)."""

    a: str  # the two checkpoint ids
    b: str
    changed: dict[str, dict[str, int]]  # tensor -> {"chunks": n, "chunks_changed": m}
    unchanged: list[str]
    added: list[str]
    removed: list[str]
    values: dict[str, tuple[Any, Any]]  # path of a plain value -> (in a, in b)

    def __repr__(self) -> str:
        lines = [f"diff {self.a} -> {self.b}:"]
        lines.append(
            f"  tensors: {len(self.changed)} changed, {len(self.unchanged)} unchanged, "
            f"{len(self.added)} added, {len(self.removed)} removed"
        )
        for name, info in list(self.changed.items())[:30]:
            lines.append(f"  ~ {name}: {info['chunks_changed']}/{info['chunks']} chunk(s) changed")
        for name in self.added[:10]:
            lines.append(f"  + {name}")
        for name in self.removed[:10]:
            lines.append(f"  - {name}")
        for path, (va, vb) in list(self.values.items())[:30]:
            lines.append(f"  {path}: {va!r} -> {vb!r}")
        return "\n".join(lines)


@dataclass
class ShowResult:
    """One checkpoint in detail (see :meth:`Checkpointer.show`)."""

    info: CheckpointInfo
    restore: dict[str, int]  # what a restore reads: "bytes", "objects", "max_depth" (of the delta chains)
    stats: dict[str, Any]  # the manifest's stats (raw/new/reused bytes, stall and persist seconds)
    writer: dict[str, Any]  # the code that wrote it
    #: tensor -> dtype, shape, nbytes, stored (bytes), chunks, transforms ({name: count}), max_depth
    tensors: dict[str, dict[str, Any]]

    def __repr__(self) -> str:
        info, st, w = self.info, self.stats, self.writer
        lines = [
            repr(info),
            f"  parent={info.parent} world_size={info.world_size} writer={w.get('lib')} "
            f"{w.get('version', '')} host={w.get('host', '')}",
            f"  snapshot stall {st.get('stall_s', 0):.3f} s, persist {st.get('persist_s', 0):.3f} s, "
            f"CPU {st.get('cpu_s', 0):.3f} s, {st.get('new_objects', 0)} new object(s)",
        ]
        ranks = st.get("ranks") or []
        if len(ranks) > 1:  # several ranks wrote it: what each one's part took from it
            lines.append(
                "  per rank: "
                + "; ".join(
                    f"{r.get('rank')}: {fmt_bytes(int(r.get('raw_bytes', 0)))}, stall {r.get('stall_s', 0):.3f} s, "
                    f"CPU {r.get('cpu_s', 0):.3f} s"
                    for r in ranks
                )
            )
        rs = self.restore
        if rs:
            raw = max(1, int(st.get("raw_bytes", 0)))
            lines.append(
                f"  a restore reads {fmt_bytes(rs['bytes'])} ({rs['bytes'] / raw:.2f}x the state) from {rs['objects']} "
                f"object(s): delta chains up to {rs['max_depth']} deep (bounded by full_every and max_restore_ratio)"
            )
        for name, t in list(self.tensors.items())[:50]:
            tr = ",".join(f"{k}:{v}" for k, v in t["transforms"].items())
            lines.append(
                f"  {name:40s} {t['dtype']:9s} {str(t['shape']):18s} {t['nbytes']:>11d} B -> "
                f"{t['stored']:>11d} B  [{tr}] depth {t['max_depth']}"
            )
        if len(self.tensors) > 50:
            lines.append(f"  ... {len(self.tensors) - 50} more tensors")
        return "\n".join(lines)
