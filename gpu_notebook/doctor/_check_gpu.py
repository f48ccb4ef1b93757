"""Checks of the GPUs themselves and of who uses them: ECC, row remapping, throttling, persistence mode (NVML),
and that every rank has a GPU of its own with a backend that uses it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ._findings import Findings
from ._gpus import gpus_label, has_gpu, node_gpu_count, nvml_gpus
from ._report import ERROR, OK, WARNING, Finding
from ._shapes import Facts, NvmlGpu

__all__ = ["THROTTLE_REASONS", "check_gpu_assignment", "check_gpu_health", "decode_throttle"]

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

#: One judgement about one GPU: (check, level, message, fix).
_Verdict = tuple[str, str, str, str]


def decode_throttle(mask: int) -> tuple[list[str], list[str]]:
    """Split an NVML throttle bitmask into ``(harmless reasons, problem reasons)``."""
    harmless: list[str] = []
    bad: list[str] = []
    for bit, (name, problem) in THROTTLE_REASONS.items():
        if mask & bit:
            (bad if problem else harmless).append(name)
    return harmless, bad


def check_gpu_health(facts: Facts, node: str) -> list[Finding]:
    """ECC errors, row remapping, throttling and persistence mode of every GPU (NVML).

    GPUs with the same verdict become one finding naming them all (``GPUs 0-7 (NVIDIA H100)``).
    """
    out = Findings("gpu-health", node)
    nvml = facts.get("nvml") or {}
    if not has_gpu(facts):
        return out.ok("no GPU on this node; ECC/throttle/persistence skipped").findings
    if not nvml.get("available"):
        return out.warn(
            f"NVML unavailable ({nvml.get('reason', 'unknown')}): ECC, throttling and persistence not checked",
            "pip install nvidia-ml-py (and make libnvidia-ml.so visible in the container)",
        ).findings
    groups: dict[_Verdict, list[NvmlGpu]] = {}
    for g in nvml_gpus(facts):
        for verdict in _gpu_verdicts(g):
            groups.setdefault(verdict, []).append(g)
    for (check, level, text, fix), gpus in groups.items():
        out.add(level, f"{gpus_label(gpus)}: {text}", fix, check=check)
    return out.findings


def _gpu_verdicts(g: NvmlGpu) -> list[_Verdict]:
    """What NVML's counters say about one GPU: ECC (or row remapping), throttling, persistence."""
    out: list[_Verdict] = []
    vol, agg = g.get("ecc_uncorrected_volatile"), g.get("ecc_uncorrected_aggregate")
    if vol:
        fix = "drain this node: reset the GPU (nvidia-smi -r) or replace the instance"
        out.append(("ecc", ERROR, f"{vol} uncorrected ECC errors since the last reset", fix))
    elif agg:
        fix = "watch it; replace the instance if errors come back"
        out.append(("ecc", WARNING, f"{agg} uncorrected ECC errors over its lifetime", fix))
    elif g.get("remap_failure"):
        out.append(("ecc", ERROR, "row remapping failed", "replace the instance"))
    elif g.get("remap_pending"):
        out.append(
            ("ecc", WARNING, "row remapping pending", "reset the GPU (nvidia-smi -r) or reboot to apply it")
        )
    else:
        mode = {0: "ECC off", 1: "ECC on"}.get(g.get("ecc_mode"), "ECC mode unknown")  # type: ignore[arg-type]
        out.append(("ecc", OK, f"no uncorrected ECC errors ({mode})", ""))
    mask = g.get("throttle_mask")
    if mask is not None:
        _harmless, bad = decode_throttle(int(mask))
        if bad:
            fix = "check cooling and power (nvidia-smi -q -d PERFORMANCE); move off this node if it persists"
            out.append(("throttle", WARNING, f"clocks throttled by {', '.join(bad)}", fix))
        else:
            out.append(("throttle", OK, "no thermal or power slowdown", ""))
    pm = g.get("persistence")
    if pm == 0:
        text = "persistence mode off (every new process pays seconds of driver start-up)"
        out.append(("persistence", WARNING, text, "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)"))
    elif pm == 1:
        out.append(("persistence", OK, "persistence mode on", ""))
    return out


def _physical_gpu_key(facts: Facts) -> str | None:
    """Which physical GPU this rank uses: its UUID, else its CUDA_VISIBLE_DEVICES entry, else its index."""
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


def check_gpu_assignment(facts: Sequence[Facts], labels: dict[int, str]) -> list[Finding]:
    """GPUs each rank sees; that every rank has a GPU of its own when GPUs are used; the backend fits."""
    out = Findings("gpu-assignment", "*")
    owners: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, f in enumerate(facts):
        node, rank = labels[i], f.get("rank")
        if int(f.get("device_count") or 0) == 0:
            _no_visible_gpu(f, out, node, rank)
            continue
        key = _physical_gpu_key(f)
        if key is not None:
            owners[(node, key)].append(rank if rank is not None else -1)
        _visible_gpu(f, out, node, rank)
    for (node, key), ranks in owners.items():
        if len(ranks) > 1:
            out.error(
                f"ranks {', '.join(map(str, sorted(ranks)))} share one GPU ({key}): NCCL fails with "
                "'Duplicate GPU detected', and gloo runs them at a fraction of the speed",
                "one GPU per rank: gpus_per_worker=1, torch.cuda.set_device(LOCAL_RANK)",
                node=node,
                rank=None,
            )
    return out.findings


def _no_visible_gpu(f: Facts, out: Findings, node: str, rank: int | None) -> None:
    """A rank that sees no GPU: an error under nccl, a warning on a GPU node, fine on a CPU node."""
    if "nccl" in str((f.get("dist") or {}).get("backend") or ""):
        out.error(
            "process group uses nccl but this rank sees no GPU",
            "give every worker a GPU (gpus_per_worker=1) and leave CUDA_VISIBLE_DEVICES to Ray",
            node=node,
            rank=rank,
        )
    elif has_gpu(f):
        out.warn(
            f"the node has {node_gpu_count(f)} GPU(s) but this rank sees none "
            f"(CUDA_VISIBLE_DEVICES={(f.get('env') or {}).get('CUDA_VISIBLE_DEVICES')!r})",
            "start the cluster with gpus_per_worker=1",
            node=node,
            rank=rank,
        )
    else:
        out.ok("no GPU visible to this rank (CPU-only)", node=node, rank=rank)


def _visible_gpu(f: Facts, out: Findings, node: str, rank: int | None) -> None:
    """A rank with GPUs: which one it uses, and a warning when the process group still uses gloo."""
    cur = f.get("current_device")
    gpu = (f.get("gpus") or [{}])[cur or 0]
    msg = f"sees {int(f.get('device_count') or 0)} GPU(s); uses cuda:{cur} ({gpu.get('name', 'GPU')})"
    if (f.get("dist") or {}).get("backend") == "gloo":
        out.warn(
            msg + " but the process group uses gloo: all-reduce goes through the CPU",
            "start the cluster with GPUs so it picks the nccl backend",
            node=node,
            rank=rank,
        )
    else:
        out.ok(msg, node=node, rank=rank)
