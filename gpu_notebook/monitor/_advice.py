"""Under-utilisation advice and the utilisation summary that idle detection reads.

A GPU whose utilisation stays under a threshold (70% by default, the usual rule of thumb; the test is the 95th
percentile, as in SageMaker Debugger's ``LowGPUUtilization`` rule) for a whole window gets a named advice line
with the usual remedies. :func:`utilisation_summary` gives per-node, per-GPU mean utilisation over a window
(and host CPU %), which the cost module's idle stop uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpu_notebook.monitor._aggregator import window_stats

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._aggregator import Aggregator
    from gpu_notebook.monitor._shapes import UtilisationSummary

__all__ = ["Advice", "REMEDIES", "advise", "utilisation_summary_from"]

REMEDIES: tuple[str, ...] = (
    "a larger batch size",
    "more DataLoader workers (num_workers)",
    "pinned memory (pin_memory=True)",
    "mixed precision (torch.autocast with bf16/fp16)",
)


@dataclass(frozen=True)
class Advice:
    """One under-utilised GPU over the window."""

    node: str
    gpu: int
    name: str
    mean_util: float
    p95_util: float
    window_s: float
    threshold: float
    idle: bool

    @property
    def message(self) -> str:
        where = f"GPU {self.gpu} ({self.name}) on node {self.node[:12]}"
        minutes = self.window_s / 60
        span = f"{minutes:.0f} min" if minutes >= 1 else f"{self.window_s:.0f} s"
        if self.idle:
            return (
                f"{where} has been idle (mean {self.mean_util:.0f}%) for the last {span}: nothing is using "
                "it; put work on it or scale down."
            )
        return (
            f"{where} stayed under {self.threshold:.0f}% for the last {span} (mean {self.mean_util:.0f}%, "
            f"p95 {self.p95_util:.0f}%). Try " + ", ".join(REMEDIES[:-1]) + f" or {REMEDIES[-1]}."
        )

    def __str__(self) -> str:
        return self.message


def advise(
    agg: Aggregator,
    window_s: float = 300.0,
    threshold: float = 70.0,
    now: float | None = None,
    idle_below: float = 1.0,
) -> list[Advice]:
    """Advice for every GPU whose p95 utilisation stayed under ``threshold`` for the whole last ``window_s``.

    A GPU is only judged once its history covers the window (so a freshly started monitor says nothing).
    """
    now = agg.clock() if now is None else now
    since = now - window_s
    out: list[Advice] = []
    for s in agg.gpu_series("util_gpu", since):
        t, y = s["t"], s["y"]
        ok = np.isfinite(y)
        if not ok.any():
            continue
        node_state = agg.nodes[s["node"]]
        interval = float(node_state.info.get("interval", 0.5))
        # the window is covered when the oldest kept sample is within one interval (plus slack) of its start
        oldest = node_state.buffer.oldest_t()
        if oldest is None or oldest > since + 2 * interval or t[ok][-1] < now - max(10 * interval, 5.0):
            continue
        st = window_stats(y)
        if st["p95"] < threshold:
            out.append(
                Advice(
                    s["node"],
                    int(s["index"]),
                    str(s["name"]),
                    st["mean"],
                    st["p95"],
                    float(window_s),
                    float(threshold),
                    idle=st["max"] < idle_below,
                )
            )
    return out


def _nanmean_cols(block: np.ndarray) -> np.ndarray:
    """Column means ignoring NaN (NaN for an all-NaN or empty column), without numpy's warnings."""
    ok = np.isfinite(block)
    n = ok.sum(axis=0)
    total = np.where(ok, block, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def utilisation_summary_from(
    agg: Aggregator, window_s: float, now: float | None = None
) -> UtilisationSummary:
    """Per node: ``has_gpu``, ``gpus`` {index: mean util %}, ``mean_gpu_util``, ``cpu_percent``, coverage."""
    now = agg.clock() if now is None else now
    since = now - window_s
    out: UtilisationSummary = {}
    for node, s in agg.states():
        t, data = s.buffer.window(since)
        cols = s.gpu_cols("util_gpu")
        means = _nanmean_cols(data[:, cols]) if cols else np.zeros(0)
        gpus = {int(g["index"]): float(m) for g, m in zip(s.gpus, means, strict=True)}
        hc = s.host_col("cpu_percent")
        cpu = float(_nanmean_cols(data[:, [hc]])[0]) if hc is not None else math.nan
        finite = [v for v in gpus.values() if not math.isnan(v)]
        out[node] = {
            "has_gpu": s.has_gpu,
            "gpus": gpus,
            "mean_gpu_util": float(np.mean(finite)) if finite else math.nan,
            "max_gpu_util": float(np.max(finite)) if finite else math.nan,
            "cpu_percent": cpu,
            "samples": int(len(t)),
            "span_s": float(t[-1] - t[0]) if len(t) > 1 else 0.0,
            "up": s.up,
        }
    return out
