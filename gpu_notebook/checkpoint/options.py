"""The settings of a :class:`~gpu_notebook.checkpoint.Checkpointer`, in frozen dataclasses grouped by concern (as
Ray's ``ScalingConfig``): what a save writes (:class:`SaveOptions`), when saves happen and what a save does when it
cannot go ahead (:class:`PolicyOptions`), how the ranks of a job share the saves (:class:`DistributedOptions`), how
the store is opened (:class:`StorageOptions`) and how the Checkpointer runs in this process
(:class:`RuntimeOptions`).

Every field is also a keyword of the Checkpointer, of the same name, so these two are the same Checkpointer:

>>> from gpu_notebook.checkpoint import Checkpointer, PolicyOptions, SaveOptions
>>> Checkpointer("/tmp/run1", save=SaveOptions(level=3, full_every=5), policy=PolicyOptions(every_minutes=15))  # doctest: +SKIP
>>> Checkpointer("/tmp/run1", level=3, full_every=5, every_minutes=15)                                          # doctest: +SKIP

:func:`gather` maps the keywords onto their groups (by :data:`KEYWORDS`, the one table, made from the fields). A
keyword that names no setting is a store option of an ``s3://`` store (``region_name``, credentials: they go to
:class:`~gpu_notebook.checkpoint.S3Store`, as :attr:`StorageOptions.s3` does), and a ``TypeError`` for any other
store; a setting given twice (as a keyword and in its group's dataclass, which holds every setting of its group) is
a ``TypeError`` too. Values are checked when a dataclass is made, with the ``ValueError`` the Checkpointer raises.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeAlias

from .._options import combine, near_miss
from .format.validate import MAX_CHAIN

if TYPE_CHECKING:  # pragma: no cover
    from ._preemption import PreemptionWatcher
    from .stores import Store

__all__ = [
    "SaveOptions",
    "PolicyOptions",
    "DistributedOptions",
    "StorageOptions",
    "RuntimeOptions",
    "KEYWORDS",
    "gather",
]

#: ``progress=``: None (auto), False, True, or a callable ``(label, done_bytes, total_bytes, elapsed_s)``
ProgressSetting: TypeAlias = bool | Callable[[str, int, int, float], None] | None


@dataclass(frozen=True)
class SaveOptions:
    """What a save writes: when a full base comes, how tensors are cut, packed, compressed and hashed, and which
    values may be pickled. See "Garbage collection" and "How it works" in ``docs/checkpoint.md``."""

    #: every ``full_every``-th checkpoint at the latest is a full base (sooner when deltas stop paying); at most
    #: the longest delta chain a reader accepts
    full_every: int = 10
    #: also write a full base as soon as restoring the next delta would read more than this many times the bytes
    #: of a full checkpoint (a restore reads and decodes every frame of a delta chain); with chains of one (the
    #: default) only where a delta costs more than twice a full checkpoint; with ``delta_against="previous"`` it
    #: bounds the chains. None: no such bound
    max_restore_ratio: float | None = 3.0
    #: ``"base"``: every delta is against the last full base (chains of one), and a new base is written once the
    #: last delta cost at least the average per checkpoint since the base; ``"previous"``: against the checkpoint
    #: before it (chains up to ``full_every`` long: fewer bytes, slower restores)
    delta_against: str = "base"
    #: raw chunk size in MiB: tensors are split into element-aligned chunks of this size
    chunk_mb: float = 4.0
    #: encoded frames smaller than this many KiB are packed together into objects (fewer requests, which S3
    #: charges for and which cost a round trip each); a pack is uploaded early, while the encoding goes on, once it
    #: holds 1 / (2 x threads) of what the previous save of the same kind wrote (at least 4 MiB)
    pack_kb: int = 8192
    #: the largest pack object, MiB (restores read packs with ranged GETs of at most this size)
    pack_max_mb: float = 16.0
    #: zstd level (1 is fast; 3 compresses a little better)
    level: int = 1
    #: ``"blake3"`` (format version 5) or ``"sha256"`` (version 2); None: blake3 when the package is installed
    hash: str | None = None
    #: pickle values without a safe representation (a restore then needs ``allow_pickle=True`` too); also the
    #: default of ``restore(allow_pickle=...)``
    allow_pickle: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.full_every <= MAX_CHAIN:  # a reader refuses longer delta chains (format/validate.py)
            raise ValueError(f"full_every must be between 1 and {MAX_CHAIN}, not {self.full_every!r}")
        if self.max_restore_ratio is not None and self.max_restore_ratio < 1:
            raise ValueError("max_restore_ratio must be >= 1 (or None)")
        if self.delta_against not in ("base", "previous"):
            raise ValueError("delta_against must be 'base' or 'previous'")


@dataclass(frozen=True)
class PolicyOptions:
    """When :meth:`~gpu_notebook.checkpoint.Checkpointer.maybe_save` saves, and what a save does when it cannot go
    ahead: the previous one still uploading, a failed attempt, a spot preemption notice."""

    #: :meth:`maybe_save` saves every this many steps (None: not by steps)
    every_steps: int | None = None
    #: :meth:`maybe_save` saves every this many minutes (None: not by time; 15 is the usual suggestion on spot)
    every_minutes: float | None = None
    #: what ``save()`` does while the previous save is still uploading: ``"wait"`` or ``"skip"`` (with a warning)
    on_busy: str = "wait"
    #: a failed background save is retried this many times ...
    retries: int = 3
    #: ... with exponential backoff from this many seconds
    retry_backoff_s: float = 1.0
    #: ``"auto"``: on a cloud VM, watch the metadata service for a spot preemption notice; a
    #: :class:`~gpu_notebook.checkpoint.PreemptionWatcher` to use; None: do not watch
    preemption: str | PreemptionWatcher | None = "auto"
    #: what :meth:`maybe_save` writes on a notice: ``"auto"`` (a full base if it fits in half the time left, else a
    #: delta), ``"full"`` or ``"delta"``
    on_preemption: str = "auto"

    def __post_init__(self) -> None:
        if self.on_busy not in ("wait", "skip"):
            raise ValueError("on_busy must be 'wait' or 'skip'")
        if self.on_preemption not in ("auto", "full", "delta"):
            raise ValueError("on_preemption must be 'auto', 'full' or 'delta'")


@dataclass(frozen=True)
class DistributedOptions:
    """How the ranks of a multi-rank job share the saves (see "Distributed training" in ``docs/checkpoint.md``)."""

    #: every rank saves its own shard (True), or the state is replicated and rank 0 commits it (False, right for
    #: DDP); values wrapped in :class:`~gpu_notebook.checkpoint.PerRank` are each rank's own either way
    sharded: bool = False
    #: a replicated state in a job with a process group: the ranks share the copy and the encoding of the big
    #: tensors (rank 0 still commits); False: rank 0 copies and encodes it all
    spread: bool = True
    #: save every rank's RNG states (Python, numpy, torch CPU and CUDA) in its per-rank section, which
    #: ``restore(rng=True)`` puts back; None: in a multi-rank job with a process group
    rng: bool | None = None
    #: this process's rank (None: torch.distributed's, else ``RANK``, else 0)
    rank: int | None = None
    #: the job's world size (None: torch.distributed's, else ``WORLD_SIZE``, else 1)
    world_size: int | None = None
    #: where several ranks write a save: how long rank 0 waits for the others' parts, and they for its commit,
    #: before the save fails on that rank (not retried), seconds
    commit_timeout_s: float = 600.0


@dataclass(frozen=True)
class StorageOptions:
    """How the store is opened: only to read, and the options of an ``s3://`` store."""

    #: only read the store (list, show, diff, restore): nothing is written, not even its ``FORMAT`` marker; a
    #: missing store is an error instead of being created; ``save()`` and ``gc()`` refuse. Works with read-only
    #: credentials
    read_only: bool = False
    #: an S3-compatible service's endpoint (MinIO, ...), for ``s3://`` stores; None: AWS
    endpoint_url: str | None = None
    #: the other keywords of :class:`~gpu_notebook.checkpoint.S3Store` and of its boto3 client (``region_name``,
    #: ``max_concurrency``, ``aws_access_key_id``, ...), for ``s3://`` stores; never shown (it may hold secrets)
    s3: Mapping[str, Any] = field(default_factory=dict, hash=False, metadata={"keyword": False})

    def __post_init__(self) -> None:
        object.__setattr__(self, "s3", dict(self.s3))  # a copy: the caller's dict may change later
        if self.endpoint_url is not None and "endpoint_url" in self.s3:
            raise TypeError(
                "endpoint_url is given twice: as StorageOptions.endpoint_url and in its s3 options"
            )

    def __repr__(self) -> str:
        s3 = f", s3=<{', '.join(sorted(self.s3))}>" if self.s3 else ""
        return f"StorageOptions(read_only={self.read_only!r}, endpoint_url={self.endpoint_url!r}{s3})"

    def store_keywords(self) -> dict[str, Any]:
        """The keywords :func:`~gpu_notebook.checkpoint.open_store` takes for these options."""
        ep = {} if self.endpoint_url is None else {"endpoint_url": self.endpoint_url}
        return {**ep, **self.s3}


@dataclass(frozen=True)
class RuntimeOptions:
    """How the Checkpointer runs in this process: its threads, its host memory between saves, what it shows, and
    whether it is the current one."""

    #: threads that encode and upload chunks in parallel (and decode them on a restore); None: the CPU count,
    #: between 2 and 8
    threads: int | None = None
    #: keep the last snapshot's buffers and the encoding scratch warm for the next save (a clone-sized stall for
    #: one more copy of the state); False: between saves only the deltas' base stays (1.2x)
    reuse_buffers: bool = False
    #: None: a progress line in notebooks for big transfers; False; True; or a callable
    #: ``(label, done_bytes, total_bytes, elapsed_s)``
    progress: ProgressSetting = None
    #: make this the current checkpointer (the store ``%gpu_checkpoint`` uses by default), now and at each save
    #: or restore; False: never (a checkpointer for inspecting another store)
    current: bool = True


#: the dataclass each group keyword of ``Checkpointer(...)`` takes
GROUPS: dict[str, type[Any]] = {
    "save": SaveOptions,
    "policy": PolicyOptions,
    "distributed": DistributedOptions,
    "storage": StorageOptions,
    "runtime": RuntimeOptions,
}

#: every flat keyword of ``Checkpointer(...)`` -> the group keyword whose dataclass holds that setting (the
#: keywords are the fields' names)
KEYWORDS: dict[str, str] = {
    f.name: group for group, cls in GROUPS.items() for f in fields(cls) if f.metadata.get("keyword", True)
}


@dataclass(frozen=True)
class Options:
    """Every setting of one Checkpointer, as given (the Checkpointer resolves the defaults that depend on the
    machine or the job: ``threads``, ``hash``, ``rank``, ``world_size``, ``rng``)."""

    save: SaveOptions
    policy: PolicyOptions
    distributed: DistributedOptions
    storage: StorageOptions
    runtime: RuntimeOptions


def _is_s3(store: str | os.PathLike[str] | Store) -> bool:
    return isinstance(store, str | os.PathLike) and os.fspath(store).startswith("s3://")


def _unknown(names: list[str]) -> TypeError:
    name = names[0]
    hint = near_miss([*KEYWORDS, *GROUPS], name)
    more = f" (and {', '.join(repr(n) for n in names[1:])})" if names[1:] else ""
    return TypeError(
        f"Checkpointer() got an unexpected keyword argument {name!r}{hint}{more}: its settings are the fields of "
        f"{', '.join(cls.__name__ for cls in GROUPS.values())}; other keywords are store options, which only an "
        "s3:// store takes"
    )


def gather(
    store: str | os.PathLike[str] | Store, groups: Mapping[str, Any], keywords: Mapping[str, Any]
) -> Options:
    """Every setting of ``Checkpointer(store, **groups, **keywords)``: each group's dataclass as given, else made
    from the flat ``keywords`` of its fields (the defaults for the others).

    Raises
    ------
    TypeError
        A keyword that names no setting, unless ``store`` is an ``s3://`` URL (a store option); a setting given
        both as a keyword and in its group's dataclass; a group given something other than its dataclass.
    ValueError
        A value out of range (from the dataclasses).
    """
    flat: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    given_as_keywords: dict[str, list[str]] = {group: [] for group in GROUPS}
    store_options = {name: v for name, v in keywords.items() if name not in KEYWORDS}
    for name, value in keywords.items():
        if name in KEYWORDS:
            flat[KEYWORDS[name]][name] = value
            given_as_keywords[KEYWORDS[name]].append(name)
    if store_options:
        if not _is_s3(store):
            raise _unknown(list(store_options))
        flat["storage"]["s3"] = store_options
        given_as_keywords["storage"].extend(store_options)
    made = combine("Checkpointer", GROUPS, groups, flat, given_as_keywords)
    return Options(**made)
