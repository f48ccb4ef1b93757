"""Per-rank state: what each rank of a job saves of its own beside the state the ranks share.

In replicated DDP the state is the same on every rank, so rank 0 writes it for all. Some of it is not: each
rank's random number generators, and the position of its own data loader or sampler (a
``DistributedSampler`` shard, torchdata's ``StatefulDataLoader``). Marked with :class:`PerRank` (and, in a
multi-rank job, every rank's RNG states by default), those values go into a small *per-rank section* that
every rank writes, and a restore gives each rank its own section back.

A snapshot's per-rank section is flattened like the rest of the state (tensors become leaves, everything else
JSON) and its leaves are encoded with the others under names that begin with :data:`SECTION_PREFIX` (no leaf of
the shared state can: ``flatten`` never produces a name that starts with two slashes). The commit moves them
out of the shard into the manifest's ``per_rank`` list.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ._errors import CheckpointError
from ._rng import rng_state
from .format.tree import Leaf, flatten, unflatten
from .snapshot import GROUP_BYTES, BufferPool, Snapshot

__all__ = [
    "PerRank",
    "RankSnapshot",
    "SECTION_PREFIX",
    "has_per_rank",
    "take",
    "split_section",
    "pick_section",
    "merge_section",
    "unwrap_into",
]

#: the names of a per-rank section's leaves begin with this
SECTION_PREFIX = "//rank/"

Path = list[Any]


class PerRank:
    """Marks a value of the state as this rank's own: every rank saves its own, and restores its own.

    Wrap what differs between the ranks of a replicated (DDP) job: a stateful sampler or data loader (anything
    with ``state_dict()``/``load_state_dict()``, e.g. torchdata's ``StatefulDataLoader``), a per-rank counter,
    a tensor. The rest of the state is rank 0's, as before.

    Examples
    --------
    >>> state = {"model": model, "optim": opt, "loader": PerRank(loader), "step": step}   # doctest: +SKIP
    >>> ckpt.save(state)                                                                  # doctest: +SKIP
    >>> ckpt.restore(into=state, rng=True)  # each rank: its own loader position and RNG  # doctest: +SKIP
    """

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __repr__(self) -> str:
        return f"PerRank({self.obj!r})"


class RankSnapshot(Snapshot):
    """A snapshot with this rank's per-rank section, and how its save is committed."""

    def __init__(self, tree: Any, leaves: list[Leaf], step: int, stall_s: float) -> None:
        super().__init__(tree, leaves, step, stall_s)
        self.section: Any = None  # the per-rank section's tree (its leaves are among ``leaves``), or None
        self.nonce = ""  # names this save on every rank (agreed through the process group)
        self.writers = False  # every rank writes a record of this save and rank 0 commits them together
        self.spread = False  # the ranks share the encoding of the replicated state (see ``save.spread``)


_GONE = object()


def _holds_marker(state: Any) -> bool:
    """Whether ``state`` holds a :class:`PerRank` value where :func:`_split` looks (a quick walk that builds no
    paths: a state of 10,000 tensors is walked in about 1 ms)."""
    torch = sys.modules.get("torch")
    plain = {getattr(torch, "Tensor", None), getattr(getattr(torch, "nn", None), "Parameter", None)}
    stack = [state]
    while stack:
        node = stack.pop()
        if type(node) in plain:  # (the commonest value, first: never a container of ours)
            continue
        if isinstance(node, PerRank):
            return True
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple) and not hasattr(node, "_fields"):
            stack.extend(node)
    return False


def _split(node: Any, path: Path, out: list[tuple[Path, Any]]) -> Any:
    """``node`` without its :class:`PerRank` values (``_GONE`` if it is one); they are added to ``out`` with
    their paths. Containers are copied only on the way to a marker."""
    if isinstance(node, PerRank):
        out.append((path, node.obj))
        return _GONE
    if isinstance(node, dict):
        copy: dict[Any, Any] | None = None
        for k, v in node.items():
            w = _split(v, [*path, k], out)
            if w is not v:
                copy = dict(node) if copy is None else copy
                if w is _GONE:
                    del copy[k]
                else:
                    copy[k] = w
        return node if copy is None else copy
    if isinstance(node, list | tuple) and not hasattr(node, "_fields"):
        items = [_split(v, [*path, i], out) for i, v in enumerate(node)]
        if all(w is v for w, v in zip(items, node, strict=True)):
            return node
        items = [None if w is _GONE else w for w in items]  # (positions kept: the value comes back there)
        return items if isinstance(node, list) else tuple(items)
    return node


def has_per_rank(state: Any) -> bool:
    """Whether ``state`` holds a :class:`PerRank` value."""
    return _holds_marker(state)


def _rename(node: Any, prefix: str) -> Any:
    if isinstance(node, list):
        return [_rename(v, prefix) for v in node]
    if isinstance(node, dict):
        if len(node) == 1:
            ((tag, val),) = node.items()
            if tag in ("$tensor", "$ndarray", "$pickle"):
                return {tag: prefix + val}
        return {k: _rename(v, prefix) for k, v in node.items()}
    return node


def take(
    buffers: BufferPool,
    state: Any,
    step: int,
    allow_pickle: bool,
    shared: bool,
    rng: bool,
    spread: Any = None,
) -> RankSnapshot:
    """The snapshot of ``state`` (on the training thread): its shared part (only if ``shared``: on a rank
    that writes it; with ``spread``, a ``save.spread.Spread``, only what this rank encodes of it) and this
    rank's per-rank section (its :class:`PerRank` values, and its RNG states if ``rng``)."""
    t0 = time.perf_counter()
    found: list[tuple[Path, Any]] = []
    rest = _split(state, [], found) if _holds_marker(state) else state
    tree: Any = None
    leaves: list[Leaf] = []
    if shared:
        shared_state = None if rest is _GONE else rest
        tree, leaves = flatten(
            shared_state,
            allow_pickle,
            copy=True,
            alloc=buffers.alloc,
            group_bytes=GROUP_BYTES,
            spread=spread,
        )
    section_tree = None
    if found or rng:
        section: dict[str, Any] = {"values": [[p, v] for p, v in found]}
        if rng:
            section["rng"] = rng_state()
        stree, sleaves = flatten(section, allow_pickle, copy=True, alloc=buffers.alloc)
        for leaf in sleaves:
            leaf.name = SECTION_PREFIX + leaf.name
        section_tree = _rename(stree, SECTION_PREFIX)
        leaves = leaves + sleaves
    snap = RankSnapshot(tree, leaves, step, time.perf_counter() - t0)
    snap.section = section_tree
    return snap


def split_section(shard: dict[str, Any], snap: Snapshot) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A shard as the encoder wrote it, and its per-rank section: the section's leaves moved out of it."""
    section = getattr(snap, "section", None)
    if section is None:
        return shard, None
    leaves = shard["leaves"]
    own = {n: lf for n, lf in leaves.items() if n.startswith(SECTION_PREFIX)}
    rest = {n: lf for n, lf in leaves.items() if not n.startswith(SECTION_PREFIX)}
    return {**shard, "leaves": rest}, {"rank": shard["rank"], "tree": section, "leaves": own}


# ---------------------------------------------------------------------------------------------- restore
def _user_keys(section: dict[str, Any]) -> list[str]:
    """The paths of a section's :class:`PerRank` values, for messages."""
    vals = unflatten(_strip_leaves(section["tree"]), {}).get("values", [])
    return ["/".join(str(k) for k in p) or "<root>" for p, _ in vals]


def _strip_leaves(node: Any) -> Any:
    """A tree with its leaf references replaced by None (to read its plain values without decoding)."""
    if isinstance(node, list):
        return [_strip_leaves(v) for v in node]
    if isinstance(node, dict):
        if len(node) == 1 and next(iter(node)) in ("$tensor", "$ndarray", "$pickle"):
            return None
        return {k: _strip_leaves(v) for k, v in node.items()}
    return node


def pick_section(
    doc: dict[str, Any], rank: int, world_size: int, per_rank: str | int, rng: bool
) -> dict[str, Any] | None:
    """The per-rank section ``rank`` restores, or None.

    ``per_rank``: ``"strict"`` (this rank's own; on another world size an error when the sections hold
    :class:`PerRank` values or ``rng`` is asked for; sections of RNG states alone are then left out),
    ``"drop"`` (none), or a saved rank (that rank's, whatever this rank is).
    """
    sections = doc.get("per_rank") or []
    if per_rank == "drop":
        return None
    if isinstance(per_rank, bool) or not (isinstance(per_rank, int) or per_rank == "strict"):
        raise ValueError(f"per_rank must be 'strict', 'drop' or a saved rank, not {per_rank!r}")
    if not sections:
        if rng or isinstance(per_rank, int):
            raise CheckpointError(
                f"checkpoint {doc['id']} has no per-rank sections (no RNG states or PerRank values were saved)"
            )
        return None
    want = per_rank if isinstance(per_rank, int) else rank
    saved_ws = int(doc.get("world_size", 1))
    if per_rank == "strict" and saved_ws != world_size:
        keys = sorted({k for s in sections for k in _user_keys(s)})
        if not keys and not rng:
            return None  # only RNG states, not asked for: nothing of the state is lost
        what = f"PerRank values ({', '.join(keys)})" if keys else "RNG states"
        raise CheckpointError(
            f"checkpoint {doc['id']} holds the per-rank {what} of {saved_ws} rank(s), and this job has "
            f"{world_size}: pass restore(per_rank='drop') to restore the shared state without them, or "
            f"per_rank=<saved rank> to take one saved rank's"
        )
    for s in sections:
        if s.get("rank") == want:
            return dict(s)
    raise CheckpointError(
        f"checkpoint {doc['id']} has no per-rank section of rank {want} "
        f"(it has those of ranks {sorted(s.get('rank') for s in sections)})"
    )


def merge_section(state: Any, section: dict[str, Any], values: dict[str, Any]) -> tuple[Any, Any]:
    """``state`` with the section's :class:`PerRank` values put back where they were; and the section's RNG
    states (None if it has none)."""
    sec = unflatten(section["tree"], values)
    for path, v in sec.get("values", []):
        state = _put(state, list(path), v)
    return state, sec.get("rng")


def _put(node: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(node, dict):
        node[k] = _put(node.get(k), rest, value)
        return node
    if isinstance(node, list) and isinstance(k, int) and k < len(node):
        node[k] = _put(node[k], rest, value)
        return node
    if isinstance(node, tuple) and isinstance(k, int) and k < len(node):
        return tuple(_put(v, rest, value) if i == k else v for i, v in enumerate(node))
    if node is None:
        return {k: _put(None, rest, value)}
    raise CheckpointError(f"cannot put a per-rank value back at {'/'.join(map(str, path))}")


def unwrap_into(into: Any, keep: bool) -> Any:
    """``into`` with its :class:`PerRank` wrappers taken off (``keep``), or those entries left out."""
    found: list[tuple[Path, Any]] = []
    rest = _split(into, [], found)
    if not keep:
        return None if rest is _GONE else rest
    for path, obj in found:
        rest = _put(None if rest is _GONE else rest, path, obj)
    return rest
