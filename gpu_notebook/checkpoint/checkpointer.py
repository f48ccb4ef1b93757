"""The :class:`Checkpointer`: snapshot on the training thread, encode and upload in the background.

The class is the public face of the package; the work is done by its parts: ``snapshot`` (the host copy a
save takes on the training thread), ``save`` (the background pipeline: plan, encode,
commit), ``restore`` (decode, and load ``into=`` objects), ``inspect`` and ``gc`` (reading and cleaning a
store), ``policy`` (when :meth:`maybe_save` saves, spot preemption included), ``format`` (the bytes) and
``stores`` (where they go). One save is in flight at most.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_notebook import _registry

from ._errors import CheckpointError, CheckpointSaveError, NoCheckpointError
from ._export import ExportResult, export_state
from ._group import agree_min, join_session, rank_world
from ._progress import Progress
from .format.codec import notice_fallback
from .format.manifest import (
    CheckpointInfo,
    CheckpointList,
    blake3_available,
    hash_fn,
    open_format,
)
from .gc import collect
from .inspect import Inspector
from .options import (
    DistributedOptions,
    PolicyOptions,
    RuntimeOptions,
    SaveOptions,
    StorageOptions,
    gather,
)
from .per_rank import has_per_rank
from .policy import Preemption, due
from .reader import FORMAT_VERSION
from .restore.flow import restore_checkpoint
from .results import DiffResult, GcResult, ShowResult
from .save.commit import Committer
from .save.handle import SaveHandle
from .save.lease import hold_lease
from .save.lineage import Lineage
from .save.order import CommitOrder
from .save.persist import PersistOptions, persist, persist_with_retries
from .save.spread import Spread
from .save.start import SaveStart, start_save
from .snapshot import BufferPool, Snapshot, release_memory
from .stores import Store, open_store

if TYPE_CHECKING:  # pragma: no cover
    from ._preemption import PreemptionNotice

__all__ = ["Checkpointer", "SaveHandle", "current"]

#: what a save's :class:`PersistOptions` takes from the Checkpointer's attributes of the same names
_SAVE_SETTINGS = "full_every max_restore_ratio chunk_bytes pack_bytes pack_max level threads".split()

log = logging.getLogger("gpu_notebook.checkpoint")


def current() -> Checkpointer | None:
    """The most recently created (or used) :class:`Checkpointer` in this process, or None.

    It is kept in :mod:`gpu_notebook._registry` (held weakly), where a budget stop finds it without importing
    this package.
    """
    found = _registry.active_checkpointer()
    return found if isinstance(found, Checkpointer) else None


class Checkpointer:
    """Lossless delta checkpoints of training state into a local folder or S3.

    Parameters
    ----------
    store
        A folder path (``file://`` optional), ``s3://bucket/prefix``, or a :class:`Store`.
    save
        What a save writes (:class:`SaveOptions`): ``full_every``, ``max_restore_ratio``, ``delta_against``,
        ``chunk_mb``, ``pack_kb``, ``pack_max_mb``, ``level``, ``hash``, ``allow_pickle``.
    policy
        When :meth:`maybe_save` saves and what a save does when it cannot go ahead (:class:`PolicyOptions`):
        ``every_steps``, ``every_minutes``, ``on_busy``, ``retries``, ``retry_backoff_s``, ``preemption``,
        ``on_preemption``.
    distributed
        How the ranks of a job share the saves (:class:`DistributedOptions`): ``sharded``, ``spread``, ``rng``,
        ``rank``, ``world_size``, ``commit_timeout_s``.
    storage
        How the store is opened (:class:`StorageOptions`): ``read_only``, ``endpoint_url``, and ``s3``, the other
        options of an ``s3://`` store (passed to :class:`S3Store`: ``region_name``, credentials, ...).
    runtime
        How it runs in this process (:class:`RuntimeOptions`): ``threads``, ``reuse_buffers``, ``progress``,
        ``current``.
    **keywords
        Each setting of those dataclasses by its field's name, instead of its group's dataclass
        (``Checkpointer(path, level=3)`` is ``Checkpointer(path, save=SaveOptions(level=3))``); other keywords are
        options of an ``s3://`` store (``StorageOptions.s3``). A keyword that is neither, or a setting given both
        as a keyword and in its group's dataclass, raises ``TypeError``.

    Examples
    --------
    >>> ckpt = Checkpointer("/tmp/run1", every_steps=100)          # doctest: +SKIP
    >>> ckpt = Checkpointer("s3://bucket/run1", save=SaveOptions(level=3, full_every=20),
    ...                     policy=PolicyOptions(every_minutes=15, on_busy="skip"))  # doctest: +SKIP
    >>> ckpt.maybe_save({"model": model, "optim": opt, "step": step}, step)  # doctest: +SKIP
    >>> state = ckpt.restore(into={"model": model, "optim": opt})  # doctest: +SKIP
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | Store,
        *,
        save: SaveOptions | None = None,
        policy: PolicyOptions | None = None,
        distributed: DistributedOptions | None = None,
        storage: StorageOptions | None = None,
        runtime: RuntimeOptions | None = None,
        **keywords: Any,
    ) -> None:
        # every setting, checked (ValueError, TypeError) before the store is opened
        groups = {
            "save": save,
            "policy": policy,
            "distributed": distributed,
            "storage": storage,
            "runtime": runtime,
        }
        self._options = options = gather(store, groups, keywords)
        s, p, d, r = options.save, options.policy, options.distributed, options.runtime
        # format version 5 hashes with BLAKE3; without the blake3 package this writes version 2 (SHA-256)
        self.hash = s.hash or ("blake3" if blake3_available() else "sha256")
        self._h = hash_fn(self.hash)
        self._version = FORMAT_VERSION if self.hash == "blake3" else 2
        self.store: Store = open_store(store, **options.storage.store_keywords())
        self.read_only = bool(options.storage.read_only)
        self.full_every = int(s.full_every)
        self.max_restore_ratio = None if s.max_restore_ratio is None else float(s.max_restore_ratio)
        self.chunk_bytes = max(8, int(s.chunk_mb * 2**20) // 8 * 8)
        self.pack_bytes = int(s.pack_kb * 1024)
        self.pack_max = int(s.pack_max_mb * 2**20)
        self.level = int(s.level)
        self.on_busy = p.on_busy
        self.every_steps = p.every_steps
        self.every_minutes = p.every_minutes
        self.retries = int(p.retries)
        self.retry_backoff_s = float(p.retry_backoff_s)
        self.threads = r.threads or max(2, min(8, os.cpu_count() or 2))
        self.allow_pickle = s.allow_pickle
        self.progress = r.progress
        self.commit_timeout_s = d.commit_timeout_s
        self.rank, self.world_size, dist_ok = rank_world(d.rank, d.world_size)
        self.sharded = bool(d.sharded) and self.world_size > 1
        # (by default only with a process group: without one the ranks cannot name a save together)
        self.rng = self.world_size > 1 and dist_ok if d.rng is None else bool(d.rng)
        # a replicated state's saves shared out between the ranks (they agree on each save through the group)
        self.spread = bool(d.spread) and self.world_size > 1 and not self.sharded and dist_ok
        self._spread = Spread(self.rank, self.world_size)  # which rank encodes each big tensor
        self._token = join_session(self.world_size, dist_ok, self.rank, self.store, not self.read_only)
        self._seq = 0  # saves started (it ages the encoding hints)
        self._order = CommitOrder(self.store, self._version)  # the place of the next commit, and its parent
        self._auto_step: int | None = None  # the next step of a save given none (after the store's newest)
        self._lock = threading.Lock()
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnb-ckpt-save")
        self._tidy: cf.Future[None] | None = None  # the last save's memory release (see _release_memory)
        self._pool = cf.ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="gnb-ckpt-io")
        # uploads on their own threads (I/O bound): the encoding threads (CPU bound) go on meanwhile
        uploaders = max(self.threads, int(getattr(self.store, "max_concurrency", 0) or 0))
        self._uploads = cf.ThreadPoolExecutor(max_workers=uploaders, thread_name_prefix="gnb-ckpt-upload")
        self._inflight: SaveHandle | None = None
        self._errors: list[BaseException] = []
        self.failures: list[tuple[str | None, str]] = []  # (id, message) of every save that failed for good
        self._buffers = BufferPool(reuse=bool(r.reuse_buffers))
        self._lineage = Lineage(s.delta_against)  # what the next delta is computed against
        self._last_save_step: int | None = None
        self._last_save_time: float | None = None
        self._created = time.time()  # the every_minutes clock starts here
        # spot preemption: a watcher of the metadata service; maybe_save() saves at once on a notice
        self._preemption = Preemption(
            None if self.read_only else p.preemption, p.on_preemption, self.world_size
        )
        self._inspect = Inspector(self.store, self.threads)
        self.last_info: CheckpointInfo | None = None
        open_format(self.store, self._version, read_only=self.read_only, write_marker=self.rank == 0)
        self._current = bool(r.current)  # saves and restores make it current again, unless False
        if r.current:
            _registry.set_active_checkpointer(self)

    def __repr__(self) -> str:
        last = f" last={self.last_info.id}" if self.last_info else ""
        ranks = f" rank={self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return f"<Checkpointer {self.store.url}{ranks}{last}>"

    def _repr_html_(self) -> str:
        import html

        return f"<b>Checkpointer</b> {html.escape(repr(self))}"

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, wait: bool = True) -> None:
        """Wait for the save in flight (if ``wait``) and stop the background threads."""
        self._preemption.stop()
        try:
            if wait:
                self.wait()
        finally:
            for pool in (self._executor, self._pool, self._uploads):
                pool.shutdown(wait=wait, cancel_futures=not wait)

    # ------------------------------------------------------------------ save
    def _raise_pending(self) -> None:
        with self._lock:
            errs, self._errors = self._errors, []
        if errs:
            raise CheckpointSaveError(f"background checkpoint save failed: {errs[-1]}") from errs[-1]

    def save(
        self, state: Any, step: int | None = None, *, block: bool = False, full: bool | None = None
    ) -> SaveHandle:
        """Snapshot ``state`` now and write it in the background.

        Parameters
        ----------
        state
            Usually a dict such as ``{"model": model, "optim": optimizer, "step": step}``.
        step
            Training step; defaults to ``state["step"]`` if it is an int, else one after the restored checkpoint's
            step or the newest commit's (then counting up): a resumed run's checkpoints come after its resume point.
        block
            Wait until the checkpoint is committed.
        full
            True: write a full base now (no delta), whatever ``full_every`` says; None: as ``full_every`` says.

        Returns
        -------
        SaveHandle
            ``.result()`` waits and gives the :class:`CheckpointInfo`.

        Raises
        ------
        CheckpointSaveError
            An earlier background save failed for good (raised once, here or from :meth:`wait`).
        """
        self._check_writable("save")
        notice_fallback()  # once per process: without the C kernels saves and restores are slower
        if self._current:
            _registry.set_active_checkpointer(self)
        self._raise_pending()
        # several ranks write this save: a sharded one, a spread one, or a replicated one with per-rank sections
        multi = self.world_size > 1 and (self.sharded or self.rng or self.spread or has_per_rank(state))
        if step is None:
            s = state.get("step") if isinstance(state, dict) else None
            step = int(s) if isinstance(s, int | np.integer) else self._next_auto_step(multi)
        step = int(step)
        if self._auto_step is not None:
            self._auto_step = max(self._auto_step, step + 1)
        if step < 0:
            raise ValueError("step must be >= 0")
        if self.world_size > 1 and not multi and self.rank != 0:
            # replicated state, nothing per rank: rank 0 writes it; other ranks only keep the policy clock in step
            self._last_save_step, self._last_save_time = step, time.time()
            return SaveHandle(None, step, None)
        prev = self._inflight
        busy = prev is not None and not prev.done()
        if multi and self.on_busy == "skip":
            # every rank skips, or none does: a part missing from a checkpoint would stall its commit
            agreed = agree_min(0 if busy else 1)
            busy = busy if agreed is None else agreed == 0
        if busy:
            if self.on_busy == "skip":
                log.warning("checkpoint at step %s skipped: the previous save is still uploading", step)
                return SaveHandle(None, step, None, skipped=True)
            self._wait_inflight()
            self._raise_pending()
        snap, ckpt_id = start_save(self._start(), state, step, full, multi)
        # the progress line is shown here, on the caller's thread (in a notebook: under the cell that saved),
        # and updated in place from the background; shown first from there, it could land under another cell
        snap.progress = Progress(f"checkpoint {ckpt_id}", snap.nbytes, self.progress)
        self._seq += 1
        self._last_save_step, self._last_save_time = step, time.time()
        handle = SaveHandle(ckpt_id, step, self._executor.submit(self._persist, [snap], ckpt_id))
        del snap  # (the job takes it from the list: freed when the save ends, not when the pool lets go)
        self._inflight = handle
        if block:
            self.wait()
        return handle

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise CheckpointError(
                f"cannot {what}: this Checkpointer of {self.store.url} was opened read_only=True"
            )

    def _next_auto_step(self, multi: bool) -> int:
        """The step of a save given none: one after the newest commit's step (so that a run resumed in a new
        process goes on after its checkpoints instead of starting again at 0 below them), then counting up."""
        if self._auto_step is None:
            newest = self._inspect.latest()
            self._auto_step = 0 if newest is None else newest.step + 1
        step = self._auto_step
        if multi:  # every rank must save under the same step
            agreed = agree_min(-step)
            step = step if agreed is None else -agreed
        return step

    def _start(self) -> SaveStart:
        """What the start of the next save reads (the settings as they are now, and the state saves carry on)."""
        return SaveStart(
            full_every=self.full_every,
            max_restore_ratio=self.max_restore_ratio,
            allow_pickle=self.allow_pickle,
            rank=self.rank,
            sharded=self.sharded,
            rng=self.rng,
            spread=self.spread,
            token=self._token,
            order=self._order,
            lineage=self._lineage,
            buffers=self._buffers,
            spreader=self._spread,
        )

    def _save_options(self) -> PersistOptions:
        committer = Committer(
            self.store, self._version, self.rank, self.world_size, self.sharded, self.commit_timeout_s
        )
        committer.order = self._order
        return PersistOptions(
            store=self.store,
            hash_fn=self._h,
            progress=self.progress,
            committer=committer,
            uploads=self._uploads,
            **{name: getattr(self, name) for name in _SAVE_SETTINGS},
        )

    def _later(self, task: Callable[[], None]) -> cf.Future[None] | None:
        try:
            return self._executor.submit(task)
        except RuntimeError:  # closed meanwhile
            return None

    def _persist(self, box: list[Snapshot], ckpt_id: str) -> CheckpointInfo | None:
        """The background job of one save: persist it (with retries); record a failure for good. Then (a task of
        its own, which wait() waits for) the memory it freed goes back to the system, unless ``reuse_buffers``."""
        snap = box.pop()
        opts = self._save_options()

        def once() -> CheckpointInfo | None:
            lineage = self._lineage
            with hold_lease(self.store, ckpt_id, self.rank, lineage):  # a gc elsewhere keeps what it reuses
                info = persist(
                    snap, ckpt_id, opts, lineage, self._buffers, self._pool, self._seq, self._later
                )
            self.last_info = info
            return info

        # (each attempt is one of every rank writing this save; a failed one is told to the others)
        attempt = opts.committer.attempts(snap, ckpt_id, once)
        info, err = persist_with_retries(attempt, ckpt_id, self.retries, self.retry_backoff_s)
        if err is None:
            self._tidy = None if self._buffers.reuse else self._later(release_memory)
            return info
        msg = (
            f"checkpoint {ckpt_id} (step {snap.step}) was NOT saved after {self.retries + 1} attempts: {err}"
        )
        log.error(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=1)
        with self._lock:
            self._errors.append(err)
            self.failures.append((ckpt_id, msg))
        raise CheckpointSaveError(msg) from err

    def maybe_save(self, state: Any, step: int, *, force: bool = False) -> SaveHandle | None:
        """Save if the policy (``every_steps`` / ``every_minutes``) says it is time; else return None.

        On a spot preemption notice (see ``preemption``) it saves at once, whatever the policy, and waits until
        the checkpoint is committed: a full base when the measured save speed says one fits in half the time
        left (the checkpoint a resume restores is then a single base), else a delta. After that it saves no
        more; :attr:`preempted` tells the training loop to stop. In a multi-rank job every rank must call it at
        the same steps (a notice on any node is agreed on with one small all-reduce per call).
        """
        pre = self._preemption
        notice = pre.agreed_notice()
        if notice is not None:
            if pre.saved:
                return None
            full = pre.full_save(notice, self._lineage.rates.get(True), self._lineage.last_raw)
            t0 = time.perf_counter()
            # the save in flight is waited for whatever on_busy says: this save must not be skipped
            self._wait_inflight()
            handle = self.save(state, step, full=full, block=True)
            pre.saved = True  # (not before: a save that raised saved nothing, the next call tries again)
            log.warning(
                "preemption notice (%s): saved a %s checkpoint at step %s in %.1f s",
                notice,
                "full" if full else "delta",
                step,
                time.perf_counter() - t0,
            )
            return handle
        is_due = force or due(
            step,
            self.every_steps,
            self.every_minutes,
            self._last_save_step,
            self._last_save_time,
            self._created,
        )
        if self.world_size > 1 and self.every_minutes is not None and not force:
            # a clock decides: the ranks could disagree by a hair; any rank due makes every rank save
            agreed = agree_min(0 if is_due else 1)
            is_due = is_due if agreed is None else agreed == 0
        return self.save(state, step) if is_due else None

    @property
    def on_preemption(self) -> str:
        """What :meth:`maybe_save` writes on a preemption notice: ``"auto"``, ``"full"`` or ``"delta"``."""
        return self._preemption.on_preemption

    @on_preemption.setter
    def on_preemption(self, value: str) -> None:
        self._preemption.on_preemption = value

    @property
    def preempted(self) -> PreemptionNotice | None:
        """The :class:`PreemptionNotice` once this machine (or, in a job, any rank's) got one, else None."""
        return self._preemption.notice

    def _wait_inflight(self) -> None:
        """Wait for the save in flight to end (its failure is recorded by the job and raised by the next save)."""
        if self._inflight is not None:
            self._inflight.wait_quietly()

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Wait for the save in flight; raise :class:`CheckpointSaveError` if a save failed for good."""
        h = self._inflight
        if h is not None and h._future is not None:
            if not cf.wait([h._future], timeout)[0]:
                raise cf.TimeoutError()
            # the release of the memory the save freed (set by its job before the handle resolved)
            tidy = self._tidy
            if tidy is not None and not cf.wait([tidy], timeout)[0]:
                raise cf.TimeoutError()
        self._raise_pending()
        return self.last_info

    # ------------------------------------------------------------------ query
    @property
    def unreadable(self) -> list[tuple[str, CheckpointError]]:
        """(id, error) of each manifest the last :meth:`list` could not read."""
        return self._inspect.unreadable

    def list(self) -> CheckpointList:
        """All committed checkpoints in commit order, oldest first, each with its ``branch`` ("live": the newest
        commit and those it continues; "abandoned": a branch training was rewound from)."""
        return self._inspect.list()

    def latest(self) -> CheckpointInfo | None:
        """The newest commit (what a resume restores), or None if the store is empty."""
        return self._inspect.latest()

    def manifest(self, ckpt_id: str | None = None) -> dict[str, Any]:
        """The raw manifest of a checkpoint (latest by default)."""
        return self._inspect.resolve(ckpt_id, None)

    def show(self, ckpt_id: str | None = None) -> ShowResult:
        """Summary of one checkpoint: info, what a restore of it reads, and per tensor dtype, shape, chunks,
        transforms and stored bytes."""
        return self._inspect.show(ckpt_id)

    def diff(self, a: str, b: str) -> DiffResult:
        """Compare two checkpoints: which tensors/chunks changed (by content hash) and which plain values."""
        return self._inspect.diff(a, b)

    def export(
        self,
        checkpoint_id: str | None,
        dest: str | os.PathLike[str],
        select: str | None = None,
        format: str | None = None,
    ) -> ExportResult:
        """Write checkpoint ``checkpoint_id`` (an id, a unique prefix of one, ``"latest"`` or None), or its sub-tree
        ``select`` (``"model"``, ``"model.encoder"``), to ``dest``: a ``.safetensors`` file, or a ``torch.save``
        file (``.pt``, ``.pth``) that loads with ``torch.load(..., weights_only=True)``; ``format``
        (``"safetensors"`` or ``"torch"``) overrides the suffix. See "Exports and the command line" in
        ``docs/checkpoint.md``."""
        return export_state(self, checkpoint_id, dest, select, format)

    def gc(
        self, keep: int = 3, grace_s: float = 3600.0, dry_run: bool = False, keep_abandoned: bool = False
    ) -> GcResult:
        """Keep the newest ``keep`` commits of the live branch (the newest commit and those it continues);
        delete the other checkpoints (the abandoned branches too, unless ``keep_abandoned``) and every object
        no kept checkpoint needs.

        Objects referenced by a kept checkpoint (including the bases of its delta chains) are never deleted, nor
        what a save in flight reuses (in any process: its lease names it). Unreferenced objects newer than
        ``grace_s`` seconds are kept too. A manifest that cannot be read (damaged, or of a newer format version
        than this library's) makes gc refuse before it deletes anything: the objects it needs cannot be told
        apart.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1")
        if not dry_run:
            self._check_writable("gc")
        self.wait()
        return collect(self._inspect, keep, grace_s, dry_run, keep_abandoned)

    # ------------------------------------------------------------------ restore
    def restore(
        self,
        ckpt_id: str | None = None,
        *,
        step: int | None = None,
        into: Any = None,
        allow_pickle: bool | None = None,
        verify: bool = True,
        missing_ok: bool = False,
        map_location: Any = None,
        fallback: bool = False,
        rng: bool = False,
        per_rank: str | int = "strict",
    ) -> Any:
        """Load a checkpoint (latest by default) and return its state.

        Parameters
        ----------
        ckpt_id
            Checkpoint id (or a unique prefix, or ``"latest"``).
        step
            Restore the newest commit at this step (one on the live branch, if there is one).
        into
            Objects to load into in place, shaped like the saved state: e.g. ``{"model": model,
            "optim": optimizer}``. Objects with ``load_state_dict`` get their state dict; tensors are
            copied into; dicts and lists are matched key by key. Shapes are checked first.
        allow_pickle
            Allow pickled values (default: the Checkpointer's setting).
        verify
            Check every chunk's decoded bytes against its hash (a delta chain end to end).
        missing_ok
            Return None instead of raising :class:`NoCheckpointError` when the store is empty.
        map_location
            Move restored tensors to this device.
        fallback
            For the latest checkpoint (no ``ckpt_id`` or ``step``): when its data is missing or corrupted
            (:class:`ObjectMissingError`, :class:`IntegrityError`: a lost object, a partial copy of the store),
            restore the newest older checkpoint that is intact instead, with a warning naming each one skipped
            and why. Meant for resuming a run; without it the error is raised. Other errors are always raised.
            In a job with a process group (``world_size`` > 1), every rank must call it (as with
            :meth:`maybe_save`): the ranks agree, so that all of them restore the same checkpoint.
        rng
            Set this rank's RNG states to the ones its per-rank section holds (see the ``rng`` setting).
        per_rank
            Which per-rank section (:class:`PerRank` values, RNG states) this rank gets back: ``"strict"`` its
            own (onto another world size an error, unless the sections hold RNG states only and ``rng`` is not
            asked for), ``"drop"`` none, or a saved rank's number (that rank's).

        Returns
        -------
        The saved state with modules/optimizers replaced by their state dicts (plain values as saved).

        Raises
        ------
        NoCheckpointError, IntegrityError, ObjectMissingError, FormatVersionError, ShapeMismatchError
        """
        if self._current:
            _registry.set_active_checkpointer(self)
        self._wait_inflight()
        try:
            doc = self._inspect.resolve(ckpt_id, step)
        except NoCheckpointError:
            if missing_ok:
                return None
            raise
        allow = self.allow_pickle if allow_pickle is None else allow_pickle
        got = restore_checkpoint(
            doc,
            inspector=self._inspect,
            rank=self.rank,
            world_size=self.world_size,
            agree_min=agree_min,
            decode={
                "threads": self.threads,
                "pack_max": self.pack_max,
                "progress": self.progress,
                "verify": verify,
                "allow_pickle": allow,
                "pools": (self._pool, self._uploads),  # idle while nothing is saved: no threads to start
            },
            fallback=fallback,
            latest=ckpt_id in (None, "latest") and step is None,
            into=into,
            map_location=map_location,
            per_rank=per_rank,
            rng=rng,
        )
        self._lineage.restored(got.doc, got.shard, got.datas, self.rank, self.hash)
        self._order.restored(got.doc)  # the next commit continues it (a new branch, if it is not the newest)
        self._auto_step = int(got.doc.get("step", 0)) + 1
        self._last_save_step = int(got.doc.get("step", 0))
        self._last_save_time = time.time()
        self.last_info = CheckpointInfo.from_manifest(got.doc)
        return got.state
