"""Doctor checks over synthetic per-rank facts (fake GPU nodes), the report, and real local facts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_notebook.doctor import (
    ERROR,
    NO_KERNEL_IMAGE,
    OK,
    WARNING,
    DoctorReport,
    Finding,
    analyze,
    collect_facts,
    compare_versions,
    diagnose_facts,
    diagnose_local,
    nccl_select_interfaces,
)
from gpu_notebook.doctor._checks import decode_throttle

GiB = 2**30


def fake_gpu_facts(
    rank: int = 0,
    host: str = "node-a",
    ip: str = "10.0.0.1",
    *,
    gpu: str = "NVIDIA H100 80GB HBM3",
    cc: tuple[int, int] = (9, 0),
    n_gpus: int = 8,
    driver: str = "550.54.15",
    cuda_driver: int = 12040,
    torch_cuda: str | None = "12.1",
    arch_list: list[str] | None = None,
    torch_version: str = "2.3.0+cu121",
) -> dict[str, Any]:
    """Facts as collect_facts() would return them on a healthy 8-GPU node (a fake: no GPU here)."""
    uuids = [f"GPU-{host}-{i:04d}" for i in range(n_gpus)]
    return {
        "probe_errors": {},
        "rank": rank,
        "local_rank": rank % n_gpus,
        "world_size": 16,
        "hostname": host,
        "node_ip": ip,
        "pid": 1000 + rank,
        "platform": "Linux",
        "env": {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": None},
        "versions": {
            "python": "3.11.7",
            "torch": torch_version,
            "ray": "2.60.0",
            "gpu_notebook": "0.1.0",
            "numpy": "1.26.4",
        },
        "dist": {"initialized": True, "backend": "nccl", "rank": rank, "world_size": 16},
        "torch_cuda": torch_cuda,
        "cuda_available": True,
        "device_count": n_gpus,
        "torch_arch_list": arch_list
        if arch_list is not None
        else ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
        "gpus": [
            {"index": i, "name": gpu, "cc": list(cc), "uuid": uuids[i][4:], "memory_gib": 79.1}
            for i in range(n_gpus)
        ],
        "current_device": rank % n_gpus,
        "libcuda_cuda": cuda_driver,
        "cuda_kernel": {"ok": True, "error": None},
        "nccl_version": "2.20.5",
        "nvml": {
            "available": True,
            "driver": driver,
            "cuda_driver": cuda_driver,
            "gpus": [
                {
                    "index": i,
                    "name": gpu,
                    "uuid": uuids[i],
                    "cc": list(cc),
                    "pci_bus_id": f"00000000:{i:02X}:00.0",
                    "ecc_mode": 1,
                    "ecc_uncorrected_volatile": 0,
                    "ecc_uncorrected_aggregate": 0,
                    "remap_pending": False,
                    "remap_failure": False,
                    "throttle_mask": 0x1,
                    "persistence": 1,
                    "temperature_c": 35,
                }
                for i in range(n_gpus)
            ],
        },
        "interfaces": [
            {"name": "lo", "ipv4": "127.0.0.1", "up": True, "speed_mbps": None},
            {"name": "ens5", "ipv4": ip, "up": True, "speed_mbps": 100000},
        ],
        "route": {"ip": ip, "interface": "ens5"},
        "infiniband": ["efa_0"],
        "fi_info": {"found": True, "efa": True},
        "storage": {"/home/ubuntu": {"free": 200 * GiB, "total": 500 * GiB}},
        "shm": {"total": 64 * GiB, "free": 64 * GiB},
        "master_probe": {"ok": True, "ms": 0.3, "error": None},
        "listen_port": 40000 + rank,
    }


def cluster_facts(n_nodes: int = 2, per_node: int = 2, **kw: Any) -> list[dict[str, Any]]:
    out = []
    for node in range(n_nodes):
        for local in range(per_node):
            f = fake_gpu_facts(
                node * per_node + local, f"node-{node}", f"10.0.0.{node + 1}", n_gpus=per_node, **kw
            )
            f["local_rank"] = local
            f["current_device"] = local
            out.append(f)
    return out


def levels(findings: list[Finding], check: str) -> set[str]:
    return {f.level for f in findings if f.check == check}


def test_fake_facts_have_every_key_of_real_facts() -> None:
    real = collect_facts()
    fake = fake_gpu_facts()
    missing = set(real) - set(fake) - {"listener"}
    assert not missing
    # this CPU machine: no NVML and no driver
    assert real["nvml"]["available"] is False and real["nvml"]["driver"] is None


def test_healthy_gpu_cluster_has_no_errors() -> None:
    findings = analyze(cluster_facts())
    assert [f for f in findings if f.level == ERROR] == []
    assert [f for f in findings if f.level == WARNING] == []
    assert levels(findings, "gpu-arch") == {OK}


def test_cu102_wheel_on_h100_reports_no_kernel_image_and_the_wheel_to_install() -> None:
    facts = [
        fake_gpu_facts(
            torch_cuda="10.2", arch_list=["sm_37", "sm_50", "sm_60", "sm_70"], torch_version="1.12.1+cu102"
        )
    ]
    arch = [f for f in analyze(facts) if f.check == "gpu-arch"]
    assert len(arch) == 1 and arch[0].level == ERROR
    assert NO_KERNEL_IMAGE in arch[0].message
    assert "sm_90 (Hopper)" in arch[0].message and "needs CUDA >= 11.8" in arch[0].message
    assert arch[0].fix == "pip install torch --index-url https://download.pytorch.org/whl/cu124"


def test_ptx_only_build_is_a_warning() -> None:
    facts = [fake_gpu_facts(arch_list=["sm_70", "sm_80", "compute_80"])]
    arch = [f for f in analyze(facts) if f.check == "gpu-arch"]
    assert [f.level for f in arch] == [WARNING] and "compute_80" in arch[0].message


def test_driver_older_than_cuda_runtime_is_an_error() -> None:
    facts = [fake_gpu_facts(driver="470.42.01", cuda_driver=11040, torch_cuda="12.1")]
    # what torch reports then: CUDA does not initialise (CUDA working there is forward compatibility)
    facts[0].update(cuda_available=False, device_count=0, gpus=[], current_device=None, torch_arch_list=[])
    facts[0].update(libcuda_cuda=None, cuda_kernel=None, nccl_version=None)
    facts[0]["dist"]["backend"] = "gloo"
    drv = [f for f in analyze(facts) if f.check == "cuda-driver"]
    assert [f.level for f in drv] == [ERROR]
    assert "insufficient" in drv[0].message and ">= 530.30.02" in drv[0].fix


def test_minor_version_compat_is_a_warning() -> None:
    facts = [fake_gpu_facts(driver="535.54.03", cuda_driver=12020, torch_cuda="12.4")]
    assert levels(analyze(facts), "cuda-driver") == {WARNING}


def test_cpu_torch_on_gpu_node_is_an_error() -> None:
    f = fake_gpu_facts(torch_cuda=None, arch_list=[])
    f.update(cuda_available=False, device_count=0, gpus=[], current_device=None)
    f["dist"]["backend"] = "gloo"
    findings = analyze([f])
    drv = [x for x in findings if x.check == "cuda-driver"]
    assert drv[0].level == ERROR and "CPU-only PyTorch" in drv[0].message
    assert "whl/cu124" in drv[0].fix


def test_two_ranks_on_one_gpu_is_an_error() -> None:
    facts = cluster_facts(1, 2)
    facts[1]["current_device"] = 0
    shared = [f for f in analyze(facts) if f.check == "gpu-assignment" and f.level == ERROR]
    assert len(shared) == 1 and "ranks 0, 1 share one GPU" in shared[0].message


def test_nccl_rank_without_gpu_is_an_error() -> None:
    f = fake_gpu_facts()
    f.update(device_count=0, gpus=[], current_device=None)
    assert ERROR in levels(analyze([f]), "gpu-assignment")


def test_gpu_health_ecc_throttle_persistence() -> None:
    f = fake_gpu_facts(n_gpus=2)
    f["nvml"]["gpus"][0]["ecc_uncorrected_volatile"] = 3
    f["nvml"]["gpus"][1]["throttle_mask"] = 0x40 | 0x1
    f["nvml"]["gpus"][1]["persistence"] = 0
    findings = analyze([f])
    assert levels(findings, "ecc") == {ERROR, OK}
    assert levels(findings, "throttle") == {OK, WARNING}
    assert levels(findings, "persistence") == {OK, WARNING}
    assert any("HwThermalSlowdown" in x.message for x in findings)


def test_decode_throttle() -> None:
    assert decode_throttle(0x1 | 0x4) == (["GpuIdle", "SwPowerCap"], [])
    assert decode_throttle(0x8 | 0x80)[1] == ["HwSlowdown", "HwPowerBrakeSlowdown"]


def test_nvml_missing_on_gpu_node_is_a_warning() -> None:
    f = fake_gpu_facts()
    f["nvml"] = {"available": False, "reason": "NVMLError_LibraryNotFound", "driver": None}
    findings = analyze([f])
    assert levels(findings, "gpu-health") == {WARNING}
    assert levels(findings, "cuda-driver") == {OK}  # torch sees the GPU; version unknown
    # the driver version from /proc still drives the CUDA check
    f["nvml"]["driver"] = "470.42.01"
    f.update(cuda_kernel=None, libcuda_cuda=None)  # no kernel tried: nothing shows forward compatibility
    assert levels(analyze([f]), "cuda-driver") == {ERROR}


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
            "550.54.15",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n", "570.86.15"),
        ("garbage", None),
    ],
)
def test_proc_driver_version(tmp_path, text: str, version: str | None) -> None:
    from gpu_notebook.doctor._facts import _proc_driver_version

    path = tmp_path / "version"
    path.write_text(text)
    assert _proc_driver_version(str(path)) == version
    assert _proc_driver_version(str(tmp_path / "missing")) is None


def test_nccl_select_interfaces_rules() -> None:
    ifs = [
        {"name": n, "ipv4": f"10.0.{i}.1"}
        for i, n in enumerate(["lo", "docker0", "eth0", "eth1", "ib0", "ens5"])
    ]
    assert nccl_select_interfaces(None, ifs) == ["ib0"]
    assert nccl_select_interfaces(None, [i for i in ifs if i["name"] != "ib0"]) == ["eth0", "eth1", "ens5"]
    assert nccl_select_interfaces("eth", ifs) == ["eth0", "eth1"]
    assert nccl_select_interfaces("=eth1", ifs) == ["eth1"]
    assert nccl_select_interfaces("^eth,lo,docker", ifs) == ["ib0", "ens5"]
    assert nccl_select_interfaces("enp", ifs) == []
    assert nccl_select_interfaces(None, [{"name": "lo", "ipv4": "127.0.0.1"}]) == ["lo"]


def test_socket_ifname_matching_nothing_is_an_error() -> None:
    facts = cluster_facts()
    for f in facts:
        f["env"]["NCCL_SOCKET_IFNAME"] = "eth0"
    bad = [f for f in analyze(facts) if f.check == "network-interface"]
    assert {f.level for f in bad} == {ERROR}
    assert bad[0].fix == "export NCCL_SOCKET_IFNAME=ens5"


def test_default_interface_not_the_route_is_a_warning_on_multi_node() -> None:
    facts = cluster_facts()
    for f in facts:
        f["interfaces"].insert(0, {"name": "eth9", "ipv4": "192.168.5.5", "up": True, "speed_mbps": 1000})
    net = [f for f in analyze(facts) if f.check == "network-interface"]
    assert {f.level for f in net} == {WARNING} and net[0].fix == "export NCCL_SOCKET_IFNAME=ens5"
    # a single node has nothing to reach: OK
    assert levels(analyze(facts[:1]), "network-interface") == {OK}


def test_no_rdma_on_multi_node_gpu_cluster_is_a_warning() -> None:
    facts = cluster_facts()
    for f in facts:
        f["infiniband"], f["fi_info"] = [], {"found": False, "efa": False}
    assert levels(analyze(facts), "rdma") == {WARNING}
    assert levels(analyze(facts[:1]), "rdma") == {OK}


def test_small_shm_and_full_disk() -> None:
    f = fake_gpu_facts()
    f["shm"] = {"total": 64 * 2**20, "free": 64 * 2**20}
    f["storage"] = {"/": {"free": 2 * GiB, "total": 100 * GiB}}
    findings = analyze([f])
    shm = [x for x in findings if x.check == "shm"][0]
    assert shm.level == ERROR and "--shm-size" in shm.fix and "Bus error" in shm.message
    assert levels(findings, "disk") == {ERROR}


def test_cross_node_version_mismatch_detected() -> None:
    facts = cluster_facts(3, 1)
    facts[2]["versions"]["torch"] = "2.2.1+cu121"
    facts[2]["versions"]["ray"] = "2.9.0"
    found = [f for f in compare_versions(facts) if f.level == ERROR]
    assert [f.message.split(" differs")[0] for f in found] == ["torch", "ray"]
    assert "2.2.1+cu121 on node-2 (ranks 2)" in found[0].message
    assert found[0].fix == "install the same torch everywhere: pip install torch==2.3.0+cu121"
    assert compare_versions(cluster_facts(3, 1)) and not [
        f for f in compare_versions(cluster_facts(3, 1)) if f.level != OK
    ]


def test_driver_mismatch_between_nodes_is_a_warning() -> None:
    facts = cluster_facts(2, 1)
    facts[1]["nvml"]["driver"] = "535.104.05"
    warn = [f for f in compare_versions(facts) if f.level == WARNING]
    assert len(warn) == 1 and "535.104.05" in warn[0].message


def test_reachability_failures() -> None:
    facts = cluster_facts(2, 1)
    facts[1]["master_probe"] = {"ok": False, "ms": None, "error": "TimeoutError: timed out"}
    probes = [
        {
            "rank": 0,
            "results": [
                {
                    "node": "node-1",
                    "ip": "10.0.0.2",
                    "port": 40001,
                    "ok": False,
                    "ms": None,
                    "error": "refused",
                }
            ],
        },
        {
            "rank": 1,
            "results": [
                {"node": "node-0", "ip": "10.0.0.1", "port": 40000, "ok": True, "ms": 0.2, "error": None}
            ],
        },
    ]
    findings = analyze(facts, probes)
    master = [f for f in findings if f.check == "master-port"]
    assert {(f.rank, f.level) for f in master} == {(0, OK), (1, ERROR)}
    peer = [f for f in findings if f.check == "peer-ports"]
    assert {(f.node, f.level) for f in peer} == {("node-0", ERROR), ("node-1", OK)}


def test_probe_errors_become_warnings() -> None:
    f = fake_gpu_facts()
    f["probe_errors"] = {"fi_info": "TimeoutExpired: fi_info"}
    assert levels(analyze([f]), "probe") == {WARNING}


def test_report_rows_merge_ranks_html_and_text() -> None:
    facts = cluster_facts(1, 4)
    facts[3]["current_device"] = 2
    report = diagnose_facts(facts)
    assert not report.ok and len(report.errors) == 1
    rows = report.rows()
    assert rows[0][0] == ERROR  # errors first
    assignment = [r for r in rows if r[1] == "gpu-assignment" and r[0] == OK]
    assert assignment == [] or all(r[3] for r in assignment)
    master = [r for r in rows if r[1] == "master-port"]
    assert len(master) == 1 and master[0][3] == "0-3"
    html = report._repr_html_()
    assert "gnb-doctor-error" in html and "#cf222e" in html and "ranks 2, 3 share one GPU" in html
    text = report.text()
    assert "ERROR" in text and "fix: one GPU per rank" in text
    assert repr(report).startswith("<DoctorReport 1 error,")
    assert report.to_dicts()[0].keys() == {"check", "level", "node", "rank", "message", "fix"}


def test_finding_rejects_unknown_level() -> None:
    with pytest.raises(ValueError):
        Finding("x", "info", "n", None, "m")


def test_report_merge() -> None:
    a = DoctorReport([Finding("a", OK, "n", 0, "m")])
    b = DoctorReport([Finding("b", ERROR, "n", 1, "m")])
    merged = DoctorReport.merge([a, b])
    assert [f.check for f in merged.findings] == ["a", "b"] and not merged.ok


def test_this_cpu_machine_reports_no_gpu_cleanly() -> None:
    report = diagnose_local()
    assert report.errors == []
    facts = report.facts[0]
    assert facts["probe_errors"] == {}
    for check in ("cuda-driver", "gpu-arch", "gpu-health"):
        found = report.by_check(check)
        assert found and all(f.level == OK and "no GPU" in f.message for f in found), check
    assert facts["shm"]["total"] > 0 and facts["storage"]


def test_synthetic_facts_not_mutated_by_analyze() -> None:
    facts = cluster_facts()
    before = copy.deepcopy(facts)
    analyze(facts)
    assert facts == before


def test_import_is_cheap(python_exe: str) -> None:
    import subprocess

    code = (
        "import sys, gpu_notebook.doctor; "
        "heavy = [m for m in ('torch', 'ray', 'pynvml', 'plotly', 'psutil') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([python_exe, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


class _FakeTwoNodeCluster:
    """Answers diagnose()'s three calls with synthetic facts of 2 nodes x 2 ranks (no processes)."""

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def call(self, fn: Any, *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        self.calls.append((fn.__name__, args))
        facts = cluster_facts(2, 2)
        if fn.__name__ == "_collect_and_listen":
            return facts
        if fn.__name__ == "probe_peers":
            (endpoints,) = args
            return [
                {
                    "rank": f["rank"],
                    "results": [
                        {**ep, "ok": ep["node"] != "node-1" or f["rank"] < 2, "ms": 1.0, "error": "refused"}
                        for ep in endpoints
                    ],
                }
                for f in facts
            ]
        return [True] * 4


def test_diagnose_orchestration_one_endpoint_per_node() -> None:
    from gpu_notebook.doctor import diagnose

    fake = _FakeTwoNodeCluster()
    report = diagnose(fake)
    assert [name for name, _ in fake.calls] == ["_collect_and_listen", "probe_peers", "stop_listener"]
    endpoints = fake.calls[1][1][0]
    assert endpoints == [
        {"node": "node-0", "ip": "10.0.0.1", "port": 40000},
        {"node": "node-1", "ip": "10.0.0.2", "port": 40002},
    ]
    peer_errors = [f for f in report.errors if f.check == "peer-ports"]
    assert [(f.node, "node-1" in f.message) for f in peer_errors] == [("node-1", True)]
    assert report.title == "gpu_notebook doctor: fake"


def test_rows_merge_nodes_and_gpus() -> None:
    facts = cluster_facts(2, 4)  # 2 nodes x 4 GPUs
    facts[4]["nvml"]["gpus"][2]["persistence"] = 0  # node-1, GPU 2
    report = diagnose_facts(facts)
    rows = report.rows()
    ecc = [r for r in rows if r[1] == "ecc"]
    assert ecc == [
        (
            OK,
            "ecc",
            "all 2 nodes",
            "-",
            "GPUs 0-3 (NVIDIA H100 80GB HBM3): no uncorrected ECC errors (ECC on)",
            "",
        )
    ]
    pers = [r for r in rows if r[1] == "persistence"]
    assert [(r[0], r[2], r[4].split(":")[0]) for r in pers] == [
        (WARNING, "node-1", "GPU 2 (NVIDIA H100 80GB HBM3)"),
        (OK, "node-0", "GPUs 0-3 (NVIDIA H100 80GB HBM3)"),
        (OK, "node-1", "GPUs 0-1,3 (NVIDIA H100 80GB HBM3)"),
    ]
    master = [r for r in rows if r[1] == "master-port"]
    assert master == [(OK, "master-port", "all 2 nodes", "0-7", "reaches 10.0.0.1:29500", "")]
    versions = [r for r in rows if r[1] == "versions"]
    assert len(versions) == 1 and versions[0][4].startswith("identical on every rank: python 3.11.7, torch ")
    html = report._repr_html_()
    assert html.index("gnb-doctor-warning") < html.index("<details>")  # problems shown, OK rows folded
    assert "OK rows</summary>" in html
    clean = diagnose_facts(cluster_facts(1, 2))._repr_html_()
    assert "<details open>" in clean  # nothing wrong: the OK rows are shown


def test_gpus_hidden_by_cuda_visible_devices_is_a_warning_not_an_error() -> None:
    f = fake_gpu_facts()
    f.update(cuda_available=False, device_count=0, gpus=[], current_device=None, torch_arch_list=[])
    f["dist"]["backend"] = "gloo"
    f["env"]["CUDA_VISIBLE_DEVICES"] = ""
    findings = analyze([f])
    assert levels(findings, "cuda-driver") == {WARNING}
    assert [x.level for x in findings if x.level == ERROR] == []
    f["env"]["CUDA_VISIBLE_DEVICES"] = None  # nothing hides them: torch cannot use the GPUs
    assert levels(analyze([f]), "cuda-driver") == {ERROR}
