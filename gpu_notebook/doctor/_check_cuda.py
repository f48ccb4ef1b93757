"""Checks of the CUDA stack: the NVIDIA driver against PyTorch's CUDA build, and each GPU's architecture
against the architectures compiled into PyTorch.

These are the failures that stop every kernel ("CUDA driver version is insufficient", "no kernel image is
available"), so each finding says which wheel or driver fixes it (:mod:`._compat` has the tables).
"""

from __future__ import annotations

from ._compat import (
    NO_KERNEL_IMAGE,
    DriverCompat,
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
from ._findings import Findings
from ._gpus import driver_max_cuda, gpu_ccs, has_gpu, kernel_runs, node_gpu_count
from ._report import Finding
from ._shapes import Facts, KernelProbe

__all__ = ["check_cuda_stack", "check_gpu_arch"]


def check_cuda_stack(facts: Facts, node: str, rank: int | None = None) -> list[Finding]:
    """Driver version vs the CUDA version PyTorch was built with; CPU-only builds on GPU nodes."""
    out = Findings("cuda-driver", node, rank)
    torch_cuda = facts.get("torch_cuda")
    if not has_gpu(facts):
        build = f"PyTorch built with CUDA {torch_cuda}" if torch_cuda else "CPU-only PyTorch build"
        return out.ok(f"no GPU on this node ({build}); driver check skipped").findings
    driver = (facts.get("nvml") or {}).get("driver")
    n_gpus = node_gpu_count(facts)
    if not torch_cuda:
        ccs = gpu_ccs(facts)
        _tag, how = (
            recommend_wheel(ccs[0][1], driver_max_cuda(facts))
            if ccs
            else (None, "install a CUDA build of torch")
        )
        text = f"CPU-only PyTorch build on a node with {n_gpus} GPU(s): nothing will run on the GPU"
        return out.error(text, how).findings
    cvd = (facts.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if not facts.get("cuda_available") and cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        return out.warn(
            f"the node has {n_gpus} GPU(s) but CUDA_VISIBLE_DEVICES={cvd!r} hides them from this process; "
            f"driver {driver or '?'}, PyTorch CUDA {torch_cuda}",
            "start the cluster with gpus_per_worker=1 to use them",
        ).findings
    compat = driver_runs_cuda(driver, torch_cuda, driver_max_cuda(facts))
    if _runs_forward_compat(facts, compat.status) and kernel_runs(facts):
        return out.ok(_forward_compat_text(facts, driver, compat.driver_max_cuda)).findings
    if compat.status == "too_old":
        return _driver_too_old(facts, out, compat).findings
    return _cuda_state(facts, out, compat).findings


def _runs_forward_compat(facts: Facts, status: str) -> bool:
    """Whether a driver older than PyTorch's CUDA may still run it through a newer user-mode libcuda."""
    if status not in ("too_old", "minor_compat"):
        return False
    umd = cuda_from_nvml(facts.get("libcuda_cuda"))
    built = parse_cuda_version(facts.get("torch_cuda"))
    return status == "too_old" or (umd is not None and built is not None and umd >= built)


def _forward_compat_text(facts: Facts, driver: str | None, kmd_cuda: tuple[int, int] | None) -> str:
    """The OK message for a driver older than PyTorch's CUDA on which CUDA evidently works.

    That is CUDA forward compatibility: a ``cuda-compat`` package puts a newer user-mode driver (libcuda) in
    front of the older kernel-mode driver, which is all NVML's driver version describes. NVIDIA supports it only
    on data-center GPUs, select NGC Server Ready RTX SKUs and Jetson boards.
    """
    umd = cuda_from_nvml(facts.get("libcuda_cuda"))
    umd_text = f"the user-mode libcuda it loaded supports CUDA {format_version(umd)}" if umd else "CUDA works"
    return (
        f"driver {driver or '?'} (kernel module, CUDA <= {format_version(kmd_cuda)}) is older than PyTorch's "
        f"CUDA {facts.get('torch_cuda')}, but a CUDA kernel runs: {umd_text}, through CUDA forward "
        "compatibility (a cuda-compat package; data-center GPUs only)"
    )


def _driver_too_old(facts: Facts, out: Findings, compat: DriverCompat) -> Findings:
    """The driver cannot run PyTorch's CUDA: upgrade it, or install a wheel it runs that has the GPU's arch.

    torch.cuda.is_available() is False then ("The NVIDIA driver on your system is too old"), unless a CUDA
    forward-compatibility package supplies a newer libcuda.
    """
    ccs = gpu_ccs(facts)
    driver = (facts.get("nvml") or {}).get("driver")
    tag, how = recommend_wheel(ccs[0][1], driver_max_cuda(facts)) if ccs else (None, "")
    if not tag:  # no wheel this driver runs has the GPU's architecture: only the upgrade helps
        how = ""
        if not ccs and compat.driver_max_cuda:  # GPU model unknown (no NVML, CUDA unusable)
            how = f"install a PyTorch build for CUDA <= {format_version(compat.driver_max_cuda)}"
    fix = f"upgrade the driver to >= {format_driver(compat.needed_driver)}" + (f", or {how}" if how else "")
    state = "" if facts.get("cuda_available") else "torch.cuda.is_available() is False: "
    probe = facts.get("cuda_kernel") or KernelProbe(ok=False, error=None)
    if facts.get("cuda_available") and probe.get("error"):
        state = f"a CUDA kernel fails ({probe['error']}): "
    return out.error(
        f"{state}driver {driver or '?'} (CUDA <= {format_version(compat.driver_max_cuda)}) is older "
        f"than PyTorch's CUDA {facts.get('torch_cuda')}: 'CUDA driver version is insufficient for CUDA runtime "
        "version'",
        fix,
    )


def _cuda_state(facts: Facts, out: Findings, compat: DriverCompat) -> Findings:
    """The driver is new enough (or its limit unknown): does CUDA initialise and run a kernel here?"""
    driver = (facts.get("nvml") or {}).get("driver")
    torch_cuda = facts.get("torch_cuda")
    if not facts.get("cuda_available"):
        return out.error(
            f"the node has {node_gpu_count(facts)} GPU(s) but torch.cuda.is_available() is False "
            f"(driver {driver or 'unknown'}, PyTorch CUDA {torch_cuda})",
            "check CUDA_VISIBLE_DEVICES and the container's GPU access (docker run --gpus all), "
            "and that the driver supports the build",
        )
    probe = facts.get("cuda_kernel") or KernelProbe(ok=False, error=None)
    if kernel_runs(facts) is False:
        return out.error(
            f"CUDA initialises (driver {driver or 'unknown'}, PyTorch CUDA {torch_cuda}) but a small CUDA "
            f"kernel fails: {probe.get('error')}",
            "run nvidia-smi on the node: the GPU may be in exclusive-process mode and busy, or faulty "
            "(Xid errors in dmesg); with a cuda-compat package, it must match the kernel driver",
        )
    if driver is None and driver_max_cuda(facts) is None:
        return out.ok(
            f"CUDA works (PyTorch CUDA {torch_cuda}); driver version unknown without NVML",
            "pip install nvidia-ml-py to let the doctor read the driver version",
        )
    shown_max = format_version(compat.driver_max_cuda)
    if compat.status == "ok":
        return out.ok(
            f"driver {driver or '?'} supports up to CUDA {shown_max}; PyTorch built with CUDA {torch_cuda}"
        )
    if compat.status == "minor_compat":
        return out.warn(
            f"driver {driver or '?'} supports CUDA {shown_max}, PyTorch is built with CUDA {torch_cuda}: "
            "runs through CUDA minor version compatibility (no JIT of its newer PTX, some features missing)",
            f"upgrade the driver to >= {format_driver(compat.needed_driver)}, or install a torch build for "
            f"CUDA <= {shown_max}",
        )
    return out.ok(f"driver {driver or '?'}; PyTorch CUDA {torch_cuda}; compatibility unknown")


def check_gpu_arch(facts: Facts, node: str, rank: int | None = None) -> list[Finding]:
    """Each GPU's compute capability against ``torch.cuda.get_arch_list()``."""
    out = Findings("gpu-arch", node, rank)
    if not has_gpu(facts):
        return out.ok("no GPU on this node; architecture check skipped").findings
    arch_list = list(facts.get("torch_arch_list") or [])
    if not facts.get("torch_cuda"):
        return []  # reported by check_cuda_stack
    if not arch_list:
        return out.ok("PyTorch reported no compiled architectures; check skipped").findings
    max_cuda = driver_max_cuda(facts)
    torch_cuda = facts.get("torch_cuda")
    for name, cc in dict.fromkeys(gpu_ccs(facts)):
        sup = arch_support(cc, arch_list)
        arch = gpu_arch_name(cc)
        if sup.how == "sass":
            out.ok(f"{name} is {arch}; PyTorch has {sup.via}")
            continue
        tag, how = recommend_wheel(cc, max_cuda)
        if sup.how == "ptx":
            out.warn(
                f"{name} is {arch}; PyTorch only has PTX {sup.via}: kernels are JIT-compiled at first use "
                "(slow start, needs a driver that knows that PTX)",
                how if tag else f"install a torch build with {arch.split()[0]}",
            )
            continue
        low = min_cuda_for_cc(cc)
        built = parse_cuda_version(torch_cuda)
        why = ""
        if low and built and built < low:
            why = (
                f" (CUDA {torch_cuda} predates {arch.split()[0]}, which needs CUDA >= {format_version(low)})"
            )
        out.error(
            f"{name} is {arch} but PyTorch (CUDA {torch_cuda}) was compiled only for {', '.join(arch_list)}"
            f"{why}: every kernel fails with '{NO_KERNEL_IMAGE}'",
            how,
        )
    return out.findings
