"""A persistent group of rank workers (Ray actors) with one torch.distributed process group.

The group places its workers with a placement group, orders ranks by node, initialises torch.distributed once
(NCCL when every rank has a GPU of its own that CUDA can use, gloo otherwise; see ``explain_backend``), and
runs cells or functions on any subset of ranks while streaming their output. It recovers from failures without
a kernel restart: ranks left hanging by a failed rank are interrupted, and when they cannot be (a thread
blocked inside a collective) or a worker died, the group is rebuilt with fresh workers and the caller is told
that worker state was reset. A rank whose value the notebook cannot rebuild fails alone; the others' values
are kept. When the group is stopped while a cell runs (a budget stop, say), the cell ends as "cluster stopped"
and nothing is rebuilt.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_notebook.distributed._output import RankLog, Streamer
from gpu_notebook.distributed._ranks import RankPlan, explain_backend, format_ranks, parse_ranks, plan_ranks
from gpu_notebook.distributed._results import CellResult, RankFailure, RankResults
from gpu_notebook.errors import GpuNotebookError

Progress = Callable[[str], None]


class GroupError(GpuNotebookError, RuntimeError):
    """The worker group could not be started or rebuilt (the message says why and what to do)."""


@dataclass
class GroupTimeouts:
    """How long the group waits, in seconds."""

    placement: float = 120.0  # for the resources of every worker
    init: float = 180.0  # for torch.distributed to initialise on every rank
    collective: float = 1800.0  # torch.distributed's own timeout for a collective
    hang_grace: float = 2.0  # after a rank fails, before the still-running ranks are interrupted
    interrupt_grace: float = 5.0  # after an interrupt, before stuck ranks are given up on (group rebuilt)


#: How often a running cell's output is fetched from the ranks: every 0.1 s while they print, backing off to
#: 0.5 s while they do not (a drain is a call into every rank: on a small machine, 10 a second take CPU from
#: the training loop).
DRAIN_MIN_S = 0.1
DRAIN_MAX_S = 0.5


def _ray() -> Any:
    import ray

    return ray


class WorkerGroup:
    """``size`` rank workers holding one process group; see the module docstring.

    ``max_result_bytes`` is the most a rank's value may take, pickled, to be sent back to the notebook (None:
    64 MiB; 0: no limit); a larger value comes back as a placeholder saying how to fetch it with ``pull``.
    """

    def __init__(
        self,
        size: int,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0,
        backend: str = "auto",
        gpu_visibility: str = "own",
        strategy: str = "PACK",
        env: dict[str, str] | None = None,
        runtime_env: dict[str, Any] | None = None,
        timeouts: GroupTimeouts | None = None,
        log: RankLog | None = None,
        max_result_bytes: int | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a worker group needs at least 1 worker")
        if cpus_per_worker < 0 or gpus_per_worker < 0:
            raise ValueError("cpus_per_worker and gpus_per_worker must be >= 0")
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError("backend must be 'auto', 'gloo' or 'nccl'")
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
        from gpu_notebook.distributed._worker import DEFAULT_MAX_RESULT_BYTES

        self.max_result_bytes = DEFAULT_MAX_RESULT_BYTES if max_result_bytes is None else max_result_bytes
        self.group_id = uuid.uuid4().hex[:8]
        self.generation = 0
        self.actors: list[Any] = []  # indexed by rank
        self.plans: list[RankPlan] = []
        self.metas: list[dict[str, Any]] = []  # indexed by rank
        self.backend: str | None = None
        self.backend_note = ""  # why the backend is not NCCL (empty for NCCL or a requested backend)
        self.master: tuple[str, int] | None = None
        self._pg: Any = None
        self._dead: set[int] = set()
        self._seqs: dict[
            int, int
        ] = {}  # rank -> collectives issued on the default group, after its last cell
        self.started_at: float | None = None
        self.busy = False
        self._stopping: str | None = None  # set by stop(): why the group is going away (a running cell ends)

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        state = "running" if self.actors else "stopped"
        return f"<WorkerGroup {self.size} workers, backend={self.backend}, {state}>"

    def start(self, progress: Progress | None = None) -> WorkerGroup:
        """Place the workers, order their ranks and initialise torch.distributed on every one.

        Interrupting it (the kernel's stop button) releases whatever was already reserved or started.
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
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from gpu_notebook.distributed._worker import remote_worker_class

        self.generation += 1
        self._dead.clear()
        self._seqs.clear()
        bundle: dict[str, float] = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            bundle["GPU"] = self.gpus_per_worker
        if not self.cpus_per_worker:
            bundle = {k: v for k, v in bundle.items() if v} or {"CPU": 0.001}
        say(f"reserving resources for {self.size} worker(s): {self._fmt_bundle(bundle)} each")
        pg = placement_group([dict(bundle) for _ in range(self.size)], strategy=self.strategy)
        self._pg = pg
        deadline = time.monotonic() + self.timeouts.placement
        waited_msg = 0.0
        while True:
            ready, _ = ray.wait([pg.ready()], timeout=1.0)
            if ready:
                break
            now = time.monotonic()
            if now > deadline:
                remove_placement_group(pg)
                self._pg = None
                raise GroupError(self._placement_error(bundle))
            if now - waited_msg > 5:
                waited_msg = now
                say(f"waiting for resources ({self._available_text()})")
        self._pg = pg
        self._check_not_stopping()
        say(f"starting {self.size} worker process(es)")
        cls = remote_worker_class()
        actors = []
        for i in range(self.size):
            opts: dict[str, Any] = {
                "num_cpus": self.cpus_per_worker,
                "num_gpus": self.gpus_per_worker,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i
                ),
                "name": f"gpu_notebook:{self.group_id}:{self.generation}:{i}",
            }
            if self.runtime_env:
                opts["runtime_env"] = self.runtime_env
            actors.append(cls.options(**opts).remote(self.group_id, self.env))
        self.actors = list(actors)  # so stop() can end them if anything below fails or is interrupted
        self._check_not_stopping()
        try:
            metas = ray.get([a.meta.remote() for a in actors], timeout=self.timeouts.init)
        except Exception as exc:
            self._end_workers()
            raise GroupError(f"the worker processes did not start: {exc}") from exc
        driver_ip = ray.util.get_node_ip_address()
        plans = plan_ranks(metas, driver_ip=driver_ip, gpu_visibility=self.gpu_visibility)
        self.plans = plans
        self.actors = [actors[p.actor_index] for p in plans]
        self.metas = [metas[p.actor_index] for p in plans]
        master_ip = plans[0].node_ip
        port = ray.get(self.actors[0].free_port.remote())
        self.master = (master_ip, port)
        backend, why = self.requested_backend, ""
        if backend == "auto":
            backend, why = explain_backend(plans, [bool(m.get("cuda_available")) for m in self.metas])
        self.backend_note = why
        say(
            f"initialising torch.distributed ({backend}{': ' + why if why else ''}; world size {self.size}, "
            f"master {master_ip}:{port})"
        )
        refs = [
            a.init_process_group.remote(
                p.rank,
                self.size,
                p.local_rank,
                p.local_world_size,
                p.node_rank,
                master_ip,
                port,
                backend,
                p.cuda_visible_devices,
                p.device_index,
                self.timeouts.collective,
            )
            for a, p in zip(self.actors, plans, strict=True)
        ]
        try:
            infos = ray.get(refs, timeout=self.timeouts.init)
        except Exception as exc:
            self._end_workers()
            raise GroupError(f"torch.distributed did not initialise on every rank: {exc}") from exc
        self._check_not_stopping()
        self.backend = infos[0]["backend"]
        self.started_at = time.time()
        return self

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
            self._interrupt(range(len(self.actors)))
        self._end_workers()

    def _end_workers(self) -> None:
        ray = _ray()
        if self.actors:
            try:
                ray.get([a.shutdown.remote() for a in self.actors], timeout=5)
            except Exception:  # noqa: BLE001 - dead or stuck workers are killed below
                pass
        self._kill(self.actors)
        self.actors = []
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001
                pass
            self._pg = None

    def rebuild(self, progress: Progress | None = None) -> None:
        """Replace every worker with a fresh one and initialise a new process group (state is lost)."""
        self._stopping = None
        self._end_workers()
        self._start_or_release(progress)

    def resize(self, size: int, progress: Progress | None = None) -> None:
        if size < 1:
            raise ValueError("a worker group needs at least 1 worker")
        self._stopping = None
        self._end_workers()
        self.size = size
        self._start_or_release(progress)

    @staticmethod
    def _kill(actors: Sequence[Any]) -> None:
        ray = _ray()
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass

    @staticmethod
    def _fmt_bundle(bundle: dict[str, float]) -> str:
        return ", ".join(f"{v:g} {k}" for k, v in bundle.items())

    def _available_text(self) -> str:
        ray = _ray()
        try:
            avail = ray.available_resources()
            total = ray.cluster_resources()
        except Exception:  # noqa: BLE001
            return "cluster resources unknown"
        return (
            f"free {avail.get('CPU', 0):g}/{total.get('CPU', 0):g} CPU, "
            f"{avail.get('GPU', 0):g}/{total.get('GPU', 0):g} GPU"
        )

    def _placement_error(self, bundle: dict[str, float]) -> str:
        return (
            f"could not place {self.size} worker(s) of {self._fmt_bundle(bundle)} each within "
            f"{self.timeouts.placement:g} s ({self._available_text()}). Ask for fewer workers, fewer CPUs per "
            f"worker (fractions such as --cpus-per-worker 0.5 are allowed) or fewer GPUs, or add nodes."
        )

    # ---- status ------------------------------------------------------------------------------------------------
    def alive(self, timeout: float = 2.0) -> list[bool]:
        """Whether each rank's process answers (the control group answers even while a cell runs)."""
        ray = _ray()
        refs = [a.ping.remote() for a in self.actors]
        out = []
        for rank, ref in enumerate(refs):
            if rank in self._dead:
                out.append(False)
                continue
            try:
                ray.get(ref, timeout=timeout)
                out.append(True)
            except Exception:  # noqa: BLE001
                out.append(False)
        return out

    def drain(self) -> None:
        """Pull whatever the workers printed since the last drain into the driver-side log."""
        self._drain(list(range(len(self.actors))), Streamer(self.log, None))
        for rank in range(len(self.actors)):
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
        return self._execute(
            lambda a: a.run_cell.remote(code, label, header, limit), selected, timeout, sink, progress
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
        return self._execute(lambda a: a.call.remote(fn, args, kw, limit), selected, timeout, sink, progress)

    def _limit(self, max_result_bytes: int | None) -> int | None:
        """The size limit a worker applies to a value: None for no limit."""
        limit = self.max_result_bytes if max_result_bytes is None else max_result_bytes
        if limit < 0:
            raise ValueError(f"max_result_bytes must be >= 0 (0: no limit), not {limit}")
        return limit or None

    def push(self, values: dict[str, Any], ranks: str | Sequence[int] | None = None) -> None:
        ray = _ray()
        from ray import cloudpickle

        for name, value in values.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:  # noqa: BLE001
                raise TypeError(
                    f"cannot send variable {name!r} to the workers: it cannot be pickled ({exc})"
                ) from None
        selected = parse_ranks(ranks, self.size)
        ref = ray.put(values)
        ray.get([self.actors[r].push.remote(ref) for r in selected], timeout=300)

    def pull(self, name: str, rank: int = 0) -> Any:
        ray = _ray()
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} out of range: this group has ranks 0-{self.size - 1}")
        try:
            return ray.get(self.actors[rank].pull.remote(name), timeout=300)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise type(cause)(str(cause)) if isinstance(cause, (NameError, TypeError)) else cause from None
        except ray.exceptions.RaySystemError as exc:  # sent, but it cannot be rebuilt here
            raise TypeError(
                f"variable {name!r} from rank {rank} cannot be rebuilt in the notebook: {_ray_cause(exc)}"
            ) from None

    def _drain(self, ranks: Sequence[int], streamer: Streamer, actors: Sequence[Any] | None = None) -> int:
        """Fetch what the ranks printed since the last drain; returns how many characters came."""
        ray = _ray()
        actors = self.actors if actors is None else actors
        live = [r for r in ranks if r not in self._dead and r < len(actors)]
        try:
            refs = [actors[r].drain_output.remote() for r in live]
        except Exception:  # noqa: BLE001 - Ray itself is going away (the cluster is being stopped)
            return 0
        got = 0
        for rank, ref in zip(live, refs, strict=True):
            try:
                text = ray.get(ref, timeout=5)
            except Exception:  # noqa: BLE001 - a dead worker is handled by the caller
                continue
            got += len(text or "")
            streamer.feed(rank, text)
        return got

    def _execute(
        self,
        submit: Callable[[Any], Any],
        selected: list[int],
        timeout: float | None,
        sink: Callable[[str], None] | None,
        progress: Progress | None,
    ) -> CellResult:
        ray = _ray()
        if not self.actors:
            raise GroupError(
                "the worker group has no workers (stopped, or a rebuild failed): run %gpu_cluster restart, "
                "or %gpu_cluster scale N to fit the resources left"
            )
        say = progress or (lambda msg: None)
        streamer = Streamer(self.log, sink)
        start = time.monotonic()
        actors = list(self.actors)  # stop() from another thread empties self.actors
        pending: dict[Any, int] = {submit(actors[r]): r for r in selected}
        values: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        first_failure_at: float | None = None
        interrupted_at: float | None = None
        interrupt_reason = ""
        notes: list[str] = []
        rebuild_reason = ""
        stopped: str | None = None
        poll = 0.002
        last_drain = start
        drain_every = DRAIN_MIN_S  # backs off while the ranks print nothing: each drain costs the ranks CPU
        self.busy = True
        try:
            while pending:
                if self._stopping is not None:
                    stopped = self._stopping
                    break
                try:
                    try:
                        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=poll)
                    except Exception:
                        if self._stopping is not None:  # Ray is shut down under us
                            continue
                        raise
                    poll = min(poll * 2, 0.1)
                    now = time.monotonic()
                    if ready or now - last_drain >= drain_every:
                        got = self._drain(selected, streamer, actors)
                        last_drain = now
                        drain_every = DRAIN_MIN_S if got else min(2 * drain_every, DRAIN_MAX_S)
                    for ref in ready:
                        self._collect(pending[ref], ref, values, failures, interrupt_reason)
                        del pending[ref]  # after: an interrupt while collecting leaves it to collect again
                    if not pending:
                        break
                    # a rank whose value could not be rebuilt here finished its cell: it leaves no one hanging
                    if first_failure_at is None and any(f.kind != "value" for f in failures.values()):
                        first_failure_at = now
                    if interrupted_at is None:
                        if first_failure_at is not None and now - first_failure_at > self.timeouts.hang_grace:
                            interrupt_reason = "hung"
                        elif timeout is not None and now - start > timeout:
                            interrupt_reason = "timeout"
                        if interrupt_reason:
                            interrupted_at = now
                            self._interrupt(list(pending.values()), actors)
                    elif now - interrupted_at > self.timeouts.interrupt_grace:
                        rebuild_reason = interrupt_reason
                        break
                except KeyboardInterrupt:
                    if interrupted_at is not None and interrupt_reason == "interrupted":
                        rebuild_reason = "interrupted"  # a second interrupt: stop waiting
                        break
                    interrupt_reason = "interrupted"
                    interrupted_at = time.monotonic()
                    self._interrupt(list(pending.values()), actors)
            if (
                stopped is None
                and self._stopping is not None
                and any(f.kind == "died" for f in failures.values())
            ):
                stopped = self._stopping  # the workers died because the group was being stopped
            # ranks that never came back
            stuck = sorted(pending.values())
            self._drain([r for r in selected if r not in stuck] + stuck, streamer, actors)
            for rank in selected:
                streamer.finish(rank)
            if stopped is not None:
                for rank in stuck + [r for r, f in failures.items() if f.kind == "died"]:
                    failures[rank] = RankFailure(
                        rank=rank,
                        kind="stopped",
                        detail=f"cluster stopped while the cell ran ({stopped})",
                        last_output=self.log.tail(rank, 10),
                    )
                notes.append(
                    f"Cluster stopped: {stopped}. Its workers were ended while the cell ran; nothing was "
                    f"restarted. Start a cluster again (%gpu_cluster start) to go on."
                )
                return self._result(selected, values, streamer, start, failures, notes)
            for rank in stuck:
                failures[rank] = RankFailure(
                    rank=rank,
                    kind=rebuild_reason or "hung",
                    detail=self._stuck_detail(rebuild_reason),
                    last_output=self.log.tail(rank, 10),
                )
            for f in failures.values():
                if f.kind in ("died", "hung", "timeout", "interrupted") and not f.last_output:
                    f.last_output = self.log.tail(f.rank, 10)
            died = sorted(r for r, f in failures.items() if f.kind == "died")
            if died or stuck:
                why = []
                if died:
                    why.append(f"rank(s) {format_ranks(died)} died")
                if stuck:
                    why.append(f"rank(s) {format_ranks(stuck)} could not be interrupted")
                notes.append(self._recover("; ".join(why), say))
            elif desync := self._out_of_step(failures):
                notes.append(self._recover(desync, say))
            elif interrupt_reason and interrupted_at is not None:
                notes.append(
                    f"The running ranks were interrupted ({interrupt_reason}); the workers are still usable "
                    f"and keep their state."
                )
        finally:
            self.busy = False
        return self._result(selected, values, streamer, start, failures, notes)

    def _out_of_step(self, failures: dict[int, RankFailure]) -> str:
        """Why the ranks' collectives are out of step after a cell, or "" when they are not (or cannot be told).

        A collective that some ranks started and the others never joined (one rank raised before it, say) stays
        queued: the next collective would be paired with it, and compute wrong results or hang. Every rank
        reports how many collectives it has issued on the default process group at the end of each cell; they
        must be equal. With NCCL (collectives run asynchronously, so the ranks that issued one finish their cell
        as if all went well) this is checked after every cell. With gloo a collective blocks until every rank
        joins, and ``send``/``recv`` count too (a pipeline's ranks legitimately differ), so it is checked only
        after a cell in which a rank failed or was interrupted (an ``async_op`` collective left behind).
        """
        if len(self._seqs) < self.size or len(set(self._seqs.values())) < 2:
            return ""
        if self.backend != "nccl" and not any(f.kind != "value" for f in failures.values()):
            return ""
        by_count: dict[int, list[int]] = {}
        for rank, seq in sorted(self._seqs.items()):
            by_count.setdefault(seq, []).append(rank)
        counts = ", ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)}: {seq}"
            for seq, ranks in sorted(by_count.items(), reverse=True)
        )
        return (
            f"the ranks' collectives are out of step (collectives issued, {counts}): a collective some ranks "
            f"started was never joined by the others, and the next one would be paired with it"
        )

    @staticmethod
    def _result(
        selected: list[int],
        values: dict[int, Any],
        streamer: Streamer,
        start: float,
        failures: dict[int, RankFailure],
        notes: list[str],
    ) -> CellResult:
        return CellResult(
            ranks=selected,
            values=RankResults(values),
            outputs=dict(streamer.captured),
            duration_s=time.monotonic() - start,
            failures=sorted(failures.values(), key=lambda f: f.rank),
            note="\n".join(notes),
        )

    @staticmethod
    def _stuck_detail(reason: str) -> str:
        if reason == "timeout":
            return "still running when the timeout expired and did not stop when interrupted"
        if reason == "interrupted":
            return "did not stop when interrupted"
        return "left waiting (probably inside a collective) after another rank failed; did not stop when interrupted"

    def _collect(
        self,
        rank: int,
        ref: Any,
        values: dict[int, Any],
        failures: dict[int, RankFailure],
        interrupt_reason: str,
    ) -> None:
        ray = _ray()
        try:
            out = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
            self._dead.add(rank)
            meta = self.metas[rank] if rank < len(self.metas) else {}
            failures[rank] = RankFailure(
                rank=rank,
                kind="died",
                detail=(
                    f"the worker process (pid {meta.get('pid', '?')} on {meta.get('ip', '?')}) died: "
                    f"{_first_line(str(exc))}"
                ),
                last_output=self.log.tail(rank, 10),
            )
            return
        except Exception as exc:  # noqa: BLE001 - any other Ray error is this rank's failure, not the cell's
            if isinstance(exc, ray.exceptions.RaySystemError) and isinstance(exc.client_exc, BaseException):
                # the value came back, but unpickling it here raised (a CUDA tensor on a notebook without
                # a GPU, a class the notebook cannot import, ...)
                failures[rank] = RankFailure(
                    rank=rank,
                    kind="value",
                    detail=(
                        f"the cell ran, but its value cannot be rebuilt in the notebook: {_ray_cause(exc)}. "
                        f"Keep such values on the workers (end the cell with `;` or an assignment), or "
                        f"convert them first (`.cpu()`, `.tolist()`, `str(...)`)"
                    ),
                )
                return
            cause = getattr(exc, "cause", None)
            cause = cause if isinstance(cause, BaseException) else exc
            failures[rank] = RankFailure(
                rank=rank,
                kind="error",
                etype=type(cause).__name__,
                evalue=_first_line(str(cause)),
                detail=f"Ray could not return this rank's result ({type(exc).__name__})",
                traceback=f"Ray could not return this rank's result: {type(exc).__name__}\n",
            )
            return
        if isinstance(out.get("seq"), int):
            self._seqs[rank] = out["seq"]
        if out.get("ok"):
            values[rank] = out.get("value")
            return
        kind = "error"
        if out.get("etype") == "KeyboardInterrupt" and interrupt_reason:
            kind = interrupt_reason
        failures[rank] = RankFailure(
            rank=rank,
            kind=kind,
            etype=out.get("etype", ""),
            evalue=out.get("evalue", ""),
            traceback=out.get("traceback", ""),
            cell_lines=out.get("cell_lines", []),
            detail={
                "hung": "interrupted: it was still running after another rank failed",
                "timeout": "interrupted: the timeout expired",
                "interrupted": "interrupted by the user",
            }.get(kind, ""),
        )

    def _interrupt(self, ranks: Sequence[int], actors: Sequence[Any] | None = None) -> None:
        ray = _ray()
        actors = self.actors if actors is None else actors
        try:
            refs = [actors[r].interrupt.remote() for r in ranks if r not in self._dead and r < len(actors)]
            ray.get(refs, timeout=5)
        except Exception:  # noqa: BLE001
            pass

    def _recover(self, why: str, say: Progress) -> str:
        if self._stopping is not None:  # the group is going away: do not start workers on it again
            return f"Cluster stopped: {self._stopping} ({why}); nothing was restarted."
        say(f"rebuilding the worker group: {why}")
        try:
            self._end_workers()
            self._start_or_release(say)
        except Exception as exc:  # noqa: BLE001
            if self._stopping is not None:
                return f"Cluster stopped: {self._stopping} ({why}); nothing was restarted."
            return (
                f"Worker state was lost: {why}. Rebuilding the group failed ({exc}); run "
                f"`%gpu_cluster scale {self.size}` once resources are back."
            )
        return (
            f"Worker state was reset: {why}, so the group was rebuilt with {self.size} fresh worker(s) "
            f"(new process group). Variables, models and optimizers defined on the workers are gone: re-run "
            f"your setup cells."
        )


def _ray_cause(exc: BaseException) -> str:
    """``Type: message`` of what a RaySystemError wraps (a deserialization error, say)."""
    cause = getattr(exc, "client_exc", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {_first_line(str(cause))}"
    text = _first_line(str(cause if cause is not None else exc))
    return text.removeprefix("System error: ")


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
