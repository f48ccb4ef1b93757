"""``show()`` (and ``%gpu_checkpoint show``) counts everything a restore reads: the chunks of the groups that small
tensors are saved in, and every rank's per-rank section."""

from __future__ import annotations

from pathlib import Path

import torch

from gpu_notebook.checkpoint import Checkpointer, PerRank


def test_show_counts_the_groups_of_small_tensors(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, preemption=None, progress=False, current=False)
    state = {f"b{i}": torch.randn(100) for i in range(50)}  # 50 small tensors: saved in one group
    info = ck.save(state, 0, block=True).result()
    shown = ck.show(info.id)
    assert any("group" in t for t in shown.tensors.values())  # the members name their group
    assert (
        shown.restore["bytes"] == info.restore_bytes > 0
    )  # (was 0: the members have no chunks of their own)
    state["b0"] += 1.0
    info2 = ck.save(state, 1, block=True).result()
    assert ck.show(info2.id).restore["max_depth"] == (0 if info2.is_base else 1)
    ck.close()


def test_show_lists_the_per_rank_sections(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, preemption=None, progress=False, current=False, rng=True)
    info = ck.save({"w": torch.ones(1000), "mine": PerRank(torch.arange(10))}, 0, block=True).result()
    shown = ck.show(info.id)
    sections = [name for name in shown.tensors if name.startswith("rank0://rank/")]
    assert sections, list(shown.tensors)  # the section's tensors, under its rank
    assert shown.restore["bytes"] > info.restore_bytes  # the section is read too
    ck.close()


def test_a_checkpointer_made_with_current_false_never_becomes_current(tmp_path: Path) -> None:
    """``current=False`` (a checkpointer for inspecting another store) stays out of the way of the training one:
    its saves and restores do not make it the one the magics and a budget stop use."""
    from gpu_notebook.checkpoint import current

    train = Checkpointer(tmp_path / "a", preemption=None, progress=False)
    other = Checkpointer(tmp_path / "b", preemption=None, progress=False, current=False)
    other.save({"w": torch.ones(3)}, 0, block=True)
    other.restore()
    assert current() is train
    train.save({"w": torch.zeros(3)}, 0, block=True)
    assert current() is train
    other.close()
    train.close()
