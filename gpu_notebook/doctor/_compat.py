"""Version and capability tables: NVIDIA driver vs CUDA, GPU compute capability vs compiled architectures.

Pure functions, no GPU and no torch needed. The tables come from NVIDIA's CUDA Toolkit release notes
("CUDA Toolkit and Corresponding Driver Versions", Linux x86_64, GA releases), the CUDA Compatibility guide
(minor version compatibility: 11.x needs >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580) and the CUDA C
Programming Guide's binary/PTX compatibility rules:

* a cubin built for ``sm_XY`` runs on a GPU of compute capability ``X.Z`` only when ``Z >= Y`` (same major);
  an arch-specific ``sm_XYa`` cubin runs only on exactly ``X.Y``;
* PTX built for ``compute_XY`` is JIT-compiled by the driver for any GPU of capability ``>= X.Y``; arch-specific
  ``compute_XYa`` PTX only for exactly ``X.Y``, family-specific ``compute_XYf`` only for ``X.Z`` with ``Z >= Y``.

A GPU whose capability none of the compiled architectures covers fails at the first kernel with
``CUDA error: no kernel image is available for execution on the device``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CUDA_DRIVER_TABLE",
    "MINOR_COMPAT_MIN_DRIVER",
    "CC_MIN_CUDA",
    "CC_MAX_CUDA_MAJOR",
    "TORCH_WHEEL_CUDA",
    "TORCH_WHEEL_MIN_CC",
    "NO_KERNEL_IMAGE",
    "ArchSupport",
    "DriverCompat",
    "parse_version",
    "format_version",
    "format_driver",
    "parse_cuda_version",
    "cuda_from_nvml",
    "max_cuda_for_driver",
    "min_driver_for_cuda",
    "driver_runs_cuda",
    "parse_arch",
    "arch_support",
    "min_cuda_for_cc",
    "cuda_supports_cc",
    "recommend_wheel",
    "gpu_arch_name",
]

Version = tuple[int, ...]

NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"

#: CUDA toolkit (major, minor) -> minimum Linux x86_64 driver of its GA release (newest first).
CUDA_DRIVER_TABLE: list[tuple[tuple[int, int], Version]] = [
    ((13, 0), (580, 65, 6)),
    ((12, 9), (575, 51, 3)),
    ((12, 8), (570, 26)),
    ((12, 6), (560, 28, 3)),
    ((12, 5), (555, 42, 2)),
    ((12, 4), (550, 54, 14)),
    ((12, 3), (545, 23, 6)),
    ((12, 2), (535, 54, 3)),
    ((12, 1), (530, 30, 2)),
    ((12, 0), (525, 60, 13)),
    ((11, 8), (520, 61, 5)),
    ((11, 7), (515, 43, 4)),
    ((11, 6), (510, 39, 1)),
    ((11, 5), (495, 29, 5)),
    ((11, 4), (470, 42, 1)),
    ((11, 3), (465, 19, 1)),
    ((11, 2), (460, 27, 3)),
    ((11, 1), (455, 23)),
    ((11, 0), (450, 51, 5)),  # 11.0.2 GA (450.36.06 was the 11.0.1 release candidate)
    ((10, 2), (440, 33)),
    ((10, 1), (418, 39)),
    ((10, 0), (410, 48)),
    ((9, 2), (396, 26)),
    ((9, 1), (390, 46)),
    ((9, 0), (384, 81)),
]

#: CUDA major -> minimum driver that runs any minor release of it through minor version compatibility.
MINOR_COMPAT_MIN_DRIVER: dict[int, Version] = {
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580,),
}

#: Compute capability -> first CUDA toolkit that can compile for it.
CC_MIN_CUDA: dict[tuple[int, int], tuple[int, int]] = {
    (3, 5): (5, 0),
    (3, 7): (6, 5),
    (5, 0): (6, 0),
    (5, 2): (6, 5),
    (5, 3): (6, 5),
    (6, 0): (8, 0),
    (6, 1): (8, 0),
    (6, 2): (8, 0),
    (7, 0): (9, 0),
    (7, 2): (10, 0),
    (7, 5): (10, 0),
    (8, 0): (11, 0),
    (8, 6): (11, 1),
    (8, 7): (11, 4),
    (8, 9): (11, 8),
    (9, 0): (11, 8),
    (10, 0): (12, 8),
    (10, 3): (12, 9),
    (11, 0): (13, 0),
    (12, 0): (12, 8),
    (12, 1): (12, 9),
}

#: Compute-capability major -> last CUDA major that still compiles for it (Kepler left in 12.0;
#: Maxwell, Pascal and Volta in 13.0).
CC_MAX_CUDA_MAJOR: dict[int, int] = {3: 11, 5: 12, 6: 12, 7: 12}  # 7.5 (Turing) excepted: still supported

#: CUDA versions of the PyTorch wheel indexes (https://download.pytorch.org/whl/cuXYZ), oldest first.
TORCH_WHEEL_CUDA: list[tuple[int, int]] = [
    (10, 2), (11, 1), (11, 3), (11, 6), (11, 7), (11, 8),
    (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0),
]  # fmt: skip

#: Wheel index CUDA -> lowest compute capability its newest PyTorch wheels still carry, where that is above what
#: the toolkit itself could build. PyTorch's pip wheels have had no ``sm_35`` since 1.3.1 (Kepler: only the
#: K80's ``sm_37``, pytorch/pytorch#24205 and #30532; the build scripts' ``TORCH_CUDA_ARCH_LIST`` starts at 3.7
#: for CUDA 10.x and 11.x), and none after CUDA 11.8 has Kepler at all. PyTorch dropped Maxwell and Pascal
#: from its CUDA 12.8/12.9 wheels (2.8) and Volta from them too (2.11); those GPUs are served by the cu126
#: wheels (pytorch/pytorch#157517, #172352).
TORCH_WHEEL_MIN_CC: dict[tuple[int, int], tuple[int, int]] = {
    (10, 2): (3, 7),
    (11, 1): (3, 7),
    (11, 3): (3, 7),
    (11, 6): (3, 7),
    (11, 7): (3, 7),
    (11, 8): (3, 7),
    (12, 8): (7, 5),
    (12, 9): (7, 5),
    (13, 0): (7, 5),
}

_ARCH_NAMES = {
    3: "Kepler",
    5: "Maxwell",
    6: "Pascal",
    7: "Volta",
    8: "Ampere",
    9: "Hopper",
    10: "Blackwell",
    11: "Blackwell",
    12: "Blackwell",
}


def parse_version(text: str | int | float | tuple[int, ...] | None) -> Version | None:
    """Parse ``"550.54.15"``, ``"12.4"`` or ``(12, 4)`` into a tuple of ints; ``None`` if not a version."""
    if text is None:
        return None
    if isinstance(text, tuple):
        return tuple(int(x) for x in text)
    match = re.match(r"\s*(\d+(?:\.\d+)*)", str(text))
    if not match:
        return None
    return tuple(int(x) for x in match.group(1).split("."))


def format_version(version: Version | None) -> str:
    """``(12, 4)`` -> ``"12.4"``; ``None`` -> ``"unknown"``."""
    return "unknown" if version is None else ".".join(str(x) for x in version)


def format_driver(version: Version | None) -> str:
    """NVIDIA's spelling of a driver version: ``(530, 30, 2)`` -> ``"530.30.02"``."""
    if version is None:
        return "unknown"
    return ".".join([str(version[0])] + [f"{x:02d}" for x in version[1:]])


def parse_cuda_version(text: str | tuple[int, ...] | None) -> tuple[int, int] | None:
    """``"12.4"`` / ``"12.4.1"`` -> ``(12, 4)``."""
    v = parse_version(text)
    if not v:
        return None
    return (v[0], v[1] if len(v) > 1 else 0)


def cuda_from_nvml(value: int | None) -> tuple[int, int] | None:
    """NVML's ``nvmlSystemGetCudaDriverVersion`` integer (``12040``) -> ``(12, 4)``."""
    if not value:
        return None
    return (int(value) // 1000, (int(value) % 1000) // 10)


def max_cuda_for_driver(driver: str | Version | None) -> tuple[int, int] | None:
    """The newest CUDA toolkit (major, minor) whose GA release the driver fully supports.

    ``None`` when the driver is unknown or older than every table entry. A driver newer than the newest
    table entry returns that entry (it may support more; NVML's own answer is preferred when available).
    """
    v = parse_version(driver) if not isinstance(driver, tuple) else driver
    if not v:
        return None
    for cuda, min_driver in CUDA_DRIVER_TABLE:
        if v >= min_driver:
            return cuda
    return None


def min_driver_for_cuda(cuda: str | tuple[int, ...] | None) -> Version | None:
    """Minimum Linux driver for the GA release of a CUDA toolkit; for an unlisted minor, the next lower one."""
    c = parse_cuda_version(cuda)
    if c is None:
        return None
    for entry, min_driver in CUDA_DRIVER_TABLE:
        if entry <= c and entry[0] == c[0]:
            return min_driver
    return None


@dataclass(frozen=True)
class DriverCompat:
    """Whether a driver runs code built with a CUDA toolkit.

    ``status`` is ``"ok"`` (fully supported), ``"minor_compat"`` (runs through CUDA minor version
    compatibility, with a limited feature set: no JIT of PTX from the newer toolkit), ``"too_old"``
    (fails with "CUDA driver version is insufficient for CUDA runtime version") or ``"unknown"``.
    """

    status: str
    driver: Version | None
    cuda: tuple[int, int] | None
    driver_max_cuda: tuple[int, int] | None
    needed_driver: Version | None

    @property
    def runs(self) -> bool:
        """True when code built with ``cuda`` runs on this driver (fully or through minor compatibility)."""
        return self.status in ("ok", "minor_compat")


def driver_runs_cuda(
    driver: str | Version | None,
    cuda: str | tuple[int, ...] | None,
    driver_max_cuda: tuple[int, int] | None = None,
) -> DriverCompat:
    """Decide whether a driver can run code built with CUDA ``cuda``.

    Parameters
    ----------
    driver
        Driver version, e.g. ``"550.54.15"``.
    cuda
        CUDA version the code was built with, e.g. ``torch.version.cuda`` (``"12.1"``).
    driver_max_cuda
        The driver's own answer (NVML ``nvmlSystemGetCudaDriverVersion``), preferred over the table.
    """
    d = parse_version(driver) if not isinstance(driver, tuple) else driver
    c = parse_cuda_version(cuda)
    max_cuda = driver_max_cuda or max_cuda_for_driver(d)
    needed = min_driver_for_cuda(c)
    if c is None or (d is None and driver_max_cuda is None):
        return DriverCompat("unknown", d, c, max_cuda, needed)
    if max_cuda is not None and c <= max_cuda:
        return DriverCompat("ok", d, c, max_cuda, needed)
    compat_min = MINOR_COMPAT_MIN_DRIVER.get(c[0])
    same_major = max_cuda is not None and max_cuda[0] == c[0]
    if compat_min is not None and d is not None and d >= compat_min and (same_major or max_cuda is None):
        return DriverCompat("minor_compat", d, c, max_cuda, needed)
    if compat_min is not None and d is None and same_major:
        return DriverCompat("minor_compat", d, c, max_cuda, needed)
    return DriverCompat("too_old", d, c, max_cuda, needed)


def parse_arch(name: str) -> tuple[str, int, int, str] | None:
    """``"sm_90a"`` -> ``("sm", 9, 0, "a")``; ``"compute_80"`` -> ``("compute", 8, 0, "")``; else ``None``.

    The last digit is the minor version, the digits before it the major (``sm_100`` is 10.0, ``sm_120`` 12.0).
    """
    match = re.fullmatch(r"(sm|compute)_(\d+)(\d)([a-z]?)", name.strip())
    if not match:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)


@dataclass(frozen=True)
class ArchSupport:
    """How a GPU of capability ``cc`` gets kernels from a build compiled for ``arch_list``.

    ``how`` is ``"sass"`` (a compatible cubin is compiled in), ``"ptx"`` (only by JIT-compiling PTX at first
    use: slow start, and the driver must support the PTX's toolkit) or ``"none"`` (every kernel fails with
    :data:`NO_KERNEL_IMAGE`). ``via`` names the matching entry.
    """

    how: str
    via: str | None
    cc: tuple[int, int]
    arch_list: tuple[str, ...]


def arch_support(cc: tuple[int, int], arch_list: list[str] | tuple[str, ...]) -> ArchSupport:
    """Apply CUDA's binary compatibility rules to a compute capability and ``torch.cuda.get_arch_list()``."""
    major, minor = int(cc[0]), int(cc[1])
    best_sass: tuple[int, str] | None = None
    best_ptx: tuple[tuple[int, int], str] | None = None
    for name in arch_list:
        parsed = parse_arch(name)
        if parsed is None:
            continue
        kind, a_major, a_minor, suffix = parsed
        if kind == "sm":
            if a_major != major or a_minor > minor:
                continue
            if suffix == "a" and a_minor != minor:
                continue
            if best_sass is None or a_minor > best_sass[0]:
                best_sass = (a_minor, name)
        else:
            if (a_major, a_minor) > (major, minor):
                continue
            if (suffix == "a" and a_minor != minor) or (suffix in ("a", "f") and a_major != major):
                continue  # arch-specific PTX only JITs for its own GPU, family-specific within its family
            if best_ptx is None or (a_major, a_minor) > best_ptx[0]:
                best_ptx = ((a_major, a_minor), name)
    arches = tuple(arch_list)
    if best_sass is not None:
        return ArchSupport("sass", best_sass[1], (major, minor), arches)
    if best_ptx is not None:
        return ArchSupport("ptx", best_ptx[1], (major, minor), arches)
    return ArchSupport("none", None, (major, minor), arches)


def min_cuda_for_cc(cc: tuple[int, int]) -> tuple[int, int] | None:
    """First CUDA toolkit that compiles for this compute capability (``None`` if unknown)."""
    cc = (int(cc[0]), int(cc[1]))
    if cc in CC_MIN_CUDA:
        return CC_MIN_CUDA[cc]
    same_major = sorted(k for k in CC_MIN_CUDA if k[0] == cc[0] and k <= cc)
    return CC_MIN_CUDA[same_major[-1]] if same_major else None


def cuda_supports_cc(cuda: tuple[int, int], cc: tuple[int, int]) -> bool:
    """Can toolkit ``cuda`` compile native code for ``cc``? (Not before it appeared, not after it was dropped.)"""
    low = min_cuda_for_cc(cc)
    if low is None or cuda < low:
        return False
    if tuple(cc) == (7, 5):
        return True
    last_major = CC_MAX_CUDA_MAJOR.get(int(cc[0]))
    return last_major is None or cuda[0] <= last_major


def _wheel_runs_on(cuda: tuple[int, int], cc: tuple[int, int]) -> bool:
    """Do the newest PyTorch wheels for ``cuda`` have a cubin that runs on ``cc``?

    A cubin for ``X.Y`` runs on ``X.Z`` with ``Z >= Y``, so the GPU's own capability need not be compiled in:
    an ``sm_86`` cubin runs an RTX 4090 (8.9) and ``sm_120`` a GB10 (12.1), in wheels built before the
    toolkit knew those GPUs.
    """
    low = max(TORCH_WHEEL_MIN_CC.get(cuda, (0, 0)), (cc[0], 0))
    return any(low <= k <= cc and cuda_supports_cc(cuda, k) for k in CC_MIN_CUDA)


def _no_wheel(cc: tuple[int, int]) -> str:
    """What to say when no PyTorch wheel index runs on ``cc``."""
    text = f"no current PyTorch wheel supports compute capability {cc[0]}.{cc[1]}, {gpu_arch_name(cc)}"
    toolkits = [c for c, _ in CUDA_DRIVER_TABLE if cuda_supports_cc(c, cc)]
    if toolkits:  # the toolkit still compiles for it: only a source build helps
        last = format_version(toolkits[0])
        text += (
            f"; build PyTorch from source with CUDA <= {last} and TORCH_CUDA_ARCH_LIST={cc[0]}.{cc[1]}, "
            "or use a newer GPU"
        )
    return text


def recommend_wheel(
    cc: tuple[int, int], driver_max_cuda: tuple[int, int] | None = None
) -> tuple[str | None, str]:
    """The PyTorch wheel index to install for a GPU, and a one-line instruction.

    Picks the newest ``cuXYZ`` wheel with a cubin that runs on ``cc`` (its CUDA compiles for ``cc`` or a lower
    minor of the same major, and its PyTorch builds still include that: :data:`TORCH_WHEEL_MIN_CC`) and that
    the driver fully supports
    (``driver_max_cuda``); with an unknown driver, the oldest wheel that supports ``cc`` (the least driver
    demand). Returns ``(None, advice)`` when the driver is too old for every such wheel, or when no wheel runs on
    the GPU at all (Kepler ``sm_35``: build from source).
    """
    cc = (int(cc[0]), int(cc[1]))
    fits = [c for c in TORCH_WHEEL_CUDA if _wheel_runs_on(c, cc)]
    if not fits:
        return None, _no_wheel(cc)
    if driver_max_cuda is None:
        chosen = fits[0]
    else:
        usable = [c for c in fits if c <= driver_max_cuda]
        if not usable:
            need = min_driver_for_cuda(fits[0])
            tag = f"cu{fits[0][0]}{fits[0][1]}"
            return None, (
                f"upgrade the NVIDIA driver to >= {format_driver(need)} (CUDA {fits[0][0]}.{fits[0][1]}), "
                f"then pip install torch --index-url https://download.pytorch.org/whl/{tag}"
            )
        chosen = usable[-1]
    tag = f"cu{chosen[0]}{chosen[1]}"
    return tag, f"pip install torch --index-url https://download.pytorch.org/whl/{tag}"


def gpu_arch_name(cc: tuple[int, int]) -> str:
    """``(9, 0)`` -> ``"sm_90 (Hopper)"``."""
    major, minor = int(cc[0]), int(cc[1])
    family = "Turing" if (major, minor) == (7, 5) else "Ada" if (major, minor) == (8, 9) else None
    family = family or _ARCH_NAMES.get(major, "unknown")
    return f"sm_{major}{minor} ({family})"
