"""The aggregator: pulls only what is new from every node's sampler and keeps a merged, bounded history.

Samplers are reached through handles: :class:`LocalHandle` wraps an in-process :class:`NodeSampler`,
:class:`RayHandle` wraps a sampler actor. One :meth:`Aggregator.pull` sends one request per node (all in
flight at once for Ray), waits at most ``timeout`` seconds, and copies the new rows into a per-node ring
buffer. A node that does not answer in time is marked stale and asked again on the next pull from where it
left off, so nothing is lost unless it fell more than its ring capacity behind; a node whose sampler restarted
(new ``epoch``) is re-read from zero, and if it came back with other columns (a GPU fell off the bus) the node's
series start again with the new ones. Pull, not push: slow or preempted nodes show up as gaps, never as a
stuck queue.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gpu_notebook.monitor._ring import RingBuffer
from gpu_notebook.monitor._sampler import GPU_METRICS, HOST_METRICS, NodeSampler

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._shapes import (
        GpuInfo,
        GpuReading,
        GpuSeries,
        HostReading,
        HostSeries,
        Latest,
        Rows,
        SamplerInfo,
        SamplerReply,
    )

__all__ = ["Aggregator", "LocalHandle", "RayHandle", "NodeState"]


class LocalHandle:
    """A sampler in this process."""

    remote = False

    def __init__(self, sampler: NodeSampler) -> None:
        self.sampler = sampler
        self.node_id = sampler.node_id

    def info(self) -> SamplerInfo:
        return self.sampler.info()

    def read_since(self, seq: int, slow_seq: int) -> SamplerReply:
        return self.sampler.read_since(seq, slow_seq)

    def stop(self) -> None:
        self.sampler.stop()


class RayHandle:
    """A sampler running as a Ray actor (see :func:`~gpu_notebook.monitor._sampler.sampler_actor_class`)."""

    remote = True

    def __init__(self, actor: Any, node_id: str, info: SamplerInfo | None = None) -> None:
        self.actor = actor
        self.node_id = node_id
        self._info = info

    def info(self) -> SamplerInfo:
        if self._info is None:
            import ray

            self._info = ray.get(self.actor.info.remote(), timeout=30)
        return self._info

    def read_since(self, seq: int, slow_seq: int) -> Any:
        return self.actor.read_since.remote(seq, slow_seq)

    def stop(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - the actor (or its node, or Ray) may already be gone: nothing to end
            pass


@dataclass
class NodeState:
    """What the aggregator knows about one node."""

    node: str
    info: SamplerInfo
    buffer: RingBuffer
    seq: int = 0
    slow_seq: int = -1
    epoch: str = ""
    slow: dict[str, Any] = field(default_factory=dict)
    up: bool = True
    last_seen: float = 0.0
    dropped: int = 0
    errors: int = 0
    col: dict[str, int] = field(default_factory=dict)
    error: str = ""  # why the last pull of this node failed ("" when it answered)

    @property
    def gpus(self) -> list[GpuInfo]:
        return list(self.info.get("gpus", []))

    @property
    def has_gpu(self) -> bool:
        return bool(self.info.get("has_gpu"))

    def gpu_cols(self, metric: str) -> list[int]:
        return [self.col[f"gpu{g['index']}.{metric}"] for g in self.gpus]

    def host_col(self, metric: str) -> int | None:
        return self.col.get(f"host.{metric}")


class Aggregator:
    """Merges the samples of many nodes; one pull asks each node only for rows it has not sent yet.

    Parameters
    ----------
    handles
        One handle per node.
    history_s
        Seconds of history kept per node (at the node's own sampling interval).
    timeout
        Seconds a pull waits for remote samplers before marking the rest stale.
    clock
        Wall-clock seconds (injectable for tests).
    """

    def __init__(
        self,
        handles: Iterable[LocalHandle | RayHandle] = (),
        *,
        history_s: float = 3600.0,
        timeout: float = 0.5,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.history_s = float(history_s)
        self.timeout = float(timeout)
        self.clock = clock or time.time
        self.handles: dict[str, LocalHandle | RayHandle] = {}
        self.nodes: dict[str, NodeState] = {}
        self._inflight: dict[str, Any] = {}
        self._lock = threading.RLock()  # one pull (or add/remove) at a time
        self._nodes_lock = threading.Lock()  # held only to change or copy ``nodes``/``handles``
        self.pulls = 0
        self.rows_in = 0
        self.pull_cost_s = 0.0
        for h in handles:
            self.add(h)

    def __repr__(self) -> str:
        states = self.states()
        gpus = sum(len(s.gpus) for _, s in states)
        return f"Aggregator({len(states)} nodes, {gpus} GPUs, pulls={self.pulls})"

    def states(self) -> list[tuple[str, NodeState]]:
        """A copy of ``nodes.items()`` taken under the lock: safe to iterate while the pull thread adds nodes."""
        with self._nodes_lock:
            return list(self.nodes.items())

    def _new_state(self, info: SamplerInfo) -> NodeState:
        interval = float(info.get("interval", 0.5))
        cols = list(info["columns"])
        return NodeState(
            node=str(info["node"]),
            info=info,
            buffer=RingBuffer(cols, capacity=max(2, int(math.ceil(self.history_s / interval)))),
            epoch=str(info.get("epoch", "")),
            col={c: i for i, c in enumerate(cols)},
        )

    def add(self, handle: LocalHandle | RayHandle) -> NodeState:
        """Register a node's sampler."""
        state = self._new_state(handle.info())
        with self._lock, self._nodes_lock:
            self.handles[state.node] = handle
            self.nodes[state.node] = state
        return state

    def remove(self, node: str) -> None:
        """Forget a node (its history goes too)."""
        with self._lock, self._nodes_lock:
            self.handles.pop(node, None)
            self.nodes.pop(node, None)
            self._inflight.pop(node, None)

    # -- pulling --------------------------------------------------------------------------------------------------
    def _ingest(self, state: NodeState, reply: SamplerReply) -> int:
        if reply.get("epoch") and reply["epoch"] != state.epoch:
            # the sampler restarted: its sequence numbers start again from zero
            state.epoch = reply["epoch"]
            state.seq, state.slow_seq = 0, -1
            return 0
        info = reply.get("info")  # a sampler sends its description with the rows from 0 (first read, restart)
        if info is not None and list(info["columns"]) != state.buffer.columns:
            state = self._reshape(state, info)
        t, data = reply["t"], reply["data"]
        if len(t) and data.shape[1] != len(state.buffer.columns):
            raise ValueError(
                f"node {state.node} sent {data.shape[1]} columns, expected {len(state.buffer.columns)}"
                " (its sampler restarted with other GPUs and sent no description)"
            )
        if len(t):
            state.buffer.append_many(t, data)
        state.seq = int(reply["seq"])
        state.dropped += int(reply.get("dropped", 0))
        if "slow" in reply:
            state.slow = reply["slow"]
            state.slow_seq = int(reply["slow_seq"])
        state.up = True
        state.error = ""
        state.last_seen = self.clock()
        return len(t)

    def _reshape(self, old: NodeState, info: SamplerInfo) -> NodeState:
        """The node's sampler restarted with other columns (a GPU appeared or disappeared): its series start
        again with the new columns, like a new node under the same name (the old history goes)."""
        state = self._new_state({**info, "node": old.node})
        state.epoch = old.epoch
        state.dropped, state.errors = old.dropped, old.errors
        handle = self.handles.get(old.node)
        if isinstance(handle, RayHandle):
            handle._info = state.info
        with self._nodes_lock:
            self.nodes[old.node] = state  # one swap: readers see the old state or the new one, never a mix
        return state

    def _failed(self, state: NodeState, exc: BaseException) -> None:
        state.up = False
        state.errors += 1
        state.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]

    def pull(self) -> int:
        """Ask every node for its new rows; returns how many rows arrived."""
        t0 = time.perf_counter()
        got = 0
        with self._lock:
            refs: dict[Any, str] = {}
            for node, h in list(self.handles.items()):
                state = self.nodes[node]
                if not h.remote:
                    try:
                        got += self._ingest(state, h.read_since(state.seq, state.slow_seq))
                    except Exception as exc:  # noqa: BLE001 - one node's failed read marks it down, never the others
                        self._failed(state, exc)
                    continue
                ref = self._inflight.get(node)
                if ref is None:
                    ref = h.read_since(state.seq, state.slow_seq)
                    self._inflight[node] = ref
                refs[ref] = node
            if refs:
                import ray

                ready, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=self.timeout)
                for ref in ready:
                    node = refs[ref]
                    self._inflight.pop(node, None)
                    state = self.nodes[node]
                    try:
                        got += self._ingest(state, ray.get(ref))
                    # actor died (node lost, preempted), any Ray error: a gap, not an error
                    except Exception as exc:  # noqa: BLE001
                        self._failed(state, exc)
                for ref in not_ready:
                    self.nodes[refs[ref]].up = False
                    self.nodes[refs[ref]].error = f"no answer within {self.timeout:g} s"
            self.pulls += 1
            self.rows_in += got
        self.pull_cost_s += time.perf_counter() - t0
        return got

    # -- queries --------------------------------------------------------------------------------------------------
    def gpu_list(self) -> list[tuple[str, GpuInfo]]:
        """``(node, gpu_info)`` for every GPU, node order then GPU index."""
        return [(node, g) for node, s in self.states() for g in s.gpus]

    def gpu_series(self, metric: str, since_t: float) -> list[GpuSeries]:
        """One entry per GPU: node, index, name, uuid, ``t`` and ``y`` arrays since ``since_t``."""
        if metric not in GPU_METRICS:
            raise KeyError(f"unknown GPU metric {metric!r}; one of {GPU_METRICS}")
        out: list[GpuSeries] = []
        for node, s in self.states():
            if not s.gpus:
                continue
            t, data = s.buffer.window(since_t)
            for g, c in zip(s.gpus, s.gpu_cols(metric), strict=True):
                out.append(
                    {
                        "node": node,
                        "index": g["index"],
                        "name": g["name"],
                        "uuid": g["uuid"],
                        "t": t,
                        "y": data[:, c],
                    }
                )
        return out

    def host_series(self, metric: str, since_t: float) -> list[HostSeries]:
        """One entry per node that samples host metrics: node, ``t`` and ``y`` since ``since_t``."""
        if metric not in HOST_METRICS:
            raise KeyError(f"unknown host metric {metric!r}; one of {HOST_METRICS}")
        out: list[HostSeries] = []
        for node, s in self.states():
            c = s.host_col(metric)
            if c is None:
                continue
            t, data = s.buffer.window(since_t)
            out.append({"node": node, "t": t, "y": data[:, c]})
        return out

    def latest(self) -> Latest:
        """The newest reading: ``{"gpus": [row dicts], "hosts": [row dicts]}``."""
        gpus: list[GpuReading] = []
        hosts: list[HostReading] = []
        for node, s in self.states():
            last = s.buffer.latest()
            if last is None:
                continue
            t, row = last
            for g in s.gpus:
                d: dict[str, Any] = {
                    "node": node,
                    "index": g["index"],
                    "name": g["name"],
                    "uuid": g["uuid"],
                    "t": t,
                    "up": s.up,
                }
                for m in GPU_METRICS:
                    d[m] = float(row[s.col[f"gpu{g['index']}.{m}"]])
                gpus.append(cast("GpuReading", d))  # the metric keys are GPU_METRICS, filled just above
            if s.host_col("cpu_percent") is not None:
                h: dict[str, Any] = {"node": node, "t": t, "up": s.up, "has_gpu": s.has_gpu}
                for hm in HOST_METRICS:
                    h[hm] = float(row[s.col[f"host.{hm}"]])
                hosts.append(cast("HostReading", h))  # the metric keys are HOST_METRICS, filled just above
        return {"gpus": gpus, "hosts": hosts}

    def rows_since(self, node: str, seq: int) -> Rows:
        """New merged rows of one node since ``seq`` (for consumers that keep their own copy)."""
        return self.nodes[node].buffer.read_since(seq)

    def stop(self) -> None:
        """Stop every sampler."""
        with self._nodes_lock:
            handles = list(self.handles.values())
        for h in handles:
            h.stop()


def window_stats(values: np.ndarray) -> dict[str, float]:
    """mean / min / max / p95 / p5 of finite values (NaN when none)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {"mean": math.nan, "min": math.nan, "max": math.nan, "p95": math.nan, "p5": math.nan, "n": 0}
    return {
        "mean": float(v.mean()),
        "min": float(v.min()),
        "max": float(v.max()),
        "p95": float(np.percentile(v, 95)),
        "p5": float(np.percentile(v, 5)),
        "n": int(v.size),
    }
