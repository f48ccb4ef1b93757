"""The NVML probe against a fake ``pynvml`` (no GPU here); the fake is checked against the real module's API."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from gpu_notebook.doctor import ERROR, OK, WARNING, analyze
from gpu_notebook.doctor._facts import _nvml_facts


class _NVMLError(Exception):
    pass


def make_fake_pynvml() -> types.ModuleType:
    """A two-GPU H100 node: GPU 1 has 2 volatile uncorrected ECC errors; persistence mode is off."""
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError  # type: ignore[attr-defined]
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1  # type: ignore[attr-defined]
    m.NVML_VOLATILE_ECC = 0  # type: ignore[attr-defined]
    m.NVML_AGGREGATE_ECC = 1  # type: ignore[attr-defined]
    calls: list[str] = []

    def fn(name: str, impl: Any) -> None:
        def wrapper(*args: Any) -> Any:
            calls.append(name)
            return impl(*args)

        setattr(m, name, wrapper)

    def not_supported(*_: Any) -> Any:
        raise _NVMLError("Not Supported")

    fn("nvmlInit", lambda: None)
    fn("nvmlShutdown", lambda: None)
    fn("nvmlSystemGetDriverVersion", lambda: "550.54.15")
    fn("nvmlSystemGetCudaDriverVersion_v2", lambda: 12040)
    fn("nvmlSystemGetCudaDriverVersion", lambda: 12040)
    fn("nvmlDeviceGetCount", lambda: 2)
    fn("nvmlDeviceGetHandleByIndex", lambda i: i)
    fn("nvmlDeviceGetName", lambda h: b"NVIDIA H100 80GB HBM3")
    fn("nvmlDeviceGetUUID", lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd")
    fn("nvmlDeviceGetCudaComputeCapability", lambda h: (9, 0))
    fn("nvmlDeviceGetPciInfo", lambda h: types.SimpleNamespace(busId=f"00000000:0{h}:00.0".encode()))
    fn("nvmlDeviceGetEccMode", lambda h: (1, 1))
    fn("nvmlDeviceGetTotalEccErrors", lambda h, kind, counter: 2 if (h == 1 and counter == 0) else 0)
    fn("nvmlDeviceGetRemappedRows", not_supported)
    fn("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x1)
    fn("nvmlDeviceGetPersistenceMode", lambda h: 0)
    fn("nvmlDeviceGetTemperature", lambda h, sensor: 41)
    m.calls = calls  # type: ignore[attr-defined]
    return m


def test_fake_matches_the_real_pynvml_api() -> None:
    real = pytest.importorskip("pynvml")
    fake = make_fake_pynvml()
    names = [n for n in vars(fake) if n.startswith(("nvml", "NVML_"))]
    assert len(names) > 15
    missing = [n for n in names if not hasattr(real, n)]
    assert missing == []
    assert real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED == 1 and real.NVML_VOLATILE_ECC == 0


def test_nvml_probe_with_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = _nvml_facts()
    assert nvml["available"] and nvml["driver"] == "550.54.15" and nvml["cuda_driver"] == 12040
    g0, g1 = nvml["gpus"]
    assert g0["name"] == "NVIDIA H100 80GB HBM3" and g0["cc"] == [9, 0]
    assert g0["pci_bus_id"] == "00000000:00:00.0" and g0["uuid"].startswith("GPU-0000000")
    assert (g0["ecc_uncorrected_volatile"], g1["ecc_uncorrected_volatile"]) == (0, 2)
    assert g0["remap_pending"] is None  # Not Supported -> unknown, not a crash
    assert g0["throttle_mask"] == 1 and g0["persistence"] == 0 and g0["temperature_c"] == 41
    assert fake.calls[-1] == "nvmlShutdown"


def test_nvml_probe_findings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    facts = {
        "rank": 0,
        "hostname": "gpu-node",
        "node_ip": "10.0.0.5",
        "torch_cuda": "12.1",
        "cuda_available": True,
        "device_count": 0,  # torch sees nothing: NVML alone tells there are GPUs
        "torch_arch_list": [],
        "gpus": [],
        "nvml": _nvml_facts(),
        "env": {},
    }
    findings = analyze([facts])
    ecc = {(f.level, f.message.split(":")[0]) for f in findings if f.check == "ecc"}
    assert ecc == {(OK, "GPU 0 (NVIDIA H100 80GB HBM3)"), (ERROR, "GPU 1 (NVIDIA H100 80GB HBM3)")}
    assert {f.level for f in findings if f.check == "persistence"} == {WARNING}
    assert [f.level for f in findings if f.check == "gpu-assignment"] == [
        WARNING
    ]  # GPUs exist, rank sees none


def test_nvml_init_failure_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_fake_pynvml()

    def boom() -> None:
        raise _NVMLError("Driver Not Loaded")

    fake.nvmlInit = boom  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = _nvml_facts()
    assert nvml["available"] is False and "Driver Not Loaded" in nvml["reason"]
