"""A snapshot's copies run on their own thread while the walk of the state goes on (``format/_copies.py``), and
every one of them is made before ``save()`` returns: training that goes on at once never changes a saved byte."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer
from gpu_notebook.checkpoint.format import _copies
from gpu_notebook.checkpoint.format._copies import Copies


def test_copies_are_made_in_batches_on_their_own_thread_and_all_waited_for() -> None:
    srcs = [torch.randn(64 * 1024) for _ in range(6)]  # 256 KB each
    dsts = [torch.empty_like(s) for s in srcs]
    threads: set[str] = set()
    real = _copies._copy_all

    def spy(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        threads.add(threading.current_thread().name)
        real(pairs)

    c = Copies(batch_bytes=512 * 1024)
    _copies._copy_all = spy  # type: ignore[assignment]
    try:
        for d, s in zip(dsts, srcs, strict=True):
            c.add(d, s, s.nbytes)
        assert len(c._futures) == 3  # a batch handed over at every 512 KB, while the caller goes on
        c.finish()
    finally:
        _copies._copy_all = real  # type: ignore[assignment]
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))
    assert threads and all(t.startswith("gnb-ckpt-copy") for t in threads)


def test_a_failed_copy_is_raised_by_finish_after_the_others_are_made() -> None:
    good_src, good_dst = torch.ones(1000), torch.zeros(1000)
    c = Copies(batch_bytes=1)  # every copy a batch of its own
    c.add(torch.zeros(3), torch.ones(5), 20)  # the shapes do not match: copy_ raises
    c.add(good_dst, good_src, 4000)
    with pytest.raises(RuntimeError):
        c.finish()
    assert torch.equal(good_dst, good_src)  # (made, though an earlier one failed)
    c.finish()  # nothing left to wait for


@pytest.mark.timeout(120)
def test_training_right_after_save_returns_changes_no_saved_byte(tmp_path: Path) -> None:
    torch.manual_seed(0)
    # 48 tensors of 256 KB (12 MB): several batches for the copy thread, and small ones for the groups
    state = {
        "w": [torch.randn(256, 256) for _ in range(48)],
        "b": [torch.randn(16) for _ in range(40)],
        "step": 3,
    }
    want = {"w": [t.clone() for t in state["w"]], "b": [t.clone() for t in state["b"]]}
    ck = Checkpointer(tmp_path, progress=False, preemption=None)
    for _ in range(2):  # a base, then a delta whose snapshot reuses nothing of the first
        handle = ck.save(state)
        for t in state["w"] + state["b"]:  # the next training step, at once
            t.add_(1.0)
        handle.result()
        got = ck.restore(handle.id)
        for k in ("w", "b"):
            for a, b in zip(got[k], want[k], strict=True):
                assert torch.equal(a, b)
        want = {"w": [t.clone() for t in state["w"]], "b": [t.clone() for t in state["b"]]}
    assert any(t.name.startswith("gnb-ckpt-copy") for t in threading.enumerate())
    ck.close()
