"""A persistent group of rank workers (Ray actors) with one torch.distributed process group.

The group places its workers through its :class:`Placement` (its own Ray placement group by default; a
workshop's seat is another), can hand them to another kernel (:meth:`WorkerGroup.adopt`), orders ranks by node
(one :class:`Worker` record per rank: its actor, rank plan and process facts), initialises torch.distributed once (NCCL when every rank has a
GPU of its own that CUDA can use, gloo otherwise; see :mod:`._process_group`), and runs cells or functions on
any subset of ranks while streaming their output. It recovers from failures without a kernel restart: ranks
left hanging by a failed rank are interrupted, and when they cannot be (a thread blocked inside a collective)
or a worker died, the group is rebuilt with fresh workers and the caller is told that worker state was reset
(see :mod:`._recovery`). A rank whose value the notebook cannot rebuild fails alone; the others' values are
kept. When the group is stopped while a cell runs (a budget stop, say), the cell ends as "cluster stopped"
and nothing is rebuilt.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook import _settings
from gpu_notebook._display import Progress
from gpu_notebook.distributed import _batch, _debug, _placement, _quiet, _recovery, _remains, _stall
from gpu_notebook.distributed._errors import GroupError
from gpu_notebook.distributed._handover import GroupRecord, live_workers
from gpu_notebook.distributed._output import RankLog, Streamer
from gpu_notebook.distributed._placement import Placement, PlacementRequest, RayPlacement
from gpu_notebook.distributed._process_group import explain_backend, nccl_needs_gpus
from gpu_notebook.distributed._ranks import GPU_VISIBILITIES, RankPlan, parse_ranks, plan_ranks, some_ranks
from gpu_notebook.distributed._recovery import CellRun
from gpu_notebook.distributed._results import CellResult
from gpu_notebook.distributed._sendable import check_pushable
from gpu_notebook.distributed._worker import (
    DEFAULT_MAX_RESULT_BYTES,
    CellReply,
    Worker,
    WorkerMeta,
    remote_worker_class,
)

__all__ = ["DRAIN_MAX_S", "DRAIN_MIN_S", "GroupError", "GroupTimeouts", "Worker", "WorkerGroup"]


@dataclass
class GroupTimeouts:
    """How long the group waits, in seconds."""

    placement: float = 120.0  # for the resources of every worker
    init: float = 180.0  # for torch.distributed to initialise on every rank
    collective: float = 1800.0  # torch.distributed's own timeout for a collective
    hang_grace: float = 2.0  # after a rank fails, before the still-running ranks are interrupted
    # after an interrupt, before stuck ranks are given up on (group rebuilt): $GPU_NOTEBOOK_INTERRUPT_GRACE, else 5
    interrupt_grace: float = field(default_factory=_settings.interrupt_grace)


#: How often a running cell's output is fetched from the ranks: every 0.1 s while they print, backing off to
#: 0.5 s while they do not (a drain is a call into every rank: on a small machine, 10 a second take CPU from
#: the training loop).
DRAIN_MIN_S = 0.1
DRAIN_MAX_S = 0.5
#: How often the ranks a cell waits for are looked for among this node's processes (see :func:`._batch.gone`).
PID_CHECK_S = 2.0


def _ray() -> Any:
    import ray

    return ray


class WorkerGroup:
    """``size`` rank workers holding one process group; see the module docstring.

    ``max_result_bytes`` is the most a rank's value may take, pickled, to be sent back to the notebook (None:
    64 MiB; 0: no limit); a larger value comes back as a placeholder saying how to fetch it with ``pull``.
    ``placement`` is where the workers' resources come from (see :class:`Placement`; None: the group's own Ray
    placement group, :class:`RayPlacement`).
    """

    def __init__(
        self,
        size: int,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0,
        backend: str = "auto",
        gpu_visibility: str = "node",
        strategy: str = "PACK",
        env: dict[str, str] | None = None,
        runtime_env: dict[str, Any] | None = None,
        timeouts: GroupTimeouts | None = None,
        log: RankLog | None = None,
        max_result_bytes: int | None = None,
        placement: Placement | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a worker group needs at least 1 worker")
        if cpus_per_worker < 0 or gpus_per_worker < 0:
            raise ValueError("cpus_per_worker and gpus_per_worker must be >= 0")
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError("backend must be 'auto', 'gloo' or 'nccl'")
        if backend == "nccl" and gpus_per_worker == 0:  # checked before any worker starts
            raise GroupError(nccl_needs_gpus("the workers get no GPUs (gpus_per_worker=0)"))
        if gpu_visibility not in GPU_VISIBILITIES:  # checked here, not after workers were started for nothing
            raise ValueError(f"gpu_visibility must be one of {', '.join(map(repr, GPU_VISIBILITIES))}")
        self.size = size
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self.requested_backend = backend
        self.gpu_visibility = gpu_visibility
        self.strategy = strategy
        self.env = dict(env or {})
        self.runtime_env = runtime_env
        self.timeouts = timeouts or GroupTimeouts()
        self.log = log or RankLog()
        self.max_result_bytes = DEFAULT_MAX_RESULT_BYTES if max_result_bytes is None else max_result_bytes
        self.group_id = uuid.uuid4().hex[:8]
        self.generation = 0
        self.workers: list[Worker] = []  # indexed by rank; empty while stopped
        self.backend: str | None = None
        self.backend_note = ""  # why the backend is not NCCL (empty for NCCL or a requested backend)
        self.master: tuple[str, int] | None = None
        self.placement: Placement = placement if placement is not None else RayPlacement()
        self.actor_names: list[str] = []  # the workers' Ray actor names, in rank order
        self.actor_namespace: str | None = None  # their Ray namespace (None: this kernel's own)
        self._spawned: list[Any] = []  # actors started but not yet given a rank: stop() ends them too
        self._dead: set[int] = set()
        self._seqs: dict[int, int] = {}  # rank -> collectives issued on the default group after its last cell
        self.started_at: float | None = None
        self.busy = False
        self.current_run: CellRun | None = None  # the running cell's record (background cells read it)
        self._stopping: str | None = None  # set by stop(): why the group is going away (a running cell ends)

    # ---- the ranks ---------------------------------------------------------------------------------------------
    @property
    def actors(self) -> list[Any]:
        """The ranks' Ray actors, in rank order."""
        return [w.actor for w in self.workers]

    @property
    def plans(self) -> list[RankPlan]:
        """The ranks' plans (node, local rank, GPUs), in rank order."""
        return [w.plan for w in self.workers]

    @property
    def metas(self) -> list[WorkerMeta]:
        """What the ranks' processes reported (pid, IP, GPUs), in rank order."""
        return [w.meta for w in self.workers]

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        state = "running" if self.workers else "stopped"
        return f"<WorkerGroup {self.size} workers, backend={self.backend}, {state}>"

    def start(self, progress: Progress | None = None) -> WorkerGroup:
        """Place the workers, order their ranks and initialise torch.distributed on every one.

        Interrupting it (the kernel's stop button) releases whatever was already reserved or started.

        Args:
            progress: receives a line per stage (reserving, starting, initialising).

        Returns:
            The group, started.
        """
        self._stopping = None
        return self._start_or_release(progress)

    def _start_or_release(self, progress: Progress | None) -> WorkerGroup:
        try:
            return self._start(progress)
        except KeyboardInterrupt:
            self._end_workers()
            raise GroupError("starting the workers was interrupted; nothing was left running") from None

    def _start(self, progress: Progress | None) -> WorkerGroup:
        say = progress or (lambda msg: None)
        self.generation += 1
        self._dead.clear()
        self._seqs.clear()
        request = PlacementRequest(
            size=self.size,
            bundle=_placement.worker_bundle(self.cpus_per_worker, self.gpus_per_worker),
            strategy=self.strategy,
            timeout=self.timeouts.placement,
            group_id=self.group_id,
            generation=self.generation,
        )
        say(f"reserving resources for {self.size} worker(s): {_placement.fmt_bundle(request.bundle)} each")
        self.placement.reserve(request, say)
        self._check_not_stopping()
        say(f"starting {self.size} worker process(es)")
        names = self._spawn(request)
        self._check_not_stopping()
        self.workers = self._rank_workers(self._spawned)
        self.actor_names = [names[w.plan.actor_index] for w in self.workers]
        self._spawned = []
        backend = self._init_process_group(say)
        self._check_not_stopping()
        self.backend = backend
        self.started_at = time.time()
        self.placement.started(self)
        return self

    def _spawn(self, request: PlacementRequest) -> list[str]:
        """Start one worker actor per reserved bundle, placed by the placement's actor options (into
        ``_spawned``, not yet ranks); returns their names, in the same order."""
        cls = remote_worker_class()
        self._spawned, names = [], []
        for i in range(self.size):
            opts: dict[str, Any] = {
                "num_cpus": self.cpus_per_worker,
                "num_gpus": self.gpus_per_worker,
                **self.placement.actor_options(request, i),
            }
            if self.runtime_env:
                opts["runtime_env"] = self.runtime_env
            names.append(str(opts.get("name", "")))
            self.actor_namespace = opts.get("namespace")
            self._spawned.append(cls.options(**opts).remote(self.group_id, self.env))
        return names

    def _rank_workers(self, actors: Sequence[Any]) -> list[Worker]:
        """Ask each started actor where it runs, and give them their ranks (see :func:`plan_ranks`)."""
        ray = _ray()
        try:
            metas = ray.get([a.meta.remote() for a in actors], timeout=self.timeouts.init)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the start failed: end what started
            self._end_workers()
            raise GroupError(f"the worker processes did not start: {exc}") from exc
        plans = plan_ranks(
            metas, driver_ip=ray.util.get_node_ip_address(), gpu_visibility=self.gpu_visibility
        )
        return [Worker(actors[p.actor_index], p, metas[p.actor_index]) for p in plans]

    def _init_process_group(self, say: Progress) -> str:
        """Choose the backend and initialise torch.distributed on every rank; returns the backend."""
        ray = _ray()
        workers = self.workers
        master_ip = workers[0].plan.node_ip  # rank 0 hosts the rendezvous
        port = ray.get(workers[0].actor.free_port.remote())
        self.master = (master_ip, port)
        backend, why = self.requested_backend, ""
        if backend in ("auto", "nccl"):
            chosen, why = explain_backend(self.plans, [bool(w.meta.get("cuda_available")) for w in workers])
            if backend == "nccl" and chosen != "nccl":  # before every rank fails inside CUDA
                self._end_workers()
                raise GroupError(nccl_needs_gpus(why))
            backend = chosen
        self.backend_note = why
        say(
            f"initialising torch.distributed ({backend}{': ' + why if why else ''}; world size {self.size}, "
            f"master {master_ip}:{port})"
        )
        nodes = len({w.plan.node_id for w in workers})
        refs = [
            w.actor.init_process_group.remote(
                w.plan, self.size, nodes, master_ip, port, backend, self.timeouts.collective
            )
            for w in workers
        ]
        try:
            infos = ray.get(refs, timeout=self.timeouts.init)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises, the start failed: end what started
            self._end_workers()
            raise GroupError(f"torch.distributed did not initialise on every rank: {exc}") from exc
        return str(infos[0]["backend"])

    def _check_not_stopping(self) -> None:
        """Give up a start (a rebuild after a failure, say) when stop() was called meanwhile."""
        if self._stopping is not None:
            self._end_workers()
            raise GroupError(f"the group was stopped while its workers were starting ({self._stopping})")

    def stop(self, reason: str | None = None) -> None:
        """Leave the process group, end the worker processes and free their resources.

        A cell running meanwhile (in another thread) ends at once, reported as "cluster stopped" with
        ``reason``, and the group is not rebuilt for it.
        """
        self._stopping = reason or "the cluster was stopped"
        if self.busy:  # free the cell's thread so the workers can leave the process group before they end
            self._interrupt(range(len(self.workers)))
        self._end_workers()

    def _end_workers(self) -> None:
        """Ask every worker (ranked or only started) to leave the process group, kill them, free the reservation."""
        ray = _ray()
        actors = [w.actor for w in self.workers] + self._spawned
        if actors:
            try:
                ray.get([a.shutdown.remote() for a in actors], timeout=5)
            except Exception:  # noqa: BLE001 - dead or stuck workers are killed below
                pass
        _batch.kill(actors)
        for w in self.workers:  # a worker killed before it could remove its output spool (this machine's)
            _remains.remove(_remains.spool_paths(self.group_id, w.pid))
        self.workers, self._spawned = [], []
        self.placement.release()

    def detach(self) -> None:
        """Let the workers go without ending them: they and their reservation keep running for a kernel that
        adopts them (:meth:`adopt`); this group has no workers afterwards."""
        self.workers, self._spawned = [], []
        self.placement.reservation = None

    def record(self) -> GroupRecord:
        """What another kernel needs to take these workers over with :meth:`adopt` (the group is running)."""
        return GroupRecord(
            actor_names=list(self.actor_names),
            ranks=[(w.plan, w.meta) for w in self.workers],
            group_id=self.group_id,
            generation=self.generation,
            backend=self.backend,
            backend_note=self.backend_note,
            master=self.master,
            cpus_per_worker=self.cpus_per_worker,
            gpus_per_worker=self.gpus_per_worker,
            started_at=self.started_at,
            namespace=self.actor_namespace,
            reservation=self.placement.reservation,
        )

    def adopt(self, record: GroupRecord) -> WorkerGroup:
        """Take over the live workers ``record`` names, with their state (variables, the process group), instead
        of starting fresh ones: what a kernel does with workers an earlier kernel started and left running.

        The placement takes over ``record.reservation`` and is told the group runs.

        Args:
            record: what :meth:`record` gave in the kernel that started them.

        Returns:
            The group, running; a :class:`GroupError` when a worker is gone (nothing was taken over).
        """
        self.workers = live_workers(record)
        self.actor_names, self.actor_namespace = list(record.actor_names), record.namespace
        self.size = record.size
        self.cpus_per_worker, self.gpus_per_worker = record.cpus_per_worker, record.gpus_per_worker
        self.group_id, self.generation = record.group_id, record.generation
        self.backend, self.backend_note, self.master = record.backend, record.backend_note, record.master
        self.started_at = record.started_at
        self.placement.reservation = record.reservation
        self.placement.started(self)
        return self

    def rebuild(self, progress: Progress | None = None) -> None:
        """Replace every worker with a fresh one and initialise a new process group (state is lost)."""
        self._stopping = None
        self._restart(progress)

    def resize(self, size: int, progress: Progress | None = None) -> None:
        """Replace the workers with ``size`` fresh ones (state is lost)."""
        if size < 1:
            raise ValueError("a worker group needs at least 1 worker")
        bundle = _placement.worker_bundle(self.cpus_per_worker, self.gpus_per_worker)
        self.placement.check(size, bundle)  # before the workers end: a refusal leaves them as they are
        self._stopping = None
        self._end_workers()
        self.size = size
        self._start_or_release(progress)

    def _restart(self, progress: Progress | None) -> None:
        """End the workers and start fresh ones, unless stop() is called meanwhile (then it raises)."""
        self._end_workers()
        self._start_or_release(progress)

    # ---- status ------------------------------------------------------------------------------------------------
    def alive(self, timeout: float = 2.0) -> list[bool]:
        """Whether each rank's process answers (the control group answers even while a cell runs)."""
        return _batch.alive(self.workers, self._dead, timeout)

    def drain(self) -> None:
        """Pull whatever the workers printed since the last drain into the driver-side log."""
        self._drain(list(range(len(self.workers))), Streamer(self.log, None))
        for rank in range(len(self.workers)):
            self.log.flush(rank)

    # ---- running code ----------------------------------------------------------------------------------------
    def run(
        self,
        code: str,
        ranks: str | Sequence[int] | None = None,
        timeout: float | None = None,
        sink: Callable[[str], None] | None = None,
        label: str = "distributed-cell",
        progress: Progress | None = None,
        header: str | None = None,
        max_result_bytes: int | None = None,
    ) -> CellResult:
        """Run ``code`` on the selected ranks, streaming output lines to ``sink``.

        ``header``: the notebook cell's first line (``%%distributed ...``), so traceback line numbers match.
        ``max_result_bytes``: this cell's limit for a rank's pickled value (None: :attr:`max_result_bytes`; 0:
        no limit).
        """
        selected = parse_ranks(ranks, self.size)
        limit = self._limit(max_result_bytes)
        some = some_ranks(selected, self.size)
        return self._execute(
            lambda a: a.run_cell.remote(code, label, header, limit, some), selected, timeout, sink, progress
        )

    def call(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        ranks: str | Sequence[int] | None = None,
        timeout: float | None = None,
        sink: Callable[[str], None] | None = None,
        progress: Progress | None = None,
        max_result_bytes: int | None = None,
    ) -> CellResult:
        """Run ``fn(*args, **kwargs)`` in each selected rank's process (``max_result_bytes`` as in :meth:`run`)."""
        selected = parse_ranks(ranks, self.size)
        kw = kwargs or {}
        limit = self._limit(max_result_bytes)
        some = some_ranks(selected, self.size)
        return self._execute(
            lambda a: a.call.remote(fn, args, kw, limit, some), selected, timeout, sink, progress
        )

    def follow(
        self,
        label: str | None = None,
        sink: Callable[[str], None] | None = None,
        progress: Progress | None = None,
    ) -> CellResult:
        """Wait for the cell ``label`` (None: the current or last one) that the ranks run or ran for a kernel that
        is gone, as for a cell started here: its output since the last drain, then each rank's value or error."""
        return self._execute(
            lambda a: a.await_cell.remote(label), list(range(self.size)), None, sink, progress
        )

    def _limit(self, max_result_bytes: int | None) -> int | None:
        """The size limit a worker applies to a value: None for no limit."""
        limit = self.max_result_bytes if max_result_bytes is None else max_result_bytes
        if limit < 0:
            raise ValueError(f"max_result_bytes must be >= 0 (0: no limit), not {limit}")
        return limit or None

    def push(self, values: dict[str, Any], ranks: str | Sequence[int] | None = None) -> None:
        """Set ``values`` (name -> value) in the selected ranks' namespaces."""
        ray = _ray()
        check_pushable(values)
        selected = parse_ranks(ranks, self.size)
        ref = ray.put(values)
        ray.get([self.workers[r].actor.push.remote(ref) for r in selected], timeout=300)

    def pull(self, name: str, rank: int = 0, keep_device: bool = False) -> Any:
        """The value of the variable ``name`` in ``rank``'s namespace, its tensors moved to the CPU on the
        rank (the notebook may have no GPU) unless ``keep_device``."""
        ray = _ray()
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} out of range: this group has ranks 0-{self.size - 1}")
        try:
            return ray.get(self.workers[rank].actor.pull.remote(name, keep_device), timeout=300)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise type(cause)(str(cause)) if isinstance(cause, (NameError, TypeError)) else cause from None
        except ray.exceptions.RaySystemError as exc:  # sent, but it cannot be rebuilt here
            raise TypeError(
                f"variable {name!r} from rank {rank} cannot be rebuilt in the notebook: "
                f"{_recovery.ray_cause(exc)}"
            ) from None

    def _drain(
        self, ranks: Sequence[int], streamer: Streamer, workers: Sequence[Worker] | None = None
    ) -> int:
        """Fetch what the ranks printed since the last drain (one batched call); returns how many characters
        came."""
        return _batch.drain(self.workers if workers is None else workers, ranks, self._dead, streamer)

    def _execute(
        self,
        submit: Callable[[Any], Any],
        selected: list[int],
        timeout: float | None,
        sink: Callable[[str], None] | None,
        progress: Progress | None,
    ) -> CellResult:
        """Submit to the selected ranks, wait for them while streaming their output, then recover if needed."""
        if not self.workers:
            raise GroupError(
                "the worker group has no workers (stopped, or a rebuild failed): run %gpu_cluster restart, "
                "or %gpu_cluster scale N to fit the resources left"
            )
        say = progress or (lambda msg: None)
        workers = list(self.workers)  # stop() from another thread empties self.workers
        run = CellRun(
            workers=workers,
            selected=selected,
            streamer=Streamer(self.log, sink, ranks=selected),
            start=time.monotonic(),
            log_mark=self.log.mark(),
        )
        run.last_drain, run.drain_every = run.start, DRAIN_MIN_S
        run.stall = _stall.watch_for(workers, selected, self.backend, run.streamer.say)
        run.pending = {submit(workers[r].actor): r for r in selected}
        self.busy, self.current_run = True, run
        try:  # a death of these ranks is this cell's to report, not Ray's (see _quiet)
            with _quiet.deaths_reported_by_the_cell(workers[r].pid for r in selected):
                self._wait(run, timeout)
                if run.stopped is None and self._stopping is not None:
                    # the ranks replied (the stop's interrupt ended them) or died because the group was stopped
                    run.stopped = self._stopping
                stuck = sorted(run.pending.values())  # ranks that never came back
                self._drain(stuck, run.streamer, workers)  # a reply brought its rank's output with it
                for rank in selected:
                    run.streamer.finish(rank)
                notes = self._conclude(run, stuck, say)
        finally:
            self.busy, self.current_run = False, None
        return run.result(notes)

    def _wait(self, run: CellRun, timeout: float | None) -> None:
        """Wait until every rank replied, the group is stopped, or ranks that did not stop are given up on.

        A first kernel interrupt (the stop button) interrupts the running ranks; a second one stops waiting.
        """
        while run.pending:
            if self._stopping is not None:
                run.stopped = self._stopping
                return
            try:
                if self._poll(run, timeout):
                    return
            except KeyboardInterrupt:
                if run.interrupted_at is not None and run.interrupt_reason == "interrupted":
                    run.rebuild_reason = "interrupted"  # a second interrupt: stop waiting
                    return
                run.interrupt_reason = "interrupted"
                run.interrupted_at = time.monotonic()
                self._interrupt(list(run.pending.values()), run.workers)

    def _poll(self, run: CellRun, timeout: float | None) -> bool:
        """One wait for replies: collect them, drain output, interrupt ranks left hanging or past ``timeout``.

        Returns True when the wait is over: every rank replied, or interrupted ranks did not stop in time.
        """
        ray = _ray()
        try:
            ready, _ = ray.wait(list(run.pending), num_returns=len(run.pending), timeout=run.poll)
        except Exception:  # re-raised unless the group is being stopped (Ray raises anything once shut down)
            if self._stopping is not None:  # Ray is shut down under us: _wait ends the cell as stopped
                return False
            raise
        run.poll = min(run.poll * 2, 0.1)
        now = time.monotonic()
        if now - run.last_drain >= run.drain_every:  # (a reply brings its rank's output with it)
            got = self._drain(run.selected, run.streamer, run.workers)
            run.last_drain = now
            run.drain_every = DRAIN_MIN_S if got else min(2 * run.drain_every, DRAIN_MAX_S)
        _debug.watch(run, now)  # a rank paused at a breakpoint: the prompt (or a background cell's note)
        if run.stall is not None:  # ranks whose collective numbers differ and stand still: their stacks, once
            run.stall.tick(now)
        for ref in ready:
            self._collect(run, ref)
            del run.pending[ref]  # after: an interrupt while collecting leaves it to collect again
        for ref, rank in _recovery.gone_pending(run, now, PID_CHECK_S):  # dead while Ray has not noticed
            self._died(run, rank, _recovery.ProcessGone())
            del run.pending[ref]
        if not run.pending:
            return True
        # a rank whose value could not be rebuilt here finished its cell: it leaves no one hanging
        if run.first_failure_at is None and any(f.kind != "value" for f in run.failures.values()):
            run.first_failure_at = now
        if run.interrupted_at is None:
            if run.first_failure_at is not None and now - run.first_failure_at > self.timeouts.hang_grace:
                run.interrupt_reason = "hung"
            elif timeout is not None and now - run.start > timeout:
                run.interrupt_reason = "timeout"
            if run.interrupt_reason and self._interrupt(list(run.pending.values()), run.workers):
                run.interrupted_at = now
            else:  # no code left to interrupt: those ranks' replies are on the way (or a cell starts: retried)
                run.interrupt_reason = ""
        elif now - run.interrupted_at > self.timeouts.interrupt_grace:
            run.rebuild_reason = run.interrupt_reason
            return True
        return False

    def _collect(self, run: CellRun, ref: Any) -> None:
        """Take one rank's reply: its value, or why it failed (a dead worker is marked dead)."""
        ray = _ray()
        rank = run.pending[ref]
        try:
            out: CellReply = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
            self._died(run, rank, exc)
            return
        except Exception as exc:  # noqa: BLE001 - any other Ray error is this rank's failure, not the cell's
            run.failures[rank] = _recovery.unreturned_failure(rank, exc)
            self._drain([rank], run.streamer, run.workers)  # its output did not come with its reply
            return
        run.streamer.feed(rank, out.pop("output", ""))
        seq = out.get("seq")
        if isinstance(seq, int):
            self._seqs[rank] = seq
        if out.get("ok"):
            run.values[rank] = out.get("value")
        else:
            run.failures[rank] = _recovery.reply_failure(rank, out, run.interrupt_reason)

    def _died(self, run: CellRun, rank: int, exc: BaseException) -> None:
        """Mark ``rank`` dead: what it wrote since the last drain (cell and log), then its failure."""
        self._dead.add(rank)
        worker = run.workers[rank] if rank < len(run.workers) else None
        remains = _remains.fetch(worker.meta, self.group_id) if worker is not None else _remains.Remains()
        run.streamer.feed(rank, remains.output)
        run.streamer.finish(rank)
        run.failures[rank] = _recovery.died_failure(rank, worker, exc, run.last_output(rank), remains.fault)

    def _conclude(self, run: CellRun, stuck: list[int], say: Progress) -> list[str]:
        """Decide what the cell's failures mean for the workers (kept, or rebuilt); returns the cell's notes."""
        if run.stopped is not None:
            return [_recovery.mark_stopped(run, stuck)]
        _recovery.mark_stuck(run, stuck)
        died = run.died()
        if died or stuck:
            return [self._recover(_recovery.lost_ranks(died, stuck), say)]
        if desync := _recovery.out_of_step(self._seqs, self.size, self.backend, run.failures):
            return [self._recover(desync, say)]
        if run.interrupt_reason and run.interrupted_at is not None:
            return [
                f"The running ranks were interrupted ({run.interrupt_reason}); the workers are still usable "
                f"and keep their state."
            ]
        return []

    def _recover(self, why: str, say: Progress) -> str:
        """Rebuild the group after ``why`` unless it is being stopped; the note for the cell."""
        return _recovery.rebuild(why, self.size, lambda: self._stopping, lambda: self._restart(say), say)

    def _interrupt(self, ranks: Sequence[int], workers: Sequence[Worker] | None = None) -> bool:
        """Raise KeyboardInterrupt in the running code of ``ranks`` (those not known dead); False when none of
        them was running code (their cells had ended), so nothing was interrupted."""
        ray = _ray()
        workers = self.workers if workers is None else workers
        try:
            refs = [
                workers[r].actor.interrupt.remote() for r in ranks if r not in self._dead and r < len(workers)
            ]
            return not refs or any(ray.get(refs, timeout=5))
        except Exception:  # noqa: BLE001 - best effort: a rank that cannot be interrupted is given up on later
            return True
