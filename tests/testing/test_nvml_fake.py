"""The fake NVML: same names, return types and errors as nvidia-ml-py's pynvml; scripted values."""

from __future__ import annotations

import pickle

import pytest

from gpu_notebook.testing import nvml as fk
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML, steps

pynvml = pytest.importorskip("pynvml")

FUNCTIONS = [
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetPcieThroughput",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_faked_function_exists_in_pynvml_with_compatible_signature(name: str) -> None:
    import inspect

    assert hasattr(pynvml, name)
    real = [p.name for p in inspect.signature(getattr(pynvml, name)).parameters.values()]
    fake = [p.name for p in inspect.signature(getattr(FakeNVML(1), name)).parameters.values()]
    assert len(fake) == len(real), (name, real, fake)


@pytest.mark.parametrize(
    "struct",
    [
        "c_nvmlUtilization_t",
        "c_nvmlMemory_t",
        "c_nvmlMemory_v2_t",
        "c_nvmlProcessInfo_t",
        "c_nvmlGpmSupport_t",
    ],
)
def test_structs_have_pynvml_field_names_and_ctypes(struct: str) -> None:
    real = getattr(pynvml, struct)._fields_
    fake = getattr(fk, struct)._fields_
    assert [(n, t) for n, t in fake] == [(n, t) for n, t in real]


def test_constants_match_pynvml() -> None:
    for name in dir(fk):
        if name.startswith(("NVML_", "nvmlClocksThrottleReason")):
            assert getattr(fk, name) == getattr(pynvml, name), name


def test_calls_before_init_raise_uninitialized_like_pynvml() -> None:
    nv = FakeNVML(1)
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlDeviceGetCount()
    assert e.value.value == pynvml.NVML_ERROR_UNINITIALIZED
    assert type(e.value).__name__ == "NVMLError_Uninitialized"


def test_error_class_mapping_mirrors_pynvml() -> None:
    for code in (
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_GPU_IS_LOST,
    ):
        assert type(fk.NVMLError(code)).__name__ == type(pynvml.NVMLError(code)).__name__
        assert str(fk.NVMLError(code)) == str(pynvml.NVMLError(code))
    err = pickle.loads(pickle.dumps(fk.NVMLError(3)))
    assert isinstance(err, fk.NVMLError_NotSupported) and err.value == 3


def test_library_missing_raises_library_not_found() -> None:
    nv = FakeNVML(2, library_missing=True)
    with pytest.raises(fk.NVMLError_LibraryNotFound):
        nv.nvmlInit()


def test_return_types_and_scripted_values(clock: Clock) -> None:
    gpu = FakeGPU(
        name="NVIDIA H100 80GB HBM3",
        memory_total_mib=81559,
        power_limit_w=700,
        util=steps([(0, 20), (30, 95)]),
        mem_used_mib=lambda t: 1000 + 10 * t,
        processes=[(42, 2048)],
    )
    nv = FakeNVML([gpu, FakeGPU()], clock=clock)
    nv.nvmlInit()
    assert nv.nvmlDeviceGetCount() == 2
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3" and isinstance(nv.nvmlDeviceGetName(h), str)
    assert nv.nvmlDeviceGetUUID(h).startswith("GPU-")
    u = nv.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(u, fk.c_nvmlUtilization_t) and u.gpu == 20
    clock.t += 31
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 95
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(mem, fk.c_nvmlMemory_t)
    assert mem.used == 1310 * 2**20 and mem.total == 81559 * 2**20 and mem.free == mem.total - mem.used
    mem2 = nv.nvmlDeviceGetMemoryInfo(h, version=2)
    assert isinstance(mem2, fk.c_nvmlMemory_v2_t) and mem2.used == mem.used
    power = nv.nvmlDeviceGetPowerUsage(h)
    assert isinstance(power, int) and 600_000 < power <= 700_000  # milliwatts
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert isinstance(nv.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU), int)
    assert nv.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    assert procs[0].pid == 42 and procs[0].usedGpuMemory == 2048 * 2**20
    assert nv.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 1000
    idle = nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(idle) & pynvml.nvmlClocksThrottleReasonGpuIdle
    assert not nv.nvmlDeviceGetCurrentClocksThrottleReasons(h) & pynvml.nvmlClocksThrottleReasonGpuIdle
    with pytest.raises(fk.NVMLError) as e:
        nv.nvmlDeviceGetHandleByIndex(5)
    assert e.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_energy_counter_integrates_power(clock: Clock) -> None:
    nv = FakeNVML([FakeGPU(power_w=250.0)], clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    e0 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t += 10
    e1 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert isinstance(e1, int) and e1 - e0 == pytest.approx(2_500_000, rel=1e-3)  # mJ


def test_unsupported_functions_raise_not_supported(clock: Clock) -> None:
    nv = FakeNVML([FakeGPU(unsupported=["nvmlDeviceGetTotalEnergyConsumption"])], clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fk.NVMLError_NotSupported):
        nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert nv.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1


def test_gpm_sm_activity(clock: Clock) -> None:
    nv = FakeNVML([FakeGPU(gpm=True, sm_active=0.625), FakeGPU()], clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    assert nv.nvmlGpmQueryDeviceSupport(nv.nvmlDeviceGetHandleByIndex(1)).isSupportedDevice == 0
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s1)
    clock.t += 1
    nv.nvmlGpmSampleGet(h, s2)
    mg = nv.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, 1, s1, s2
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    assert nv.nvmlGpmMetricsGet(mg).metrics[0].value == pytest.approx(62.5)


def test_every_public_fake_function_has_pynvml_parameter_names() -> None:
    """All of the fake's nvml* functions, not just the sampled ones: same names, so keyword calls work too."""
    import inspect

    nv = FakeNVML(1)
    for name in dir(nv):
        if not name.startswith("nvml") or not callable(getattr(nv, name)):
            continue
        real = [p.name for p in inspect.signature(getattr(pynvml, name)).parameters.values()]
        fake = [p.name for p in inspect.signature(getattr(nv, name)).parameters.values()]
        assert fake == real, (name, real, fake)
    nv.nvmlInitWithFlags(0)  # pynvml.nvmlInitWithFlags(flags): the fake used to take no argument
    assert nv.nvmlDeviceGetCount() == 1
