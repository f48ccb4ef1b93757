"""Pure driver / CUDA / architecture tables of gpu_notebook.doctor._compat."""

from __future__ import annotations

import pytest

from gpu_notebook.doctor._compat import (
    arch_support,
    cuda_from_nvml,
    cuda_supports_cc,
    driver_runs_cuda,
    gpu_arch_name,
    max_cuda_for_driver,
    min_cuda_for_cc,
    min_driver_for_cuda,
    parse_arch,
    parse_version,
    recommend_wheel,
)

# Arch lists of real PyTorch builds (torch.cuda.get_arch_list()).
CU102_ARCHES = ["sm_37", "sm_50", "sm_60", "sm_70"]
CU121_ARCHES = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU126_ARCHES = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU128_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("550.54.15", (12, 4)),
        ("550.54.14", (12, 4)),
        ("550.54.13", (12, 3)),
        ("535.104.05", (12, 2)),
        ("530.30.02", (12, 1)),
        ("525.60.13", (12, 0)),
        ("520.61.05", (11, 8)),
        ("470.42.01", (11, 4)),
        ("450.80.02", (11, 0)),
        ("440.33", (10, 2)),
        ("580.65.06", (13, 0)),
        ("575.51.03", (12, 9)),
        ("570.124.06", (12, 8)),
        ("560.35.03", (12, 6)),
        ("380.00", None),
    ],
)
def test_max_cuda_for_driver(driver: str, cuda: tuple[int, int] | None) -> None:
    assert max_cuda_for_driver(driver) == cuda


def test_min_driver_for_cuda() -> None:
    assert min_driver_for_cuda("12.4") == (550, 54, 14)
    assert min_driver_for_cuda("12.1") == (530, 30, 2)
    assert min_driver_for_cuda("11.8") == (520, 61, 5)
    assert min_driver_for_cuda("12.7") == (560, 28, 3)  # no 12.7 release: the next lower one
    assert min_driver_for_cuda(None) is None


def test_version_parsing() -> None:
    assert parse_version("550.54.15") == (550, 54, 15)
    assert parse_version("12.1") == (12, 1)
    assert parse_version("n/a") is None
    assert cuda_from_nvml(12040) == (12, 4)
    assert cuda_from_nvml(11080) == (11, 8)
    assert cuda_from_nvml(None) is None


def test_driver_runs_cuda_ok() -> None:
    c = driver_runs_cuda("550.54.15", "12.4")
    assert c.status == "ok" and c.runs


def test_driver_older_than_runtime_other_major_is_an_error() -> None:
    # A CUDA 12.1 wheel on a 470 driver (CUDA 11.4): no minor compatibility across majors.
    c = driver_runs_cuda("470.42.01", "12.1")
    assert c.status == "too_old" and not c.runs
    assert c.driver_max_cuda == (11, 4)
    assert c.needed_driver == (530, 30, 2)


def test_driver_older_than_runtime_same_major_runs_by_minor_compat() -> None:
    c = driver_runs_cuda("535.54.03", "12.4")
    assert c.status == "minor_compat" and c.runs
    # ... but not below the family's minimum (525.60.13 for 12.x)
    assert driver_runs_cuda("520.61.05", "12.1").status == "too_old"


def test_cuda_10_has_no_minor_compat() -> None:
    assert driver_runs_cuda("418.39", "10.2").status == "too_old"
    assert driver_runs_cuda("440.33", "10.2").status == "ok"


def test_nvml_answer_preferred_over_table() -> None:
    # NVML says the driver supports 12.2; the wheel is 12.4 -> minor compatibility, even without a version string.
    assert driver_runs_cuda(None, "12.4", driver_max_cuda=(12, 2)).status == "minor_compat"
    assert driver_runs_cuda(None, "12.4", driver_max_cuda=(12, 4)).status == "ok"
    assert driver_runs_cuda(None, "12.4").status == "unknown"


def test_parse_arch() -> None:
    assert parse_arch("sm_90") == ("sm", 9, 0, "")
    assert parse_arch("sm_90a") == ("sm", 9, 0, "a")
    assert parse_arch("compute_80") == ("compute", 8, 0, "")
    assert parse_arch("sm_120") == ("sm", 12, 0, "")
    assert parse_arch("garbage") is None


def test_cu102_build_on_h100_has_no_kernel_image() -> None:
    sup = arch_support((9, 0), CU102_ARCHES)
    assert sup.how == "none" and sup.via is None


def test_sass_same_major_lower_minor_runs() -> None:
    # sm_86 cubins run on an sm_89 (Ada) GPU; sm_80 on A10 (8.6)
    assert arch_support((8, 9), CU121_ARCHES).how == "sass"
    assert arch_support((8, 9), CU121_ARCHES).via == "sm_86"
    assert arch_support((8, 6), ["sm_80"]).via == "sm_80"


def test_sass_never_crosses_major_or_runs_higher_minor() -> None:
    assert arch_support((9, 0), ["sm_80", "sm_86"]).how == "none"
    assert arch_support((8, 0), ["sm_86"]).how == "none"


def test_arch_specific_a_variant_only_exact() -> None:
    assert arch_support((9, 0), ["sm_90a"]).how == "sass"
    assert arch_support((10, 0), ["sm_90a"]).how == "none"


def test_ptx_jits_forward_only() -> None:
    sup = arch_support((9, 0), ["sm_70", "compute_80"])
    assert sup.how == "ptx" and sup.via == "compute_80"
    assert arch_support((7, 5), ["compute_80"]).how == "none"


def test_blackwell_on_cu126_build_missing() -> None:
    assert arch_support((12, 0), CU126_ARCHES).how == "none"
    assert arch_support((12, 0), CU128_ARCHES).how == "sass"


def test_min_cuda_for_cc_and_dropped_arches() -> None:
    assert min_cuda_for_cc((9, 0)) == (11, 8)
    assert min_cuda_for_cc((8, 6)) == (11, 1)
    assert min_cuda_for_cc((12, 0)) == (12, 8)
    assert not cuda_supports_cc((10, 2), (9, 0))
    assert cuda_supports_cc((12, 1), (9, 0))
    assert not cuda_supports_cc((12, 1), (3, 7))  # Kepler dropped in CUDA 12
    assert not cuda_supports_cc((13, 0), (7, 0))  # Volta dropped in CUDA 13
    assert cuda_supports_cc((13, 0), (7, 5))  # Turing kept


def test_recommend_wheel_for_h100() -> None:
    tag, how = recommend_wheel((9, 0), driver_max_cuda=(12, 4))
    assert tag == "cu124"
    assert how == "pip install torch --index-url https://download.pytorch.org/whl/cu124"
    # driver only up to 12.1: the newest wheel it fully supports
    assert recommend_wheel((9, 0), (12, 1))[0] == "cu121"
    # unknown driver: the least demanding wheel with sm_90
    assert recommend_wheel((9, 0))[0] == "cu118"


def test_recommend_wheel_driver_too_old_for_arch() -> None:
    tag, how = recommend_wheel((12, 0), driver_max_cuda=(12, 4))
    assert tag is None
    assert "upgrade the NVIDIA driver to >= 570.26" in how and "cu128" in how


def test_gpu_arch_name() -> None:
    assert gpu_arch_name((9, 0)) == "sm_90 (Hopper)"
    assert gpu_arch_name((8, 9)) == "sm_89 (Ada)"
    assert gpu_arch_name((7, 5)) == "sm_75 (Turing)"
