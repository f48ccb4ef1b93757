"""A faithful fake of the NVML Python binding (``pynvml`` from ``nvidia-ml-py``) with scripted values.

NVML cannot run on machines without an NVIDIA driver (laptops, CI), so the sampler is tested against this fake,
and so can your own monitoring code be: pass a :class:`FakeNVML` (or a factory of one) wherever gpu_notebook
takes an ``nvml=`` argument, e.g. ``Monitor.local(nvml=lambda: FakeNVML(8))`` or
``NodeSampler("n", nvml=FakeNVML(2))``. The library never imports this module; it is a test utility, as
dask ships ``distributed.utils_test``.

A :class:`FakeNVML` instance behaves like the ``pynvml`` module: the same function names, the same argument
order, the same return types (ctypes structures with the same field names as ``c_nvmlUtilization_t``,
``c_nvmlMemory_t`` and friends, plain ``int`` for scalar queries, ``str`` for names), and the same error
hierarchy (:class:`NVMLError` whose constructor maps an error code to a subclass such as
``NVMLError_NotSupported``). Values come from per-GPU scripts: a constant or a function of the seconds since
``nvmlInit``, read from an injectable clock, so tests can drive time by hand.

Example
-------
>>> nvml = FakeNVML([FakeGPU(util=lambda t: 50 + 40 * (t > 10))], clock=lambda: 0.0)
>>> nvml.nvmlInit()
>>> h = nvml.nvmlDeviceGetHandleByIndex(0)
>>> nvml.nvmlDeviceGetUtilizationRates(h).gpu
50
"""

from __future__ import annotations

import ctypes
import time
import uuid as _uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FakeGPU",
    "FakeNVML",
    "NVMLError",
    "Script",
    "steps",
    "c_nvmlUtilization_t",
    "c_nvmlMemory_t",
    "c_nvmlMemory_v2_t",
    "c_nvmlProcessInfo_t",
]

Script = float | int | Callable[[float], float]
"""A scripted value: a constant, or a function of the seconds since ``nvmlInit``."""

# --- constants, same names and values as pynvml ---------------------------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1

nvmlClocksThrottleReasonNone = 0
nvmlClocksThrottleReasonGpuIdle = 0x1
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonSwThermalSlowdown = 0x20

_ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: ("Uninitialized", "Uninitialized"),
    NVML_ERROR_INVALID_ARGUMENT: ("InvalidArgument", "Invalid Argument"),
    NVML_ERROR_NOT_SUPPORTED: ("NotSupported", "Not Supported"),
    NVML_ERROR_NO_PERMISSION: ("NoPermission", "Insufficient Permissions"),
    NVML_ERROR_ALREADY_INITIALIZED: ("AlreadyInitialized", "Already Initialized"),
    NVML_ERROR_NOT_FOUND: ("NotFound", "Not Found"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("DriverNotLoaded", "Driver Not Loaded"),
    NVML_ERROR_TIMEOUT: ("Timeout", "Timeout"),
    NVML_ERROR_LIBRARY_NOT_FOUND: ("LibraryNotFound", "NVML Shared Library Not Found"),
    NVML_ERROR_FUNCTION_NOT_FOUND: ("FunctionNotFound", "Function Not Found"),
    NVML_ERROR_GPU_IS_LOST: ("GpuIsLost", "GPU is lost"),
    NVML_ERROR_UNKNOWN: ("Unknown", "Unknown Error"),
}


class NVMLError(Exception):
    """NVML error carrying ``.value`` (the NVML return code); ``NVMLError(code)`` builds the matching subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:  # noqa: D102 - mirrors pynvml
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_NAMES.get(self.value, ("", f"NVML Error with code {self.value}"))[1]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NVMLError, (self.value,))


for _code, (_name, _text) in _ERROR_NAMES.items():
    _cls = type(f"NVMLError_{_name}", (NVMLError,), {})
    NVMLError._valClassMapping[_code] = _cls
    globals()[f"NVMLError_{_name}"] = _cls
    __all__.append(f"NVMLError_{_name}")
NVMLError_NotSupported: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_NOT_SUPPORTED]
NVMLError_Uninitialized: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_UNINITIALIZED]
NVMLError_LibraryNotFound: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_LIBRARY_NOT_FOUND]


# --- return structures, same field names and ctypes as nvidia-ml-py ----------------------------------------------
class _PrintableStructure(ctypes.Structure):
    _fmt_: dict[str, str] = {}

    def __str__(self) -> str:
        parts = [f"{name}: {getattr(self, name)}" for name, _ in self._fields_]  # type: ignore[misc]
        return f"{type(self).__name__}({', '.join(parts)})"

    __repr__ = __str__


class c_nvmlUtilization_t(_PrintableStructure):  # noqa: N801 - NVML's name
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlMemory_t(_PrintableStructure):  # noqa: N801
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class c_nvmlMemory_v2_t(_PrintableStructure):  # noqa: N801
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlProcessInfo_t(_PrintableStructure):  # noqa: N801
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class c_nvmlGpmSupport_t(_PrintableStructure):  # noqa: N801
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


class nvmlFriendlyObject:  # noqa: N801 - pynvml returns these for process lists
    """Plain attribute bag, as ``pynvml.nvmlStructToFriendlyObject`` returns."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for k, v in dictionary.items():
            setattr(self, k, v)

    def __str__(self) -> str:
        return str(self.__dict__)


class c_nvmlGpmMetric_t:  # noqa: N801 - a Python stand-in for the ctypes struct (same fields)
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0
        self.metricInfo = None


class c_nvmlGpmMetricsGet_t:  # noqa: N801
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(16)]


class _GpmSample:
    def __init__(self) -> None:
        self.device: int | None = None
        self.t = 0.0


# --- scripted GPUs ----------------------------------------------------------------------------------------------
def steps(points: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """A piecewise-constant script: ``steps([(0, 10), (30, 90)])`` is 10 until t=30 s, then 90."""
    pts = sorted(points)

    def script(t: float) -> float:
        value = pts[0][1]
        for t0, v in pts:
            if t >= t0:
                value = v
        return value

    return script


def _eval(script: Script | None, t: float, default: float = 0.0) -> float:
    if script is None:
        return default
    if callable(script):
        return float(script(t))
    return float(script)


@dataclass
class FakeGPU:
    """One simulated GPU; each metric is a :data:`Script` (constant or ``f(seconds_since_init)``).

    ``power_w=None`` derives power from utilisation (idle 15% of the limit, linear to the limit at 100%),
    ``temp_c=None`` derives temperature from power, ``sm_clock_mhz=None`` is the max clock unless idle.
    ``unsupported`` names NVML functions that raise ``NVMLError_NotSupported`` for this GPU (e.g. GeForce cards
    without ``nvmlDeviceGetTotalEnergyConsumption``). ``gpm=True`` makes GPM (SM activity) available, from the
    ``sm_active`` script (a fraction 0..1; default util/100 * 0.8).
    """

    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_mib: int = 81920
    power_limit_w: float = 400.0
    util: Script = 0.0
    mem_util: Script | None = None
    mem_used_mib: Script = 512.0
    power_w: Script | None = None
    temp_c: Script | None = None
    sm_clock_mhz: Script | None = None
    max_sm_clock_mhz: int = 1410
    sm_active: Script | None = None
    gpm: bool = False
    processes: Sequence[tuple[int, int]] = ()
    pcie_tx_kbps: Script = 1000.0
    pcie_rx_kbps: Script = 2000.0
    uuid: str = field(default_factory=lambda: f"GPU-{_uuid.uuid4()}")
    unsupported: Iterable[str] = ()


class _Handle:
    """Stand-in for ``c_nvmlDevice_t``; only identity and the index matter."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<FakeNVML device handle {self.index}>"


class FakeNVML:
    """A module-like fake of ``pynvml``. Pass it wherever the sampler accepts an NVML module.

    Parameters
    ----------
    gpus
        The simulated GPUs, or a count of identical idle ones.
    clock
        Seconds, monotonic; scripts see ``clock() - clock_at_nvmlInit``. Defaults to :func:`time.monotonic`.
    driver_version
        What ``nvmlSystemGetDriverVersion`` returns.
    library_missing
        Make ``nvmlInit`` raise ``NVMLError_LibraryNotFound``, as on a machine without the NVIDIA driver.

    Attributes
    ----------
    calls : collections.Counter
        How many times each NVML function was called (tests check the fast tier avoids slow calls).
    """

    NVMLError = NVMLError

    def __init__(
        self,
        gpus: Sequence[FakeGPU] | int = 0,
        *,
        clock: Callable[[], float] | None = None,
        driver_version: str = "550.54.15",
        library_missing: bool = False,
    ) -> None:
        self.gpus: list[FakeGPU] = [FakeGPU() for _ in range(gpus)] if isinstance(gpus, int) else list(gpus)
        self.clock = clock or time.monotonic
        self.driver_version = driver_version
        self.library_missing = library_missing
        self.calls: Counter[str] = Counter()
        self._init_count = 0
        self._t0 = 0.0
        self._energy_mj = [0.0] * len(self.gpus)
        self._energy_t: list[float | None] = [None] * len(self.gpus)
        for k, v in globals().items():  # expose constants, error classes and structs like the module does
            if k.startswith(("NVML_", "nvmlClocksThrottleReason", "NVMLError_", "c_nvml")):
                setattr(self, k, v)

    @classmethod
    def from_specs(cls, specs: Sequence[dict[str, Any]], **kwargs: Any) -> FakeNVML:
        """Build from plain dicts of :class:`FakeGPU` fields: ``FakeNVML.from_specs([{"util": 80}] * 8)``.

        ``functools.partial(FakeNVML.from_specs, specs)`` is a picklable factory for Ray sampler actors.
        """
        return cls([FakeGPU(**spec) for spec in specs], **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # picklable (cloudpickle) so fake samplers can run in Ray actors
        return dict(self.__dict__)

    # -- helpers --------------------------------------------------------------------------------------------------
    def _t(self) -> float:
        return self.clock() - self._t0

    def _enter(self, fn: str, handle: _Handle | None = None) -> FakeGPU | None:
        self.calls[fn] += 1
        if self._init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if fn in set(gpu.unsupported):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _util(self, gpu: FakeGPU, t: float) -> float:
        return min(100.0, max(0.0, _eval(gpu.util, t)))

    def _power_mw(self, gpu: FakeGPU, t: float) -> float:
        if gpu.power_w is not None:
            return _eval(gpu.power_w, t) * 1000.0
        idle = 0.15 * gpu.power_limit_w
        return (idle + (gpu.power_limit_w - idle) * self._util(gpu, t) / 100.0) * 1000.0

    # -- init / system --------------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.library_missing:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if self._init_count == 0:
            self._t0 = self.clock()
        self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= int(index) < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(int(index))

    # -- identity ------------------------------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        gpu = self._enter("nvmlDeviceGetName", handle)
        assert gpu is not None
        return gpu.name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._enter("nvmlDeviceGetUUID", handle)
        assert gpu is not None
        return gpu.uuid

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return handle.index

    # -- fast-tier queries ----------------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> c_nvmlUtilization_t:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        assert gpu is not None
        t = self._t()
        util = self._util(gpu, t)
        mem = _eval(gpu.mem_util, t, default=util * 0.6)
        return c_nvmlUtilization_t(int(round(util)), int(round(min(100.0, max(0.0, mem)))))

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        assert gpu is not None
        total = gpu.memory_total_mib * 2**20
        used = int(min(total, max(0.0, _eval(gpu.mem_used_mib, self._t()))) * 2**20)
        if not version:
            return c_nvmlMemory_t(total, total - used, used)
        reserved = min(total - used, 512 * 2**20)
        return c_nvmlMemory_v2_t(int(version), total, reserved, total - used - reserved, used)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetPowerUsage", handle)
        assert gpu is not None
        return int(round(self._power_mw(gpu, self._t())))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        assert gpu is not None
        return int(round(gpu.power_limit_w * 1000))

    nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        gpu = self._enter("nvmlDeviceGetTemperature", handle)
        assert gpu is not None
        if int(sensor) != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        t = self._t()
        if gpu.temp_c is not None:
            return int(round(_eval(gpu.temp_c, t)))
        return int(round(30 + 50 * self._power_mw(gpu, t) / (gpu.power_limit_w * 1000)))

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:  # noqa: A002 - pynvml's name
        gpu = self._enter("nvmlDeviceGetClockInfo", handle)
        assert gpu is not None
        t = self._t()
        if int(type) == NVML_CLOCK_MEM:
            return 1593
        if int(type) not in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if gpu.sm_clock_mhz is not None:
            return int(round(_eval(gpu.sm_clock_mhz, t)))
        return gpu.max_sm_clock_mhz if self._util(gpu, t) > 0 else 210

    def _clock_reasons(self, fn: str, handle: _Handle) -> int:
        gpu = self._enter(fn, handle)
        assert gpu is not None
        t = self._t()
        reasons = 0
        if self._util(gpu, t) < 1:
            reasons |= nvmlClocksThrottleReasonGpuIdle
        if self._power_mw(gpu, t) >= gpu.power_limit_w * 1000:
            reasons |= nvmlClocksThrottleReasonSwPowerCap
        if gpu.temp_c is not None and _eval(gpu.temp_c, t) >= 87:
            reasons |= nvmlClocksThrottleReasonSwThermalSlowdown
        return reasons

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._clock_reasons("nvmlDeviceGetCurrentClocksEventReasons", handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._clock_reasons("nvmlDeviceGetCurrentClocksThrottleReasons", handle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        assert gpu is not None
        i, now = handle.index, self._t()
        last = self._energy_t[i]
        if last is not None and now > last:
            n = max(1, min(10_000, int((now - last) / 0.05)))
            dt = (now - last) / n
            self._energy_mj[i] += sum(self._power_mw(gpu, last + (k + 0.5) * dt) for k in range(n)) * dt
        self._energy_t[i] = now
        return int(self._energy_mj[i])

    # -- slow-tier queries ----------------------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[nvmlFriendlyObject]:
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        assert gpu is not None
        return [
            nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": mib * 2**20,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, mib in gpu.processes
        ]

    def nvmlDeviceGetPcieThroughput(self, device: _Handle, counter: int) -> int:
        handle = device
        gpu = self._enter("nvmlDeviceGetPcieThroughput", handle)
        assert gpu is not None
        t = self._t()
        if int(counter) == NVML_PCIE_UTIL_TX_BYTES:
            return int(_eval(gpu.pcie_tx_kbps, t))
        if int(counter) == NVML_PCIE_UTIL_RX_BYTES:
            return int(_eval(gpu.pcie_rx_kbps, t))
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    # -- GPM (Hopper+ SM activity) --------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: _Handle) -> c_nvmlGpmSupport_t:
        handle = device
        gpu = self._enter("nvmlGpmQueryDeviceSupport", handle)
        assert gpu is not None
        return c_nvmlGpmSupport_t(NVML_GPM_SUPPORT_VERSION, 1 if gpu.gpm else 0)

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        return _GpmSample()

    def nvmlGpmSampleFree(self, gpmSample: _GpmSample) -> None:  # noqa: N803 - pynvml's name
        self._enter("nvmlGpmSampleFree")

    def nvmlGpmSampleGet(self, device: _Handle, gpmSample: _GpmSample) -> _GpmSample:  # noqa: N803
        handle, sample = device, gpmSample
        gpu = self._enter("nvmlGpmSampleGet", handle)
        assert gpu is not None
        if not gpu.gpm:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample.device, sample.t = handle.index, self._t()
        return sample

    def nvmlGpmMetricsGet(self, metricsGet: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:  # noqa: N803
        metrics_get = metricsGet
        self._enter("nvmlGpmMetricsGet")
        s1, s2 = metrics_get.sample1, metrics_get.sample2
        if s1 is None or s2 is None or s1.device is None or s1.device != s2.device:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[s2.device]
        for m in metrics_get.metrics[: metrics_get.numMetrics]:
            util = self._util(gpu, s2.t)
            if m.metricId == NVML_GPM_METRIC_SM_UTIL:
                m.value = 100.0 * _eval(gpu.sm_active, s2.t, default=util / 100 * 0.8)
            elif m.metricId == NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                m.value = util * 0.5
            elif m.metricId == NVML_GPM_METRIC_DRAM_BW_UTIL:
                m.value = util * 0.4
            else:
                m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return metrics_get
