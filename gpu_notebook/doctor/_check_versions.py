"""The cross-rank version check: Python, torch, Ray, gpu_notebook, numpy, torch's CUDA and NCCL must be
identical on every rank, and the NVIDIA driver should be.

Mismatched versions fail in confusing ways (pickling errors, NCCL hangs, silently different numerics), so the
finding names which ranks have which version and the ``pip install`` that aligns them with the majority.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ._findings import Findings, node_labels
from ._gpus import nvml_gpus
from ._report import Finding
from ._shapes import Facts

__all__ = ["VERSION_KEYS", "compare_versions"]

VERSION_KEYS = ("python", "torch", "ray", "gpu_notebook", "numpy")


def _versions_of(f: Facts) -> dict[str, str | None]:
    v = dict(f.get("versions") or {})
    v["torch CUDA"] = f.get("torch_cuda")
    v["NCCL"] = f.get("nccl_version")
    return v


def compare_versions(facts: Sequence[Facts], labels: dict[int, str] | None = None) -> list[Finding]:
    """Python, torch, Ray, gpu_notebook, numpy, torch's CUDA and NCCL must be identical on every rank."""
    labels = labels or node_labels(facts)
    differ = Findings("versions", "*")
    same: list[str] = []
    for key in list(VERSION_KEYS) + ["torch CUDA", "NCCL"]:
        seen: dict[str | None, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for i, f in enumerate(facts):
            rank = f.get("rank")
            seen[_versions_of(f).get(key)][labels[i]].append(rank if rank is not None else i)
        if len(seen) <= 1:
            value = next(iter(seen), None)
            same.append(f"{key} {value}" if value else f"no {key}")
            continue
        described = "; ".join(
            f"{value or 'missing'} on "
            + ", ".join(f"{n} (ranks {','.join(map(str, sorted(r)))})" for n, r in where.items())
            for value, where in seen.items()
        )
        differ.error(f"{key} differs between ranks: {described}", _align_fix(key, seen))
    out = Findings("versions", "*")
    if same:
        out.ok("identical on every rank: " + ", ".join(same))
    out.extend(differ.findings)
    drivers = {(f.get("nvml") or {}).get("driver") for f in facts if nvml_gpus(f)}
    if len(drivers) > 1:
        out.warn(
            f"NVIDIA driver differs between nodes: {', '.join(sorted(str(d) for d in drivers))}",
            "use one machine image for every node",
        )
    return out.findings


def _align_fix(key: str, seen: dict[str | None, dict[str, list[int]]]) -> str:
    """``install the same torch everywhere: pip install torch==<the majority's version>``."""
    majority = max(seen.items(), key=lambda kv: sum(len(r) for r in kv[1].values()))[0]
    pkg = {"python": None, "torch CUDA": "torch", "NCCL": "torch"}.get(key, key)
    return (
        f"install the same {key} everywhere"
        + (
            f": pip install {pkg}=={majority}"
            if pkg and majority and key not in ("torch CUDA", "NCCL")
            else ""
        )
        + (" (same torch wheel index on every node)" if key in ("torch CUDA", "NCCL") else "")
    )
