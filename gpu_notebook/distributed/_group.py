"""A persistent group of rank workers (Ray actors) with one torch.distributed process group.

The group places its workers with a placement group, orders ranks by node, initialises torch.distributed once
(NCCL when every rank has a GPU, gloo otherwise), and runs cells or functions on any subset of ranks while
streaming their output. It recovers from failures without a kernel restart: ranks left hanging by a failed
rank are interrupted, and when they cannot be (a thread blocked inside a collective) or a worker died, the
group is rebuilt with fresh workers and the caller is told that worker state was reset.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_notebook.distributed._output import RankLog, Streamer
from gpu_notebook.distributed._ranks import RankPlan, format_ranks, parse_ranks, plan_ranks
from gpu_notebook.distributed._results import CellResult, RankFailure, RankResults

Progress = Callable[[str], None]


class GroupError(RuntimeError):
    """The worker group could not be started or rebuilt (the message says why and what to do)."""


@dataclass
class GroupTimeouts:
    """How long the group waits, in seconds."""

    placement: float = 120.0  # for the resources of every worker
    init: float = 180.0  # for torch.distributed to initialise on every rank
    collective: float = 1800.0  # torch.distributed's own timeout for a collective
    hang_grace: float = 2.0  # after a rank fails, before the still-running ranks are interrupted
    interrupt_grace: float = 5.0  # after an interrupt, before stuck ranks are given up on (group rebuilt)


def _ray() -> Any:
    import ray

    return ray


class WorkerGroup:
    """``size`` rank workers holding one process group; see the module docstring."""

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
        self.group_id = uuid.uuid4().hex[:8]
        self.generation = 0
        self.actors: list[Any] = []  # indexed by rank
        self.plans: list[RankPlan] = []
        self.metas: list[dict[str, Any]] = []  # indexed by rank
        self.backend: str | None = None
        self.master: tuple[str, int] | None = None
        self._pg: Any = None
        self._dead: set[int] = set()
        self.started_at: float | None = None
        self.busy = False

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        state = "running" if self.actors else "stopped"
        return f"<WorkerGroup {self.size} workers, backend={self.backend}, {state}>"

    def start(self, progress: Progress | None = None) -> WorkerGroup:
        """Place the workers, order their ranks and initialise torch.distributed on every one.

        Interrupting it (the kernel's stop button) releases whatever was already reserved or started.
        """
        try:
            return self._start(progress)
        except KeyboardInterrupt:
            self.stop()
            raise GroupError("starting the workers was interrupted; nothing was left running") from None

    def _start(self, progress: Progress | None) -> WorkerGroup:
        say = progress or (lambda msg: None)
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from gpu_notebook.distributed._worker import remote_worker_class

        self.generation += 1
        self._dead.clear()
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
        try:
            metas = ray.get([a.meta.remote() for a in actors], timeout=self.timeouts.init)
        except Exception as exc:
            self.stop()
            raise GroupError(f"the worker processes did not start: {exc}") from exc
        driver_ip = ray.util.get_node_ip_address()
        plans = plan_ranks(metas, driver_ip=driver_ip, gpu_visibility=self.gpu_visibility)
        self.plans = plans
        self.actors = [actors[p.actor_index] for p in plans]
        self.metas = [metas[p.actor_index] for p in plans]
        master_ip = plans[0].node_ip
        port = ray.get(self.actors[0].free_port.remote())
        self.master = (master_ip, port)
        backend = self.requested_backend
        if backend == "auto":
            backend = "nccl" if all(p.gpu_ids for p in plans) else "gloo"
        say(f"initialising torch.distributed ({backend}, world size {self.size}, master {master_ip}:{port})")
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
            self.stop()
            raise GroupError(f"torch.distributed did not initialise on every rank: {exc}") from exc
        self.backend = infos[0]["backend"]
        self.started_at = time.time()
        return self

    def stop(self) -> None:
        """Leave the process group, end the worker processes and free their resources."""
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
        self.stop()
        self.start(progress)

    def resize(self, size: int, progress: Progress | None = None) -> None:
        if size < 1:
            raise ValueError("a worker group needs at least 1 worker")
        self.stop()
        self.size = size
        self.start(progress)

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
    ) -> CellResult:
        """Run ``code`` on the selected ranks, streaming output lines to ``sink``.

        ``header``: the notebook cell's first line (``%%distributed ...``), so traceback line numbers match.
        """
        selected = parse_ranks(ranks, self.size)
        return self._execute(lambda a: a.run_cell.remote(code, label, header), selected, timeout, sink, progress)

    def call(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        ranks: str | Sequence[int] | None = None,
        timeout: float | None = None,
        sink: Callable[[str], None] | None = None,
        progress: Progress | None = None,
    ) -> CellResult:
        """Run ``fn(*args, **kwargs)`` in each selected rank's process."""
        selected = parse_ranks(ranks, self.size)
        kw = kwargs or {}
        return self._execute(lambda a: a.call.remote(fn, args, kw), selected, timeout, sink, progress)

    def push(self, values: dict[str, Any], ranks: str | Sequence[int] | None = None) -> None:
        ray = _ray()
        from ray import cloudpickle

        for name, value in values.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:  # noqa: BLE001
                raise TypeError(f"cannot send variable {name!r} to the workers: it cannot be pickled ({exc})") from None
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

    def _drain(self, ranks: Sequence[int], streamer: Streamer) -> None:
        ray = _ray()
        live = [r for r in ranks if r not in self._dead]
        refs = [self.actors[r].drain_output.remote() for r in live]
        for rank, ref in zip(live, refs, strict=True):
            try:
                text = ray.get(ref, timeout=5)
            except Exception:  # noqa: BLE001 - a dead worker is handled by the caller
                continue
            streamer.feed(rank, text)

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
        pending: dict[Any, int] = {submit(self.actors[r]): r for r in selected}
        values: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        first_failure_at: float | None = None
        interrupted_at: float | None = None
        interrupt_reason = ""
        notes: list[str] = []
        rebuild_reason = ""
        poll = 0.002
        last_drain = start
        self.busy = True
        try:
            while pending:
                try:
                    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=poll)
                    poll = min(poll * 2, 0.1)
                    now = time.monotonic()
                    if ready or now - last_drain >= 0.1:
                        self._drain(selected, streamer)
                        last_drain = now
                    for ref in ready:
                        rank = pending.pop(ref)
                        self._collect(rank, ref, values, failures, interrupt_reason)
                    if not pending:
                        break
                    if failures and first_failure_at is None:
                        first_failure_at = now
                    if interrupted_at is None:
                        if first_failure_at is not None and now - first_failure_at > self.timeouts.hang_grace:
                            interrupt_reason = "hung"
                        elif timeout is not None and now - start > timeout:
                            interrupt_reason = "timeout"
                        if interrupt_reason:
                            interrupted_at = now
                            self._interrupt(list(pending.values()))
                    elif now - interrupted_at > self.timeouts.interrupt_grace:
                        rebuild_reason = interrupt_reason
                        break
                except KeyboardInterrupt:
                    if interrupted_at is not None and interrupt_reason == "interrupted":
                        rebuild_reason = "interrupted"  # a second interrupt: stop waiting
                        break
                    interrupt_reason = "interrupted"
                    interrupted_at = time.monotonic()
                    self._interrupt(list(pending.values()))
            # ranks that never came back
            stuck = sorted(pending.values())
            self._drain([r for r in selected if r not in stuck] + stuck, streamer)
            for rank in selected:
                streamer.finish(rank)
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
            elif interrupt_reason and interrupted_at is not None:
                notes.append(
                    f"The running ranks were interrupted ({interrupt_reason}); the workers are still usable "
                    f"and keep their state."
                )
        finally:
            self.busy = False
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

    def _interrupt(self, ranks: Sequence[int]) -> None:
        ray = _ray()
        refs = [self.actors[r].interrupt.remote() for r in ranks if r not in self._dead]
        try:
            ray.get(refs, timeout=5)
        except Exception:  # noqa: BLE001
            pass

    def _recover(self, why: str, say: Progress) -> str:
        say(f"rebuilding the worker group: {why}")
        try:
            self.rebuild(progress=say)
        except Exception as exc:  # noqa: BLE001
            return (
                f"Worker state was lost: {why}. Rebuilding the group failed ({exc}); run "
                f"`%gpu_cluster scale {self.size}` once resources are back."
            )
        return (
            f"Worker state was reset: {why}, so the group was rebuilt with {self.size} fresh worker(s) "
            f"(new process group). Variables, models and optimizers defined on the workers are gone: re-run "
            f"your setup cells."
        )


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
