"""A small local process group: N spawned worker processes with torch.distributed initialised.

:class:`LocalGroup` offers the one method the doctor and the benchmarks need from a cluster,
``call(fn, *args, **kwargs) -> list`` (one return value per rank), without Ray. The tests use it for a real
2-rank gloo group on 127.0.0.1, and ``scripts/gpu_check_doctor.py`` for NCCL on a GPU machine. Workers are
persistent: state kept in a worker between calls survives until :meth:`LocalGroup.stop`.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from gpu_notebook.distributed import torchrun_env

__all__ = ["LocalGroup", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _worker_main(
    rank: int,
    world_size: int,
    backend: str,
    addr: str,
    port: int,
    inbox: Any,
    outbox: Any,
    env: dict[str, str],
) -> None:
    os.environ.update(env)
    os.environ.update(torchrun_env(rank=rank, world_size=world_size, master_addr=addr, master_port=port))
    try:
        import torch
        import torch.distributed as dist

        if backend == "nccl":
            torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world_size)
        outbox.put(("ready", rank, None, None))
    except BaseException:  # noqa: BLE001 - report start-up failures to the parent
        outbox.put(("ready", rank, None, traceback.format_exc()))
        return
    while True:
        msg = inbox.get()
        if msg is None:
            break
        call_id, fn, args, kwargs = msg
        try:
            outbox.put((call_id, rank, fn(*args, **kwargs), None))
        except BaseException:  # noqa: BLE001 - errors travel back as text
            outbox.put((call_id, rank, None, traceback.format_exc()))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the worker exits anyway; its peers may be gone already
        pass


class LocalGroup:
    """``world_size`` local worker processes joined in one torch.distributed process group.

    Parameters
    ----------
    world_size
        Number of ranks.
    backend
        ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank: rank r uses ``cuda:r % device_count``).
    host
        Address of the rendezvous (``MASTER_ADDR``).
    env
        Extra environment variables for the workers (e.g. ``{"NCCL_DEBUG": "WARN"}``).

    Examples
    --------
    >>> with LocalGroup(2) as group:                       # doctest: +SKIP
    ...     result = bench_allreduce(group, max_bytes=2**20)
    """

    def __init__(
        self,
        world_size: int = 2,
        backend: str = "gloo",
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        self.world_size = int(world_size)
        self.backend = backend
        self.host = host
        self.name = f"local-{backend}-{world_size}"
        self._env = dict(env or {})
        self._start_timeout = start_timeout
        self._procs: list[Any] = []
        self._inboxes: list[Any] = []
        self._outbox: Any = None
        self._next_id = 0

    def start(self) -> LocalGroup:
        """Spawn the workers and wait until every rank has joined the process group."""
        if self._procs:
            return self
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        port = free_port(self.host)
        self._outbox = ctx.Queue()
        for rank in range(self.world_size):
            inbox = ctx.Queue()
            proc = ctx.Process(
                target=_worker_main,
                args=(rank, self.world_size, self.backend, self.host, port, inbox, self._outbox, self._env),
                daemon=True,
                name=f"gnb-local-rank{rank}",
            )
            proc.start()
            self._procs.append(proc)
            self._inboxes.append(inbox)
        try:
            errors = self._collect("ready", self._start_timeout)
        except BaseException:
            self.stop()
            raise
        failed = {r: e for r, (_, e) in errors.items() if e}
        if failed:
            self.stop()
            raise RuntimeError(
                "LocalGroup start failed:\n" + "\n".join(f"rank {r}:\n{e}" for r, e in failed.items())
            )
        return self

    def _collect(self, call_id: Any, timeout: float | None) -> dict[int, tuple[Any, str | None]]:
        """Each rank's answer to ``call_id``; a rank whose process died fails the call at once (no wait for
        ``timeout``), naming the rank and its exit code."""
        results: dict[int, tuple[Any, str | None]] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        dead_since: float | None = None
        while len(results) < self.world_size:
            wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                cid, rank, value, err = self._outbox.get(timeout=wait)
            except queue.Empty:
                missing = sorted(set(range(self.world_size)) - set(results))
                dead = {r: self._procs[r].exitcode for r in missing if not self._procs[r].is_alive()}
                if dead:
                    # an answer sent just before exiting may still be in the pipe: give it a moment
                    dead_since = dead_since or time.monotonic()
                    if time.monotonic() - dead_since > 1.0:
                        raise RuntimeError(
                            "LocalGroup: "
                            + ", ".join(f"rank {r} died (exit code {code})" for r, code in dead.items())
                            + " without answering; the group is broken: stop() it and start a new one"
                        ) from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"ranks {missing} did not answer in {timeout} s") from None
                continue
            if cid == call_id:
                results[rank] = (value, err)
        return results

    def call(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = 600.0, **kwargs: Any
    ) -> list[Any]:
        """Run picklable ``fn(*args, **kwargs)`` in every rank; the per-rank return values, rank order.

        Raises ``RuntimeError`` with every failing rank's traceback when any rank raised.
        """
        if not self._procs:
            self.start()
        self._next_id += 1
        call_id = self._next_id
        for inbox in self._inboxes:
            inbox.put((call_id, fn, args, kwargs))
        results = self._collect(call_id, timeout)
        failed = {r: e for r, (_, e) in sorted(results.items()) if e}
        if failed:
            raise RuntimeError(
                f"{getattr(fn, '__name__', fn)} failed on ranks {sorted(failed)}:\n"
                + "\n".join(f"--- rank {r} ---\n{e}" for r, e in failed.items())
            )
        return [results[r][0] for r in range(self.world_size)]

    def stop(self) -> None:
        """Ask the workers to leave the process group and exit; terminate any that do not."""
        for inbox in self._inboxes:
            try:
                inbox.put(None)
            except Exception:  # noqa: BLE001 - a broken queue: the worker is terminated below
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self._procs, self._inboxes = [], []

    def __enter__(self) -> LocalGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._procs else "stopped"
        return f"<LocalGroup {self.backend} world_size={self.world_size} {state}>"
