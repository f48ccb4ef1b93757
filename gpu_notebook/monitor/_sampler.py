"""Per-node sampling: NVML (or host CPU/memory/network where there is no GPU) into a ring buffer.

A :class:`NodeSampler` reads every GPU of its node on a *fast tier* (utilisation, memory, power, temperature,
SM clock, throttle reasons, energy counter, and SM activity from NVML GPM on Hopper and newer) and keeps the
rows in a :class:`~gpu_notebook.monitor._ring.RingBuffer` of about an hour. Calls that are slow or take the
driver's RM lock (process lists, ``nvmlDeviceGetPcieThroughput`` which blocks ~20 ms) run on a separate *slow
tier*, at most every 10 s, so they never delay the fast one. Host metrics (CPU %, memory, network rates, load)
are sampled on every node, so a laptop or a CPU-only CI machine still has something to show.

In a Ray cluster one sampler runs per node as an actor that reserves nothing (``num_cpus=0``, no GPU), pinned
with ``NodeAffinitySchedulingStrategy``; see :func:`sampler_actor_class`. Locally it is a plain object with two
daemon threads. Time comes from an injectable clock so tests can tick it by hand.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gpu_notebook.monitor._ring import RingBuffer

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._shapes import GpuInfo, GpuMetric, HostMetric, SamplerInfo, SamplerReply

__all__ = [
    "GPU_METRICS",
    "HOST_METRICS",
    "NodeSampler",
    "GpuSource",
    "HostSource",
    "load_nvml",
    "sampler_actor_class",
]

GPU_METRICS: tuple[GpuMetric, ...] = (
    "util_gpu",  # % of time a kernel ran (nvmlDeviceGetUtilizationRates().gpu)
    "util_mem",  # % of time device memory was read/written
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "power_limit_w",
    "temp_c",
    "sm_clock_mhz",
    "throttle",  # clocks throttle reasons bitmask
    "energy_j",  # energy counter since driver load
    "sm_active",  # GPM SM activity, 0..1 (NaN when GPM is unavailable)
)
HOST_METRICS: tuple[HostMetric, ...] = (
    "cpu_percent",
    "mem_used_mib",
    "mem_total_mib",
    "net_rx_Bps",
    "net_tx_Bps",
    "load1",
)

MIN_INTERVAL_S = 0.1
MIN_SLOW_INTERVAL_S = 10.0


def load_nvml(spec: Any = "auto") -> Any | None:
    """Resolve an NVML spec to an initialised module-like object, or None when there is no NVML here.

    ``"auto"`` imports the real ``pynvml`` (package ``nvidia-ml-py``) and calls ``nvmlInit``; ``None`` means
    no NVML; a module-like object (anything with ``nvmlInit``) is used as is; any other callable is a factory
    called with no arguments (so a fake can be built inside a Ray actor).
    """
    if spec is None:
        return None
    if spec == "auto":
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        # NVMLError_LibraryNotFound / DriverNotLoaded (NVMLError derives from Exception only): no driver, no GPUs
        except Exception:  # noqa: BLE001
            return None
        return pynvml
    nvml = spec if hasattr(spec, "nvmlInit") else spec()
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - as above, for a given NVML-like module (a fake raises its own errors)
        return None
    return nvml


class GpuSource:
    """Reads all GPUs of this node through an initialised NVML module (real ``pynvml`` or :class:`FakeNVML`)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        n = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        self.gpus: list[GpuInfo] = []
        self._unsupported: list[set[str]] = [set() for _ in range(n)]
        for i, h in enumerate(self.handles):
            mem = self._call(i, "nvmlDeviceGetMemoryInfo", h)
            limit = self._call(i, "nvmlDeviceGetEnforcedPowerLimit", h)
            self.gpus.append(
                {
                    "index": i,
                    "name": _to_str(self._call(i, "nvmlDeviceGetName", h)) or "GPU",
                    "uuid": _to_str(self._call(i, "nvmlDeviceGetUUID", h)) or f"gpu-{i}",
                    "mem_total_mib": float(mem.total) / 2**20 if mem is not None else math.nan,
                    "power_limit_w": float(limit) / 1000 if limit is not None else math.nan,
                }
            )
        try:
            self.driver = _to_str(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - an NVMLError: the driver version is only shown, never needed
            self.driver = ""
        self._gpm: list[list[Any] | None] = [self._gpm_setup(i, h) for i, h in enumerate(self.handles)]

    def _call(self, i: int, fn: str, *args: Any) -> Any:
        """Call an NVML function for GPU ``i``; NaN-able None on error; NotSupported is remembered."""
        if fn in self._unsupported[i]:
            return None
        try:
            return getattr(self.nvml, fn)(*args)
        except AttributeError:
            self._unsupported[i].add(fn)
            return None
        except Exception as exc:  # noqa: BLE001 - NVMLError (of pynvml or of a fake): told apart by its value
            if getattr(exc, "value", None) in (3, 13):  # NOT_SUPPORTED, FUNCTION_NOT_FOUND
                self._unsupported[i].add(fn)
            return None

    def _gpm_setup(self, i: int, h: Any) -> list[Any] | None:
        support = self._call(i, "nvmlGpmQueryDeviceSupport", h)
        if support is None or not getattr(support, "isSupportedDevice", 0):
            return None
        try:
            samples = [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]
            self.nvml.nvmlGpmSampleGet(h, samples[0])
        except Exception:  # noqa: BLE001 - an NVMLError: this GPU has no GPM metrics (SM activity shows '-')
            return None
        return samples

    def _sm_active(self, i: int, h: Any) -> float:
        samples = self._gpm[i]
        if samples is None:
            return math.nan
        prev, cur = samples
        try:
            self.nvml.nvmlGpmSampleGet(h, cur)
            mg = self.nvml.c_nvmlGpmMetricsGet_t()
            mg.version = getattr(self.nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = prev, cur
            mg.metrics[0].metricId = getattr(self.nvml, "NVML_GPM_METRIC_SM_UTIL", 2)
            self.nvml.nvmlGpmMetricsGet(mg)
            value = float(mg.metrics[0].value) / 100.0 if mg.metrics[0].nvmlReturn == 0 else math.nan
        except Exception:  # noqa: BLE001 - an NVMLError for one reading: a gap, not an error
            value = math.nan
        samples[0], samples[1] = cur, prev  # swap: this tick's sample is the next tick's baseline
        return value

    @property
    def count(self) -> int:
        return len(self.handles)

    def read(self) -> np.ndarray:
        """One fast-tier reading: an array (gpus, len(GPU_METRICS))."""
        nv = self.nvml
        out = np.full((len(self.handles), len(GPU_METRICS)), np.nan)
        for i, h in enumerate(self.handles):
            util = self._call(i, "nvmlDeviceGetUtilizationRates", h)
            mem = self._call(i, "nvmlDeviceGetMemoryInfo", h)
            power = self._call(i, "nvmlDeviceGetPowerUsage", h)
            temp = self._call(i, "nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            clock = self._call(i, "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
            # the newer name first (drivers >= 535); older drivers only have the "throttle" one
            throttle = self._call(i, "nvmlDeviceGetCurrentClocksEventReasons", h)
            if throttle is None and "nvmlDeviceGetCurrentClocksEventReasons" in self._unsupported[i]:
                throttle = self._call(i, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
            energy = self._call(i, "nvmlDeviceGetTotalEnergyConsumption", h)
            row = out[i]
            if util is not None:
                row[0], row[1] = util.gpu, util.memory
            if mem is not None:
                row[2], row[3] = mem.used / 2**20, mem.total / 2**20
            if power is not None:
                row[4] = power / 1000.0
            row[5] = self.gpus[i]["power_limit_w"]
            if temp is not None:
                row[6] = temp
            if clock is not None:
                row[7] = clock
            if throttle is not None:
                row[8] = throttle
            if energy is not None:
                row[9] = energy / 1000.0
            row[10] = self._sm_active(i, h)
        return out

    def read_slow(self) -> list[dict[str, Any]]:
        """Slow-tier reading per GPU: processes and PCIe throughput (each PCIe call blocks ~20 ms)."""
        nv = self.nvml
        result = []
        for i, h in enumerate(self.handles):
            procs = self._call(i, "nvmlDeviceGetComputeRunningProcesses", h) or []
            tx = self._call(i, "nvmlDeviceGetPcieThroughput", h, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
            rx = self._call(i, "nvmlDeviceGetPcieThroughput", h, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
            limit = self._call(i, "nvmlDeviceGetEnforcedPowerLimit", h)
            if limit is not None:
                self.gpus[i]["power_limit_w"] = float(limit) / 1000
            result.append(
                {
                    "index": i,
                    "processes": [
                        {"pid": int(p.pid), "used_mib": (p.usedGpuMemory or 0) / 2**20} for p in procs
                    ],
                    "pcie_tx_kBps": tx,
                    "pcie_rx_kBps": rx,
                }
            )
        return result


class _ProcFile:
    """A ``/proc`` file kept open and re-read with ``pread`` (no open/close per sample)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None

    def read(self) -> str:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        chunks = []
        offset = 0
        while True:
            chunk = os.pread(self.fd, 65536, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            if len(chunk) < 65536:
                break
        return b"".join(chunks).decode("ascii", "replace")

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def __del__(self) -> None:
        self.close()


class HostSource:
    """CPU %, memory and network rates of this machine, from ``/proc`` (Linux) or ``psutil`` elsewhere."""

    def __init__(self) -> None:
        self._proc = os.path.exists("/proc/stat") and os.path.exists("/proc/meminfo")
        self._stat, self._meminfo, self._netdev = (
            _ProcFile("/proc/stat"),
            _ProcFile("/proc/meminfo"),
            _ProcFile("/proc/net/dev"),
        )
        self._psutil: Any = None
        if not self._proc:
            try:
                import psutil

                self._psutil = psutil
            except ImportError:
                self._psutil = None
        self._last_cpu: tuple[float, float] | None = None
        self._cpu_value = math.nan
        self._last_net: tuple[float, float, float] | None = None
        self.cpu_count = os.cpu_count() or 1
        self._cpu()
        self._net_rates(time.monotonic())

    def _cpu(self) -> float:
        if self._proc:
            fields = [float(x) for x in self._stat.read().split("\n", 1)[0].split()[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
            total = sum(fields[:8])
        elif self._psutil is not None:
            ct = self._psutil.cpu_times()
            idle = ct.idle + getattr(ct, "iowait", 0.0)
            total = sum(ct)
        else:
            return math.nan
        last = self._last_cpu
        if last is None or total <= last[1]:  # no clock tick since the last reading: keep the last value
            if last is None:
                self._last_cpu = (idle, total)
            return self._cpu_value
        self._last_cpu = (idle, total)
        self._cpu_value = 100.0 * (1.0 - (idle - last[0]) / (total - last[1]))
        return self._cpu_value

    def _mem(self) -> tuple[float, float]:
        if self._proc:
            info: dict[str, float] = {}
            for line in self._meminfo.read().splitlines():
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    info[key] = float(rest.split()[0]) / 1024.0
                    if len(info) == 2:
                        break
            total = info.get("MemTotal", math.nan)
            return total - info.get("MemAvailable", math.nan), total
        if self._psutil is not None:
            vm = self._psutil.virtual_memory()
            return (vm.total - vm.available) / 2**20, vm.total / 2**20
        return math.nan, math.nan

    def _net_rates(self, now: float) -> tuple[float, float]:
        rx = tx = 0.0
        try:
            if os.path.exists("/proc/net/dev"):
                for line in self._netdev.read().splitlines()[2:]:
                    name, _, rest = line.partition(":")
                    if name.strip() == "lo":
                        continue
                    cols = rest.split()
                    rx += float(cols[0])
                    tx += float(cols[8])
            elif self._psutil is not None:
                io = self._psutil.net_io_counters()
                rx, tx = float(io.bytes_recv), float(io.bytes_sent)
            else:
                return math.nan, math.nan
        except OSError:
            return math.nan, math.nan
        last, self._last_net = self._last_net, (now, rx, tx)
        if last is None or now <= last[0]:
            return math.nan, math.nan
        dt = now - last[0]
        return max(0.0, (rx - last[1]) / dt), max(0.0, (tx - last[2]) / dt)

    def read(self) -> np.ndarray:
        """One reading: an array (len(HOST_METRICS),)."""
        used, total = self._mem()
        rx, tx = self._net_rates(time.monotonic())
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            load1 = math.nan
        return np.array([self._cpu(), used, total, rx, tx, load1], dtype=np.float64)


def _to_str(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _default_node_id() -> str:
    try:
        import sys

        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - Ray half shut down: the host name identifies the node instead
        pass
    return socket.gethostname()


class NodeSampler:
    """Samples one node into a ring buffer: a fast tier (every ``interval``) and a slow tier.

    Parameters
    ----------
    node_id
        Name of the node in every export (default: the Ray node id inside Ray, else the hostname).
    nvml
        ``"auto"`` (real ``pynvml`` if the driver is there), ``None`` (host metrics only), an NVML module-like
        object (e.g. :class:`~gpu_notebook.monitor.FakeNVML`) or a zero-argument factory returning one.
    interval
        Fast-tier period in seconds (default 0.5 s = 2 Hz; at least 0.1 s).
    slow_interval
        Slow-tier period in seconds (at least 10 s).
    history_s
        Seconds of full-rate history kept (ring capacity = history_s / interval rows).
    clock
        Wall-clock seconds for sample timestamps; inject a fake clock in tests.
    host
        Also sample host CPU/memory/network.
    """

    def __init__(
        self,
        node_id: str | None = None,
        *,
        nvml: Any = "auto",
        interval: float = 0.5,
        slow_interval: float = 10.0,
        history_s: float = 3600.0,
        clock: Callable[[], float] | None = None,
        host: bool = True,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.node_id = node_id or _default_node_id()
        self.interval = max(MIN_INTERVAL_S, float(interval))
        self.slow_interval = max(MIN_SLOW_INTERVAL_S, float(slow_interval))
        self.clock = clock or time.time
        self.epoch = uuid.uuid4().hex[:12]
        self.labels = dict(labels or {})
        nv = load_nvml(nvml)
        self.gpu: GpuSource | None = None
        if nv is not None:
            try:
                self.gpu = GpuSource(nv)
            except Exception:  # noqa: BLE001 - NVML loaded but the devices cannot be read: a host-only sampler
                self.gpu = None
        self.host = HostSource() if host else None
        self.nvml_kind = (
            "none" if self.gpu is None else ("fake" if type(nv).__name__ == "FakeNVML" else "nvml")
        )
        columns: list[str] = []
        for i in range(self.gpu.count if self.gpu else 0):
            columns += [f"gpu{i}.{m}" for m in GPU_METRICS]
        if self.host is not None:
            columns += [f"host.{m}" for m in HOST_METRICS]
        self.buffer = RingBuffer(columns, capacity=max(2, int(math.ceil(history_s / self.interval))))
        self._slow: list[dict[str, Any]] = []
        self._slow_t = 0.0
        self._slow_seq = 0
        self._ticks = 0
        self._tick_cost = 0.0
        self._slow_cost = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        gpu = getattr(self, "gpu", None)
        n = gpu.count if gpu else 0
        state = "running" if getattr(self, "_threads", None) and self.running else "stopped"
        return f"NodeSampler({getattr(self, 'node_id', '?')!r}, gpus={n}, nvml={getattr(self, 'nvml_kind', '?')}, every {getattr(self, 'interval', 0):g}s, {state})"

    # -- description ----------------------------------------------------------------------------------------------
    def info(self) -> SamplerInfo:
        """Static description: node, hostname, GPUs (index, name, uuid, memory, power limit), columns."""
        return {
            "node": self.node_id,
            "hostname": socket.gethostname(),
            "epoch": self.epoch,
            "has_gpu": bool(self.gpu and self.gpu.count),
            "gpus": [g.copy() for g in (self.gpu.gpus if self.gpu else [])],
            "driver": self.gpu.driver if self.gpu else "",
            "nvml": self.nvml_kind,
            "columns": list(self.buffer.columns),
            "gpu_metrics": list(GPU_METRICS),
            "host_metrics": list(HOST_METRICS) if self.host else [],
            "interval": self.interval,
            "slow_interval": self.slow_interval,
            "capacity": self.buffer.capacity,
            "labels": dict(self.labels),
        }

    # -- sampling -------------------------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> np.ndarray:
        """Take one fast-tier sample now (or at simulated time ``now``) and store it; returns the row."""
        t0 = time.perf_counter()
        parts = []
        if self.gpu is not None:
            parts.append(self.gpu.read().ravel())
        if self.host is not None:
            parts.append(self.host.read())
        row = np.concatenate(parts) if parts else np.zeros(0)
        self.buffer.append(self.clock() if now is None else now, row)
        self._ticks += 1
        self._tick_cost += time.perf_counter() - t0
        return row

    def slow_tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Take one slow-tier sample (process lists, PCIe throughput)."""
        t0 = time.perf_counter()
        slow = self.gpu.read_slow() if self.gpu is not None else []
        with self._lock:
            self._slow = slow
            self._slow_t = self.clock() if now is None else now
            self._slow_seq += 1
        self._slow_cost += time.perf_counter() - t0
        return slow

    def read_since(self, seq: int = 0, slow_seq: int = -1, max_rows: int | None = None) -> SamplerReply:
        """New rows since ``seq`` (see :meth:`RingBuffer.read_since`), plus the slow tier if it changed.

        A read from ``seq=0`` (a reader's first, or its first after this sampler restarted) also carries
        ``info`` (see :meth:`info`), so the reader learns the columns of the rows it gets.
        """
        out = cast("SamplerReply", self.buffer.read_since(seq, max_rows))  # its other keys are set here
        out["node"] = self.node_id
        out["epoch"] = self.epoch
        if int(seq) == 0:
            out["info"] = self.info()
        with self._lock:
            out["slow_seq"] = self._slow_seq
            if self._slow_seq != slow_seq:
                out["slow"] = {"t": self._slow_t, "gpus": [dict(g) for g in self._slow]}
        return out

    def stats(self) -> dict[str, float]:
        """Tick counts and the mean CPU-side cost of a fast tick (seconds)."""
        return {
            "ticks": float(self._ticks),
            "mean_tick_s": self._tick_cost / self._ticks if self._ticks else math.nan,
            "slow_ticks": float(self._slow_seq),
            "mean_slow_tick_s": self._slow_cost / self._slow_seq if self._slow_seq else math.nan,
        }

    # -- threads --------------------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start(self) -> NodeSampler:
        """Start the fast and slow daemon threads (idempotent)."""
        if self.running:
            return self
        self._stop.clear()
        self._threads = [
            threading.Thread(
                target=self._loop,
                args=(self.interval, self.tick),
                daemon=True,
                name=f"gpu_notebook-sampler-{self.node_id[:8]}",
            ),
            threading.Thread(
                target=self._loop,
                args=(self.slow_interval, self.slow_tick),
                daemon=True,
                name=f"gpu_notebook-sampler-slow-{self.node_id[:8]}",
            ),
        ]
        for t in self._threads:
            t.start()
        return self

    def _loop(self, period: float, fn: Callable[[], Any]) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                fn()
            except Exception:  # noqa: BLE001 - a sampler must never die on one bad reading
                pass
            next_t += period
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (suspended laptop, busy host): skip, don't burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def stop(self) -> None:
        """Stop the threads (the buffer stays readable)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        self._threads = []

    def ping(self) -> str:
        """Cheap liveness check (used on Ray actors)."""
        return self.node_id


def sampler_actor_class() -> Any:
    """The Ray actor class wrapping :class:`NodeSampler` (it reserves no CPU and no GPU: ``num_cpus=0``).

    Place one per node with ``NodeAffinitySchedulingStrategy(node_id, soft=False)``; ``Monitor`` does this.
    Zero, not a sliver: the workers of a small machine hold every CPU (two workers of 0.5 CPU on one core),
    and a sampler that asks for even 0.01 CPU would wait for them forever; what it really uses (well under 1%
    of a core at 2 Hz, see ``benchmarks/monitor.py``) is not worth a reservation.
    """
    import ray

    global _ACTOR_CLS
    if _ACTOR_CLS is None:

        class _RaySampler(NodeSampler):
            def __init__(self, *args: Any, autostart: bool = True, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                if autostart:
                    self.tick()  # before the first answer: a monitor that sees this sampler has a row to show
                    self.start()

        _ACTOR_CLS = ray.remote(  # type: ignore[call-overload]
            num_cpus=0, num_gpus=0, max_restarts=3, max_concurrency=4
        )(_RaySampler)
    return _ACTOR_CLS


_ACTOR_CLS: Any = None
