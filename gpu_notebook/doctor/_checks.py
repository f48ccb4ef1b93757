"""Judge gathered facts: pure functions from per-rank fact dicts to :class:`Finding` lists.

Nothing here touches a GPU or the network; every function can be tested with synthetic facts (the dicts
that :func:`gpu_notebook.doctor.collect_facts` returns). Node-wide checks run once per node (on its lowest
rank), rank checks once per rank, and cross-node checks (versions, GPU sharing, reachability) once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gpu_notebook.doctor._compat import (
    NO_KERNEL_IMAGE,
    arch_support,
    cuda_from_nvml,
    driver_runs_cuda,
    format_driver,
    format_version,
    gpu_arch_name,
    min_cuda_for_cc,
    parse_cuda_version,
    recommend_wheel,
)
from gpu_notebook.doctor._report import ERROR, OK, WARNING, Finding

__all__ = [
    "THROTTLE_REASONS",
    "decode_throttle",
    "nccl_select_interfaces",
    "node_labels",
    "check_cuda_stack",
    "check_gpu_arch",
    "check_gpu_health",
    "check_gpu_assignment",
    "check_network",
    "check_rdma",
    "check_storage",
    "check_reachability",
    "compare_versions",
    "analyze",
]

GiB = 2**30

#: NVML clocks-event (throttle) reason bits -> (name, is a problem).
THROTTLE_REASONS: dict[int, tuple[str, bool]] = {
    0x1: ("GpuIdle", False),
    0x2: ("ApplicationsClocksSetting", False),
    0x4: ("SwPowerCap", False),
    0x8: ("HwSlowdown", True),
    0x10: ("SyncBoost", False),
    0x20: ("SwThermalSlowdown", True),
    0x40: ("HwThermalSlowdown", True),
    0x80: ("HwPowerBrakeSlowdown", True),
    0x100: ("DisplayClockSetting", False),
}

VERSION_KEYS = ("python", "torch", "ray", "gpu_notebook", "numpy")


def decode_throttle(mask: int) -> tuple[list[str], list[str]]:
    """Split an NVML throttle bitmask into ``(harmless reasons, problem reasons)``."""
    harmless: list[str] = []
    bad: list[str] = []
    for bit, (name, problem) in THROTTLE_REASONS.items():
        if mask & bit:
            (bad if problem else harmless).append(name)
    return harmless, bad


def nccl_select_interfaces(spec: str | None, interfaces: list[dict[str, Any]]) -> list[str]:
    """Interfaces NCCL's socket transport would pick, following its ``NCCL_SOCKET_IFNAME`` rules.

    ``spec`` is a comma-separated list of name prefixes; a leading ``^`` excludes them, a leading ``=``
    asks for exact names. Unset, NCCL prefers ``ib*`` interfaces, then anything but ``docker*`` and
    ``lo``, then ``docker*``, then ``lo``. Only interfaces with an IPv4 address count here.
    """
    names = [i["name"] for i in interfaces if i.get("ipv4") and i.get("up", True) is not False]

    def match(s: str) -> list[str]:
        exclude = s.startswith("^")
        s = s[1:] if exclude else s
        exact = s.startswith("=")
        s = s[1:] if exact else s
        prefixes = [p for p in s.split(",") if p]
        hit = [n for n in names if any(n == p if exact else n.startswith(p) for p in prefixes)]
        return [n for n in names if n not in hit] if exclude else hit

    if spec:
        return match(spec)
    for default in ("ib", "^docker,lo", "docker", "lo"):
        found = match(default)
        if found:
            return found
    return []


def node_labels(facts: list[dict[str, Any]]) -> dict[int, str]:
    """Index in ``facts`` -> node label: the host name, or ``host/ip`` when host names collide."""
    by_host: dict[str, set[str | None]] = defaultdict(set)
    for f in facts:
        by_host[f.get("hostname") or "?"].add(f.get("node_ip"))
    labels = {}
    for i, f in enumerate(facts):
        host = f.get("hostname") or "?"
        labels[i] = host if len(by_host[host]) <= 1 else f"{host}/{f.get('node_ip')}"
    return labels


def _nvml_gpus(facts: dict[str, Any]) -> list[dict[str, Any]]:
    nvml = facts.get("nvml") or {}
    return list(nvml.get("gpus") or []) if nvml.get("available") else []


def _node_gpu_count(facts: dict[str, Any]) -> int:
    """GPUs on the node: torch's, NVML's, or (without NVML) the kernel module's count in /proc."""
    proc = (facts.get("nvml") or {}).get("gpu_count")
    return max(len(_nvml_gpus(facts)), int(facts.get("device_count") or 0), int(proc or 0))


def _has_gpu(facts: dict[str, Any]) -> bool:
    return _node_gpu_count(facts) > 0


def _gpu_ccs(facts: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    """(name, compute capability) of every GPU on the node, from torch, else NVML."""
    out = []
    for g in facts.get("gpus") or _nvml_gpus(facts):
        if g.get("cc"):
            out.append((g.get("name") or "GPU", (int(g["cc"][0]), int(g["cc"][1]))))
    return out


def _driver_max_cuda(facts: dict[str, Any]) -> tuple[int, int] | None:
    return cuda_from_nvml((facts.get("nvml") or {}).get("cuda_driver"))


def _kernel_runs(facts: dict[str, Any]) -> bool | None:
    """Did the probe's small CUDA kernel run? ``None`` when it was not tried.

    A kernel that failed only for want of a kernel image counts as run here: the driver loaded and launched
    it (``gpu-arch`` reports the missing architecture).
    """
    probe = facts.get("cuda_kernel")
    if not facts.get("cuda_available") or not isinstance(probe, dict):
        return None
    return bool(probe.get("ok")) or "no kernel image" in str(probe.get("error") or "")


def _forward_compat(
    facts: dict[str, Any], node: str, rank: int | None, driver: str | None, kmd_cuda: tuple[int, int] | None
) -> Finding | None:
    """The OK finding for a driver older than PyTorch's CUDA on which CUDA evidently works.

    That is CUDA forward compatibility: a ``cuda-compat`` package puts a newer user-mode driver (libcuda) in
    front of the older kernel-mode driver, which is all NVML's driver version describes. NVIDIA supports it only
    on data-center GPUs, select NGC Server Ready RTX SKUs and Jetson boards.
    """
    if not _kernel_runs(facts):
        return None
    umd = cuda_from_nvml(facts.get("libcuda_cuda"))
    umd_text = f"the user-mode libcuda it loaded supports CUDA {format_version(umd)}" if umd else "CUDA works"
    return Finding(
        "cuda-driver",
        OK,
        node,
        rank,
        f"driver {driver or '?'} (kernel module, CUDA <= {format_version(kmd_cuda)}) is older than PyTorch's "
        f"CUDA {facts.get('torch_cuda')}, but a CUDA kernel runs: {umd_text}, through CUDA forward "
        "compatibility (a cuda-compat package; data-center GPUs only)",
    )


def check_cuda_stack(facts: dict[str, Any], node: str, rank: int | None = None) -> list[Finding]:
    """Driver version vs the CUDA version PyTorch was built with; CPU-only builds on GPU nodes."""
    check = "cuda-driver"
    nvml = facts.get("nvml") or {}
    torch_cuda = facts.get("torch_cuda")
    if not _has_gpu(facts):
        build = f"PyTorch built with CUDA {torch_cuda}" if torch_cuda else "CPU-only PyTorch build"
        return [Finding(check, OK, node, rank, f"no GPU on this node ({build}); driver check skipped")]
    driver = nvml.get("driver")
    max_cuda = _driver_max_cuda(facts)
    n_gpus = _node_gpu_count(facts)
    ccs = _gpu_ccs(facts)
    if not torch_cuda:
        tag, how = recommend_wheel(ccs[0][1], max_cuda) if ccs else (None, "install a CUDA build of torch")
        return [
            Finding(
                check,
                ERROR,
                node,
                rank,
                f"CPU-only PyTorch build on a node with {n_gpus} GPU(s): nothing will run on the GPU",
                how,
            )
        ]
    cvd = (facts.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if not facts.get("cuda_available") and cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        return [
            Finding(
                check,
                WARNING,
                node,
                rank,
                f"the node has {n_gpus} GPU(s) but CUDA_VISIBLE_DEVICES={cvd!r} hides them from this process; "
                f"driver {driver or '?'}, PyTorch CUDA {torch_cuda}",
                "start the cluster with gpus_per_worker=1 to use them",
            )
        ]
    compat = driver_runs_cuda(driver, torch_cuda, max_cuda)
    if compat.status in ("too_old", "minor_compat"):
        umd = cuda_from_nvml(facts.get("libcuda_cuda"))
        built = parse_cuda_version(torch_cuda)
        newer_umd = umd is not None and built is not None and umd >= built
        if compat.status == "too_old" or newer_umd:
            fwd = _forward_compat(facts, node, rank, driver, compat.driver_max_cuda)
            if fwd is not None:
                return [fwd]
    if compat.status == "too_old":
        # torch.cuda.is_available() is False then ("The NVIDIA driver on your system is too old"), unless a
        # CUDA forward-compatibility package supplies a newer libcuda
        tag, how = recommend_wheel(ccs[0][1], max_cuda) if ccs else (None, "")
        if not tag:  # no wheel this driver runs has the GPU's architecture: only the upgrade helps
            how = ""
            if not ccs and compat.driver_max_cuda:  # GPU model unknown (no NVML, CUDA unusable)
                how = f"install a PyTorch build for CUDA <= {format_version(compat.driver_max_cuda)}"
        fix = f"upgrade the driver to >= {format_driver(compat.needed_driver)}" + (
            f", or {how}" if how else ""
        )
        state = "" if facts.get("cuda_available") else "torch.cuda.is_available() is False: "
        probe = facts.get("cuda_kernel") or {}
        if facts.get("cuda_available") and probe.get("error"):
            state = f"a CUDA kernel fails ({probe['error']}): "
        return [
            Finding(
                check,
                ERROR,
                node,
                rank,
                f"{state}driver {driver or '?'} (CUDA <= {format_version(compat.driver_max_cuda)}) is older "
                f"than PyTorch's CUDA {torch_cuda}: 'CUDA driver version is insufficient for CUDA runtime version'",
                fix,
            )
        ]
    if not facts.get("cuda_available"):
        return [
            Finding(
                check,
                ERROR,
                node,
                rank,
                f"the node has {n_gpus} GPU(s) but torch.cuda.is_available() is False "
                f"(driver {driver or 'unknown'}, PyTorch CUDA {torch_cuda})",
                "check CUDA_VISIBLE_DEVICES and the container's GPU access (docker run --gpus all), "
                "and that the driver supports the build",
            )
        ]
    probe = facts.get("cuda_kernel") or {}
    if _kernel_runs(facts) is False:
        return [
            Finding(
                check,
                ERROR,
                node,
                rank,
                f"CUDA initialises (driver {driver or 'unknown'}, PyTorch CUDA {torch_cuda}) but a small CUDA "
                f"kernel fails: {probe.get('error')}",
                "run nvidia-smi on the node: the GPU may be in exclusive-process mode and busy, or faulty "
                "(Xid errors in dmesg); with a cuda-compat package, it must match the kernel driver",
            )
        ]
    if driver is None and max_cuda is None:
        return [
            Finding(
                check,
                OK,
                node,
                rank,
                f"CUDA works (PyTorch CUDA {torch_cuda}); driver version unknown without NVML",
                "pip install nvidia-ml-py to let the doctor read the driver version",
            )
        ]
    shown_max = format_version(compat.driver_max_cuda)
    if compat.status == "ok":
        return [
            Finding(
                check,
                OK,
                node,
                rank,
                f"driver {driver or '?'} supports up to CUDA {shown_max}; PyTorch built with CUDA {torch_cuda}",
            )
        ]
    needed = format_driver(compat.needed_driver)
    if compat.status == "minor_compat":
        return [
            Finding(
                check,
                WARNING,
                node,
                rank,
                f"driver {driver or '?'} supports CUDA {shown_max}, PyTorch is built with CUDA {torch_cuda}: "
                "runs through CUDA minor version compatibility (no JIT of its newer PTX, some features missing)",
                f"upgrade the driver to >= {needed}, or install a torch build for CUDA <= {shown_max}",
            )
        ]
    return [
        Finding(
            check, OK, node, rank, f"driver {driver or '?'}; PyTorch CUDA {torch_cuda}; compatibility unknown"
        )
    ]


def check_gpu_arch(facts: dict[str, Any], node: str, rank: int | None = None) -> list[Finding]:
    """Each GPU's compute capability against ``torch.cuda.get_arch_list()``."""
    check = "gpu-arch"
    if not _has_gpu(facts):
        return [Finding(check, OK, node, rank, "no GPU on this node; architecture check skipped")]
    arch_list = list(facts.get("torch_arch_list") or [])
    if not facts.get("torch_cuda"):
        return []  # reported by check_cuda_stack
    if not arch_list:
        return [Finding(check, OK, node, rank, "PyTorch reported no compiled architectures; check skipped")]
    max_cuda = _driver_max_cuda(facts)
    torch_cuda = facts.get("torch_cuda")
    findings = []
    seen: set[tuple[str, tuple[int, int]]] = set()
    for name, cc in _gpu_ccs(facts):
        if (name, cc) in seen:
            continue
        seen.add((name, cc))
        sup = arch_support(cc, arch_list)
        arch = gpu_arch_name(cc)
        if sup.how == "sass":
            findings.append(Finding(check, OK, node, rank, f"{name} is {arch}; PyTorch has {sup.via}"))
            continue
        tag, how = recommend_wheel(cc, max_cuda)
        if sup.how == "ptx":
            findings.append(
                Finding(
                    check,
                    WARNING,
                    node,
                    rank,
                    f"{name} is {arch}; PyTorch only has PTX {sup.via}: kernels are JIT-compiled at first use "
                    "(slow start, needs a driver that knows that PTX)",
                    how if tag else f"install a torch build with {arch.split()[0]}",
                )
            )
            continue
        low = min_cuda_for_cc(cc)
        built = parse_cuda_version(torch_cuda)
        why = ""
        if low and built and built < low:
            why = (
                f" (CUDA {torch_cuda} predates {arch.split()[0]}, which needs CUDA >= {format_version(low)})"
            )
        findings.append(
            Finding(
                check,
                ERROR,
                node,
                rank,
                f"{name} is {arch} but PyTorch (CUDA {torch_cuda}) was compiled only for {', '.join(arch_list)}"
                f"{why}: every kernel fails with '{NO_KERNEL_IMAGE}'",
                how,
            )
        )
    return findings


def check_gpu_health(facts: dict[str, Any], node: str) -> list[Finding]:
    """ECC errors, row remapping, throttling and persistence mode of every GPU (NVML)."""
    nvml = facts.get("nvml") or {}
    if not _has_gpu(facts):
        return [
            Finding("gpu-health", OK, node, None, "no GPU on this node; ECC/throttle/persistence skipped")
        ]
    if not nvml.get("available"):
        return [
            Finding(
                "gpu-health",
                WARNING,
                node,
                None,
                f"NVML unavailable ({nvml.get('reason', 'unknown')}): ECC, throttling and persistence not checked",
                "pip install nvidia-ml-py (and make libnvidia-ml.so visible in the container)",
            )
        ]
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}

    def add(g: dict[str, Any], check: str, level: str, text: str, fix: str = "") -> None:
        groups.setdefault((check, level, text, fix), []).append(g)

    for g in _nvml_gpus(facts):
        vol, agg = g.get("ecc_uncorrected_volatile"), g.get("ecc_uncorrected_aggregate")
        if vol:
            add(
                g,
                "ecc",
                ERROR,
                f"{vol} uncorrected ECC errors since the last reset",
                "drain this node: reset the GPU (nvidia-smi -r) or replace the instance",
            )
        elif agg:
            add(
                g,
                "ecc",
                WARNING,
                f"{agg} uncorrected ECC errors over its lifetime",
                "watch it; replace the instance if errors come back",
            )
        elif g.get("remap_failure"):
            add(g, "ecc", ERROR, "row remapping failed", "replace the instance")
        elif g.get("remap_pending"):
            add(
                g,
                "ecc",
                WARNING,
                "row remapping pending",
                "reset the GPU (nvidia-smi -r) or reboot to apply it",
            )
        else:
            mode = {0: "ECC off", 1: "ECC on"}.get(g.get("ecc_mode"), "ECC mode unknown")  # type: ignore[arg-type]
            add(g, "ecc", OK, f"no uncorrected ECC errors ({mode})")
        mask = g.get("throttle_mask")
        if mask is not None:
            harmless, bad = decode_throttle(int(mask))
            if bad:
                add(
                    g,
                    "throttle",
                    WARNING,
                    f"clocks throttled by {', '.join(bad)}",
                    "check cooling and power (nvidia-smi -q -d PERFORMANCE); move off this node if it persists",
                )
            else:
                add(g, "throttle", OK, "no thermal or power slowdown")
        pm = g.get("persistence")
        if pm == 0:
            add(
                g,
                "persistence",
                WARNING,
                "persistence mode off (every new process pays seconds of driver start-up)",
                "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)",
            )
        elif pm == 1:
            add(g, "persistence", OK, "persistence mode on")
    return [
        Finding(check, level, node, None, f"{_gpus_label(gpus)}: {text}", fix)
        for (check, level, text, fix), gpus in groups.items()
    ]


def _gpus_label(gpus: list[dict[str, Any]]) -> str:
    """``GPU 3 (NVIDIA A100)`` or ``GPUs 0-7 (NVIDIA H100 80GB HBM3)``."""
    indices = [int(g.get("index", 0)) for g in gpus]
    names = ", ".join(dict.fromkeys(str(g.get("name")) for g in gpus))
    if len(indices) == 1:
        return f"GPU {indices[0]} ({names})"
    return f"GPUs {_ranges(indices)} ({names})"


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    for v in sorted(set(values)):
        if parts and "-" not in parts[-1].split(",")[-1] and int(parts[-1]) == v - 1:
            parts[-1] = f"{parts[-1]}-{v}"
        elif parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == v - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{v}"
        else:
            parts.append(str(v))
    return ",".join(parts)


def _physical_gpu_key(facts: dict[str, Any]) -> str | None:
    idx = facts.get("current_device")
    if idx is None:
        return None
    gpus = facts.get("gpus") or []
    if idx < len(gpus) and gpus[idx].get("uuid"):
        return "uuid:" + str(gpus[idx]["uuid"]).lower().removeprefix("gpu-")
    cvd = (facts.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if cvd:
        ids = [x.strip() for x in cvd.split(",") if x.strip()]
        if idx < len(ids):
            return "id:" + ids[idx]
    return f"index:{idx}"


def check_gpu_assignment(facts: list[dict[str, Any]], labels: dict[int, str]) -> list[Finding]:
    """GPUs each rank sees; that every rank has a GPU of its own when GPUs are used; the backend fits."""
    check = "gpu-assignment"
    out = []
    owners: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, f in enumerate(facts):
        node, rank = labels[i], f.get("rank")
        backend = (f.get("dist") or {}).get("backend")
        count = int(f.get("device_count") or 0)
        if count == 0:
            if "nccl" in str(backend or ""):
                out.append(
                    Finding(
                        check,
                        ERROR,
                        node,
                        rank,
                        "process group uses nccl but this rank sees no GPU",
                        "give every worker a GPU (gpus_per_worker=1) and leave CUDA_VISIBLE_DEVICES to Ray",
                    )
                )
            elif _has_gpu(f):
                out.append(
                    Finding(
                        check,
                        WARNING,
                        node,
                        rank,
                        f"the node has {_node_gpu_count(f)} GPU(s) but this rank sees none "
                        f"(CUDA_VISIBLE_DEVICES={(f.get('env') or {}).get('CUDA_VISIBLE_DEVICES')!r})",
                        "start the cluster with gpus_per_worker=1",
                    )
                )
            else:
                out.append(Finding(check, OK, node, rank, "no GPU visible to this rank (CPU-only)"))
            continue
        key = _physical_gpu_key(f)
        if key is not None:
            owners[(node, key)].append(rank if rank is not None else -1)
        cur = f.get("current_device")
        gpu = (f.get("gpus") or [{}])[cur or 0]
        msg = f"sees {count} GPU(s); uses cuda:{cur} ({gpu.get('name', 'GPU')})"
        if backend == "gloo":
            out.append(
                Finding(
                    check,
                    WARNING,
                    node,
                    rank,
                    msg + " but the process group uses gloo: all-reduce goes through the CPU",
                    "start the cluster with GPUs so it picks the nccl backend",
                )
            )
        else:
            out.append(Finding(check, OK, node, rank, msg))
    for (node, key), ranks in owners.items():
        if len(ranks) > 1:
            out.append(
                Finding(
                    check,
                    ERROR,
                    node,
                    None,
                    f"ranks {', '.join(map(str, sorted(ranks)))} share one GPU ({key}): NCCL fails with "
                    "'Duplicate GPU detected', and gloo runs them at a fraction of the speed",
                    "one GPU per rank: gpus_per_worker=1, torch.cuda.set_device(LOCAL_RANK)",
                )
            )
    return out


def check_network(facts: dict[str, Any], node: str, multi_node: bool) -> list[Finding]:
    """NCCL version and settings: interfaces NCCL would use, NCCL_SOCKET_IFNAME, NCCL_DEBUG."""
    out = []
    env = facts.get("env") or {}
    has_gpu = _has_gpu(facts)
    nccl = facts.get("nccl_version")
    if nccl:
        out.append(Finding("nccl", OK, node, None, f"NCCL {nccl}"))
    elif has_gpu and facts.get("torch_cuda"):
        out.append(
            Finding("nccl", WARNING, node, None, "NCCL version unknown (torch.cuda.nccl.version() failed)")
        )
    else:
        out.append(Finding("nccl", OK, node, None, "no NCCL (no GPU / CPU-only build): gloo is used"))
    debug = env.get("NCCL_DEBUG")
    if debug and debug.upper() not in ("VERSION", "WARN", "INFO", "TRACE", "ABORT"):
        out.append(
            Finding(
                "nccl-env",
                WARNING,
                node,
                None,
                f"NCCL_DEBUG={debug!r} is not a level NCCL knows",
                "use NCCL_DEBUG=WARN normally, INFO to debug",
            )
        )
    elif debug and debug.upper() in ("INFO", "TRACE"):
        out.append(
            Finding(
                "nccl-env",
                OK,
                node,
                None,
                f"NCCL_DEBUG={debug}: verbose logs in the worker output",
                "unset NCCL_DEBUG (or =WARN) when not debugging",
            )
        )
    else:
        shown = f"NCCL_DEBUG={debug}" if debug else "NCCL_DEBUG unset"
        out.append(Finding("nccl-env", OK, node, None, f"{shown} (set NCCL_DEBUG=INFO to debug hangs)"))
    for var in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"):
        if env.get(var) == "1" and has_gpu:
            out.append(
                Finding(
                    "nccl-env",
                    WARNING,
                    node,
                    None,
                    f"{var}=1: NCCL avoids {'NVLink/PCIe peer-to-peer' if 'P2P' in var else 'InfiniBand/RDMA'}",
                    f"unset {var} unless it works around a known fault",
                )
            )
    interfaces = facts.get("interfaces") or []
    route = facts.get("route") or {}
    route_if = route.get("interface")
    spec = env.get("NCCL_SOCKET_IFNAME")
    chosen = nccl_select_interfaces(spec, interfaces)
    all_names = [i["name"] for i in interfaces if i.get("ipv4")]
    relevant = has_gpu
    suffix = "" if relevant else " (NCCL unused on this CPU-only node)"
    check = "network-interface"
    if spec and not chosen:
        out.append(
            Finding(
                check,
                ERROR if relevant else OK,
                node,
                None,
                f"NCCL_SOCKET_IFNAME={spec} matches no interface with an IPv4 address "
                f"(have: {', '.join(all_names) or 'none'}){suffix}",
                f"export NCCL_SOCKET_IFNAME={route_if or (all_names[0] if all_names else 'eth0')}",
            )
        )
        return out
    if multi_node and chosen and all(n == "lo" for n in chosen):
        out.append(
            Finding(
                check,
                ERROR if relevant else WARNING,
                node,
                None,
                f"NCCL would use only the loopback interface, which cannot reach other nodes{suffix}",
                f"export NCCL_SOCKET_IFNAME={route_if or 'eth0'}",
            )
        )
        return out
    how = f"NCCL_SOCKET_IFNAME={spec}" if spec else "NCCL's default choice"
    first = chosen[0] if chosen else None
    route_txt = f"; traffic to MASTER_ADDR leaves through {route_if}" if route_if else ""
    if multi_node and route_if and route_if != "lo" and first and first != route_if:
        out.append(
            Finding(
                check,
                WARNING if relevant else OK,
                node,
                None,
                f"{how} is {', '.join(chosen)}{route_txt}: NCCL bootstraps on {first}, which may not reach "
                f"the other nodes (training stalls at the first collective){suffix}",
                f"export NCCL_SOCKET_IFNAME={route_if}",
            )
        )
    else:
        out.append(
            Finding(
                check,
                OK,
                node,
                None,
                f"{how}: {', '.join(chosen) or 'none'}{route_txt}{suffix}",
            )
        )
    return out


def check_rdma(facts: dict[str, Any], node: str, multi_node: bool) -> list[Finding]:
    """InfiniBand / EFA presence: needed for fast all-reduce between GPU nodes."""
    ib = list(facts.get("infiniband") or [])
    fi = facts.get("fi_info") or {}
    efa = bool(fi.get("efa")) or any(d.startswith(("efa", "rdmap")) for d in ib)
    env = facts.get("env") or {}
    parts = []
    if ib:
        parts.append(f"RDMA devices: {', '.join(ib)}")
    if efa:
        parts.append("EFA provider found" if fi.get("efa") else "EFA device present")
    if parts:
        if env.get("NCCL_IB_DISABLE") == "1" and not efa:
            return [
                Finding(
                    "rdma",
                    WARNING,
                    node,
                    None,
                    "; ".join(parts) + " but NCCL_IB_DISABLE=1 sends NCCL over TCP",
                    "unset NCCL_IB_DISABLE",
                )
            ]
        return [Finding("rdma", OK, node, None, "; ".join(parts))]
    if multi_node and _has_gpu(facts):
        return [
            Finding(
                "rdma",
                WARNING,
                node,
                None,
                "no InfiniBand or EFA: NCCL between nodes runs over TCP sockets (far lower bus bandwidth)",
                "for multi-node training pick instances with EFA/InfiniBand (e.g. p4d/p5, NDv4) "
                "and install the NCCL RDMA plugin",
            )
        ]
    why = "single node" if not multi_node else "CPU-only"
    return [Finding("rdma", OK, node, None, f"no InfiniBand or EFA (not needed: {why})")]


def check_storage(facts: dict[str, Any], node: str) -> list[Finding]:
    """Free disk space and /dev/shm size (too small a /dev/shm breaks DataLoader workers)."""
    out = []
    storage = facts.get("storage") or {}
    if storage:
        path, info = min(storage.items(), key=lambda kv: kv[1]["free"])
        free = info["free"] / GiB
        level = ERROR if free < 5 else WARNING if free < 20 else OK
        fix = (
            "" if level == OK else "free space or attach a bigger volume; keep checkpoints in object storage"
        )
        out.append(
            Finding(
                "disk", level, node, None, f"{free:.1f} GiB free on {path} (least of the checked paths)", fix
            )
        )
    shm = facts.get("shm")
    if shm is None:
        out.append(
            Finding(
                "shm", WARNING, node, None, "/dev/shm is missing", "mount a tmpfs at /dev/shm (or --ipc=host)"
            )
        )
    else:
        total = shm["total"] / GiB
        level = ERROR if total < 0.25 else WARNING if total < 1 else OK
        fix = (
            ""
            if level == OK
            else "docker run --shm-size=16g (or --ipc=host); on Kubernetes mount an emptyDir with medium: Memory"
        )
        msg = f"/dev/shm is {total:.2f} GiB ({shm['free'] / GiB:.2f} GiB free)"
        if level != OK:
            msg += ": DataLoader workers die with 'Bus error' / 'insufficient shared memory'"
        out.append(Finding("shm", level, node, None, msg, fix))
    return out


def check_reachability(
    facts: list[dict[str, Any]], labels: dict[int, str], probes: list[dict[str, Any]] | None = None
) -> list[Finding]:
    """MASTER_ADDR:MASTER_PORT from each rank, and every node's test listener from every rank."""
    out = []
    for i, f in enumerate(facts):
        mp = f.get("master_probe")
        env = f.get("env") or {}
        target = f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
        if mp is None:
            continue
        if mp.get("ok"):
            out.append(Finding("master-port", OK, labels[i], f.get("rank"), f"reaches {target}"))
        else:
            out.append(
                Finding(
                    "master-port",
                    ERROR,
                    labels[i],
                    f.get("rank"),
                    f"cannot reach {target}: {mp.get('error')}",
                    "allow TCP between all cluster nodes (e.g. a security group rule allowing the group itself)",
                )
            )
    rank_to_label = {f.get("rank"): labels[i] for i, f in enumerate(facts)}
    failures: dict[tuple[str, str], list[str]] = defaultdict(list)
    successes: dict[str, set[str]] = defaultdict(set)
    for p in probes or []:
        src = rank_to_label.get(p.get("rank"), "?")
        for r in p.get("results") or []:
            if r.get("ok"):
                successes[src].add(r["node"])
            else:
                failures[(src, r["node"])].append(f"{r['ip']}:{r['port']} {r.get('error')}")
    for (src, dst), errs in failures.items():
        out.append(
            Finding(
                "peer-ports",
                ERROR,
                src,
                None,
                f"cannot open a TCP connection to node {dst} on an ephemeral port ({errs[0]}); "
                "gloo and NCCL connect between all nodes on such ports",
                "allow all TCP between cluster nodes (not only MASTER_PORT)",
            )
        )
    for src, dsts in successes.items():
        bad = {d for (s, d) in failures if s == src}
        ok = sorted(dsts - bad)
        if ok:
            out.append(
                Finding("peer-ports", OK, src, None, f"reaches ephemeral TCP ports on {', '.join(ok)}")
            )
    return out


def _versions_of(f: dict[str, Any]) -> dict[str, str | None]:
    v = dict(f.get("versions") or {})
    v["torch CUDA"] = f.get("torch_cuda")
    v["NCCL"] = f.get("nccl_version")
    return v


def compare_versions(facts: list[dict[str, Any]], labels: dict[int, str] | None = None) -> list[Finding]:
    """Python, torch, Ray, gpu_notebook, numpy, torch's CUDA and NCCL must be identical on every rank."""
    labels = labels or node_labels(facts)
    keys = list(VERSION_KEYS) + ["torch CUDA", "NCCL"]
    out = []
    same: list[str] = []
    for key in keys:
        seen: dict[str | None, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for i, f in enumerate(facts):
            rank = f.get("rank")
            seen[_versions_of(f).get(key)][labels[i]].append(rank if rank is not None else i)
        if len(seen) <= 1:
            value = next(iter(seen), None)
            same.append(f"{key} {value}" if value else f"no {key}")
            continue
        majority = max(seen.items(), key=lambda kv: sum(len(r) for r in kv[1].values()))[0]
        described = "; ".join(
            f"{value or 'missing'} on "
            + ", ".join(f"{n} (ranks {','.join(map(str, sorted(r)))})" for n, r in where.items())
            for value, where in seen.items()
        )
        pkg = {"python": None, "torch CUDA": "torch", "NCCL": "torch"}.get(key, key)
        fix = (
            f"install the same {key} everywhere"
            + (
                f": pip install {pkg}=={majority}"
                if pkg and majority and key not in ("torch CUDA", "NCCL")
                else ""
            )
            + (" (same torch wheel index on every node)" if key in ("torch CUDA", "NCCL") else "")
        )
        out.append(Finding("versions", ERROR, "*", None, f"{key} differs between ranks: {described}", fix))
    if same:
        out.insert(0, Finding("versions", OK, "*", None, "identical on every rank: " + ", ".join(same)))
    drivers = {(f.get("nvml") or {}).get("driver") for f in facts if _nvml_gpus(f)}
    if len(drivers) > 1:
        out.append(
            Finding(
                "versions",
                WARNING,
                "*",
                None,
                f"NVIDIA driver differs between nodes: {', '.join(sorted(str(d) for d in drivers))}",
                "use one machine image for every node",
            )
        )
    return out


def _probe_errors(facts: dict[str, Any], node: str) -> list[Finding]:
    return [
        Finding("probe", WARNING, node, facts.get("rank"), f"probe {name} failed: {err}", "")
        for name, err in (facts.get("probe_errors") or {}).items()
    ]


def analyze(facts: list[dict[str, Any]], probes: Iterable[dict[str, Any]] | None = None) -> list[Finding]:
    """All findings for a set of per-rank facts (one dict per rank, any order) and optional peer probes."""
    facts = sorted(facts, key=lambda f: (f.get("rank") is None, f.get("rank") or 0))
    labels = node_labels(facts)
    first_of_node: dict[str, int] = {}
    for i in range(len(facts)):
        first_of_node.setdefault(labels[i], i)
    multi_node = len(first_of_node) > 1
    findings: list[Finding] = []
    for node, i in first_of_node.items():
        f = facts[i]
        findings += check_cuda_stack(f, node)
        findings += check_gpu_arch(f, node)
        findings += check_gpu_health(f, node)
        findings += check_network(f, node, multi_node)
        findings += check_rdma(f, node, multi_node)
        findings += check_storage(f, node)
    findings += check_gpu_assignment(facts, labels)
    findings += check_reachability(facts, labels, list(probes or []))
    findings += compare_versions(facts, labels)
    for i, f in enumerate(facts):
        findings += _probe_errors(f, labels[i])
    return findings
