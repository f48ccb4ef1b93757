"""Checkpoint sizes are regression tests: what a save writes, as a fraction of the state's raw bytes, stays within
10 % of what this codec measured on the same deterministic data (a lost transform, byte-plane split or packing
shows up here as a failure, not only as a slower benchmark). The data are elementwise AdamW-like updates of
seeded tensors, so every run encodes the same bytes; each restore is also checked bit for bit.

Measured on 2026-12-01 (zstandard from constraints-dev.txt), new bytes / raw bytes:

* fp32 AdamW state (weights, exp_avg, exp_avg_sq) 10 steps of lr 1e-3 apart: base 0.808, deltas 0.777 and 0.768
* bf16 state, lr 1e-5: base 0.616, deltas 0.440 and 0.421
* fine-tuning (a frozen body, 2 % of the parameters trained at lr 1e-5): base 0.826, deltas 0.0100
* all bytes written over a run of 9 checkpoints, per checkpoint after the first (chains of one, their rollups
  included): fp32 0.783 (a new base every 4 saves), bf16 0.461 (no rollup: its deltas grow slowly)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, CheckpointInfo

MARGIN = 1.10  # a ratio may grow by 10 % of its measured value before the test fails
N = 1 << 20  # elements per tensor: 4 MiB in fp32, one chunk


def _adam(lr: float, g: torch.Generator) -> tuple[Callable[[], dict[str, torch.Tensor]], Callable[[], None]]:
    """An AdamW-like state and a function that takes one step (elementwise: the same bits on every machine)."""
    s = {"w": torch.randn(N, generator=g) * 0.02, "exp_avg": torch.zeros(N), "exp_avg_sq": torch.zeros(N)}
    t = [0]

    def step() -> None:
        t[0] += 1
        grad = torch.randn(N, generator=g) * 1e-3 + 0.01 * s["w"]
        s["exp_avg"] = 0.9 * s["exp_avg"] + 0.1 * grad
        s["exp_avg_sq"] = 0.999 * s["exp_avg_sq"] + 0.001 * grad * grad
        m_hat = s["exp_avg"] / (1 - 0.9 ** t[0])
        v_hat = s["exp_avg_sq"] / (1 - 0.999 ** t[0])
        s["w"] = s["w"] - lr * m_hat / (v_hat.sqrt() + 1e-8)

    return lambda: dict(s), step


def _ratios(infos: list[CheckpointInfo]) -> list[float]:
    return [i.new_bytes / i.raw_bytes for i in infos]


@pytest.mark.parametrize(
    ("dtype", "lr", "measured"),
    [(torch.float32, 1e-3, [0.808, 0.777, 0.768]), (torch.bfloat16, 1e-5, [0.616, 0.440, 0.421])],
    ids=["fp32", "bf16"],
)
def test_base_and_delta_sizes_of_a_training_run(
    tmp_path: Path, dtype: torch.dtype, lr: float, measured: list[float]
) -> None:
    g = torch.Generator().manual_seed(0)
    state, step = _adam(lr, g)
    for _ in range(10):
        step()
    infos, last = [], {}
    with Checkpointer(tmp_path, progress=False, preemption=None) as ck:
        for k in range(3):
            last = {name: v.to(dtype) for name, v in state().items()}
            infos.append(ck.save(last, 10 * (k + 1), block=True).result())
            for _ in range(10):
                step()
        got = ck.restore()
    assert [i.is_base for i in infos] == [True, False, False]
    for name, v in last.items():
        assert torch.equal(got[name].view(torch.uint8), v.view(torch.uint8)), name
    ratios = _ratios(infos)
    assert all(r <= m * MARGIN for r, m in zip(ratios, measured, strict=True)), (ratios, measured)


def test_a_fine_tuning_delta_writes_only_what_was_trained(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    body = torch.randn(N, generator=g) * 0.02  # frozen
    head = torch.randn(N // 50, generator=g) * 0.02  # trained
    infos = []
    with Checkpointer(tmp_path, progress=False, preemption=None) as ck:
        for k in range(3):
            infos.append(ck.save({"body": body, "head": head}, k, block=True).result())
            head = head - 1e-5 * torch.randn(head.numel(), generator=g)
    ratios = _ratios(infos)
    assert ratios[0] <= 0.826 * MARGIN and all(r <= 0.0100 * MARGIN for r in ratios[1:]), ratios


@pytest.mark.parametrize(
    ("dtype", "lr", "measured"),
    [(torch.float32, 1e-3, 0.783), (torch.bfloat16, 1e-5, 0.461)],
    ids=["fp32", "bf16"],
)
def test_all_bytes_written_over_a_run(tmp_path: Path, dtype: torch.dtype, lr: float, measured: float) -> None:
    # what a run of checkpoints costs per checkpoint after the first: every byte written, the full bases that chains
    # of one write when a delta costs the average since the base (rollups) included
    g = torch.Generator().manual_seed(0)
    state, step = _adam(lr, g)
    for _ in range(10):
        step()
    with Checkpointer(tmp_path, progress=False, preemption=None) as ck:
        for k in range(9):
            last = {name: v.to(dtype) for name, v in state().items()}
            ck.save(last, 10 * (k + 1), block=True)
            for _ in range(10):
                step()
        infos = ck.list()
        got = ck.restore()
    for name, v in last.items():
        assert torch.equal(got[name].view(torch.uint8), v.view(torch.uint8)), name
    per_checkpoint = sum(i.new_bytes for i in infos[1:]) / sum(i.raw_bytes for i in infos[1:])
    assert any(i.is_base for i in infos[1:]) == (dtype == torch.float32)  # fp32: its deltas grow, rollups pay
    assert per_checkpoint <= measured * MARGIN, per_checkpoint
