"""The checkpointer's device path, as far as it runs without a GPU: host buffers for snapshots (page-locked
ones fall back to ordinary memory), their recycling, and the GPU check script in its CPU mode.

The real asynchronous copies from a GPU run in ``scripts/gpu_check_checkpoint.py`` (``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import pathlib
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer
from gpu_notebook.checkpoint.format.tree import flatten, wait_for_copies
from gpu_notebook.checkpoint.snapshot import BufferPool, trim_heap

pytestmark = pytest.mark.timeout(180)
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gpu_check_checkpoint.py"


def test_pinned_request_without_cuda_gives_ordinary_recyclable_memory(tmp_path: pathlib.Path) -> None:
    ck = Checkpointer(tmp_path, progress=False, reuse_buffers=True)
    try:
        a = ck._buffers.alloc(1024, pinned=True)
        assert isinstance(a, np.ndarray) and a.nbytes == 1024 and a.flags.writeable
        if not torch.cuda.is_available():
            assert a.base is None and ck._buffers.n_pinned == 0
        ck._buffers.recycle({"x": {"data": a}})
        assert ck._buffers.alloc(1024) is a  # ordinary memory goes back to the ordinary pool
    finally:
        ck.close()


def test_recycle_keeps_pinned_and_ordinary_buffers_apart(tmp_path: pathlib.Path) -> None:
    """A page-locked buffer (here a stand-in registered as one) is only handed out for pinned requests."""
    ck = Checkpointer(tmp_path, progress=False, reuse_buffers=True)
    try:
        pinned = torch.empty(64, dtype=torch.uint8).numpy()  # a tensor-backed array, like a pinned one
        ck._buffers._pinned[id(pinned)] = pinned
        plain = np.empty(64, dtype=np.uint8)
        view = np.empty(128, dtype=np.uint8)[:64]  # a view: never recycled (its owner may be in use)
        ck._buffers.recycle(
            {"a": {"data": pinned}, "b": {"data": plain}, "c": {"data": view}, "d": {"data": plain}}
        )
        assert ck._buffers.alloc(64, pinned=True) is pinned
        assert ck._buffers.alloc(64) is plain
        got = ck._buffers.alloc(64)
        assert got is not view and got is not plain and got is not pinned
    finally:
        ck.close()


def test_scratch_and_packs_are_memory_maps_of_their_own(tmp_path: pathlib.Path) -> None:
    """The codec's scratch and the packs of encoded frames are, from 1 MiB on, anonymous memory maps whose pages
    go back to the system when dropped (from malloc they stayed in glibc's heaps between saves: the memory table of
    benchmarks/checkpoint.py); a view of one, or a tensor's memory, is never taken for a whole buffer of ours."""
    import mmap

    from gpu_notebook.checkpoint.format import _scratch
    from gpu_notebook.checkpoint.save import encode

    def mapped(a: np.ndarray) -> bool:
        return isinstance(getattr(a.base, "obj", None), mmap.mmap)  # (numpy wraps the map in a memoryview)

    big, small = _scratch.host_empty(_scratch.MAP_BYTES), _scratch.host_empty(64)
    assert mapped(big) and big.flags.writeable and small.base is None
    assert _scratch.is_host_buffer(big) and _scratch.is_host_buffer(small)
    assert not _scratch.is_host_buffer(big[:64]) and not _scratch.is_host_buffer(torch.zeros(4).numpy())
    assert mapped(_scratch.scratch("test", 2 * _scratch.MAP_BYTES).base)  # (a view of this thread's buffer)
    _scratch.release_scratch()

    packs: list[np.ndarray] = []
    real = encode.host_empty

    def recording(nbytes: int) -> np.ndarray:
        packs.append(real(nbytes))
        return packs[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(encode, "host_empty", recording)
        ck = Checkpointer(tmp_path, progress=False, preemption=None, pack_max_mb=4)
        try:
            state = {f"t{i}": torch.randn(64 * 1024) for i in range(24)}  # 6 MiB in small frames: packs
            ck.save(state, 0, block=True)
            assert torch.equal(ck.restore()["t5"], state["t5"])
        finally:
            ck.close()
    assert packs and any(mapped(p) for p in packs)


def test_between_saves_no_encoding_scratch_is_held_and_the_freed_heap_goes_back(
    tmp_path: pathlib.Path,
) -> None:
    """Each encoding thread's chunk-sized scratch buffers are dropped when a save's job ends (about 4 chunks per
    thread would otherwise stay between saves), and glibc's free heap memory is handed back; a save after that
    allocates them again and writes the same bytes."""
    from gpu_notebook.checkpoint.format import _scratch

    held = _scratch.held_bytes
    ck = Checkpointer(tmp_path, progress=False, preemption=None, chunk_mb=0.25)
    try:
        state = {"w": torch.randn(1 << 18), "b": torch.randn(1 << 17, dtype=torch.float64)}
        for step in range(3):
            state["w"] += 1e-3
            state["b"] *= 1.0001
            info = ck.save(state, step).result(timeout=60)
            assert info is not None and info.is_base == (step == 0)
            ck.wait(timeout=60)  # (the job ends after its handle resolved)
            assert held() == 0, "scratch buffers stayed after the save"
        got = ck.restore()
        assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
    finally:
        ck.close()
    _scratch.scratch("fwd", 1 << 20)  # this thread's, registered on first use and released like the others
    assert held() >= 1 << 20
    _scratch.release_scratch()
    assert held() == 0
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert trim_heap() is True
    else:
        assert trim_heap() in (True, False)


def test_by_default_a_committed_snapshot_keeps_only_the_base_and_the_page_locked_buffers(
    tmp_path: pathlib.Path,
) -> None:
    """Without ``reuse_buffers`` nothing but the deltas' base stays between saves (steady host memory about one
    copy of the state, measured in benchmarks/checkpoint.py); page-locked buffers are reused all the same."""
    ck = Checkpointer(tmp_path, progress=False, preemption=None)
    try:
        state = {"a": torch.randn(1000), "b": torch.randn(10, 10)}
        ck.save(state, 0, block=True)
        ck._executor.submit(lambda: None).result(timeout=60)  # (no buffers are faulted in for the next save)
        base = {name: id(sh["data"]) for name, sh in ck._lineage.shadow.items()}
        for step in (1, 2):
            state["a"] += 1
            info = ck.save(state, step).result(timeout=60)
            assert info is not None and not info.is_base
            assert ck._buffers._free == {}  # the delta's snapshot was not kept
            assert {name: id(sh["data"]) for name, sh in ck._lineage.shadow.items()} == base
        assert torch.equal(ck.restore()["a"], state["a"])
        pinned = torch.empty(64, dtype=torch.uint8).numpy()  # a stand-in registered as page-locked
        ck._buffers._pinned[id(pinned)] = pinned
        ck._buffers.recycle({"p": {"data": pinned}, "q": {"data": np.empty(64, dtype=np.uint8)}})
        assert ck._buffers.alloc(64, pinned=True) is pinned and ck._buffers._free == {}
    finally:
        ck.close()


def test_snapshot_is_a_copy_taken_at_save_time() -> None:
    t = torch.arange(10, dtype=torch.float32)
    bufs: list[tuple[int, bool]] = []

    def alloc(n: int, pinned: bool = False) -> np.ndarray:
        bufs.append((n, pinned))
        return np.empty(n, dtype=np.uint8)

    _, leaves = flatten({"t": t, "nc": t.view(2, 5).t()}, alloc=alloc)
    t.add_(1)  # training continues: the snapshot must not change
    assert bufs == [(40, False), (40, False)]  # CPU tensors: ordinary buffers
    assert np.array_equal(leaves[0].data.view(np.float32), np.arange(10, dtype=np.float32))
    assert np.array_equal(
        leaves[1].data.view(np.float32), np.arange(10, dtype=np.float32).reshape(2, 5).T.ravel()
    )
    wait_for_copies(set())  # nothing in flight: a no-op


def test_gpu_check_script_cpu_mode() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--width", "128", "--layers", "2"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checkpoint device check: OK" in out.stdout
    assert out.stdout.count("save ") == 3


def test_gpu_check_script_fails_clearly_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU machine: covered by scripts/gpu_check.sh")
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "FAIL: CUDA is not available" in out.stdout


def test_second_snapshot_uses_buffers_faulted_in_after_the_first_save(tmp_path: pathlib.Path) -> None:
    # (deltas against the previous checkpoint: the second snapshot is then what the next delta is against)
    ck = Checkpointer(tmp_path, progress=False, preemption=None, delta_against="previous", reuse_buffers=True)
    try:
        state = {"a": torch.randn(1000), "b": torch.randn(10, 10)}
        ck.save(state, 0, block=True)
        ck._executor.submit(lambda: None).result(timeout=60)  # the buffers are faulted in after the save
        ready = {id(b) for lst in ck._buffers._free.values() for b in lst}
        assert sorted(ck._buffers._free) == [400, 4000] and len(ready) == 2  # one touched buffer per tensor
        ck.save(state, 1, block=True)
        used = {id(sh["data"]) for sh in ck._lineage.shadow.values()}
        assert used == ready  # the second snapshot went into them
        assert torch.equal(ck.restore()["a"], state["a"])
    finally:
        ck.close()


def test_first_save_resolves_before_the_next_buffers_are_faulted_in(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faulting in the second snapshot's buffers (after a Checkpointer's first save) is not part of that save:
    its handle resolves without waiting for it, and the next save still works while it runs."""
    import threading

    release = threading.Event()
    started = threading.Event()
    real = BufferPool.prefault

    def slow_prefault(self: BufferPool, leaves: list) -> None:
        started.set()
        assert release.wait(60)
        real(self, leaves)

    monkeypatch.setattr(BufferPool, "prefault", slow_prefault)
    ck = Checkpointer(tmp_path, progress=False, preemption=None, reuse_buffers=True)
    try:
        state = {"a": torch.randn(1000), "b": torch.randn(10, 10)}
        info = ck.save(state, 0).result(timeout=60)  # would time out if the save waited for the prefault
        assert info is not None and started.wait(60) and not release.is_set()
        first = state["a"].clone()
        state["a"] += 1
        h = ck.save(state, 1)  # snapshots now (fresh buffers); persists once the prefault is done
        release.set()
        assert h.result(timeout=60) is not None
        assert torch.equal(ck.restore()["a"], state["a"])
        assert torch.equal(ck.restore(info.id)["a"], first)
    finally:
        release.set()
        ck.close()


def test_restore_scaling_script_runs_and_restores_bit_exact() -> None:
    # scripts/gpu_check_restore.py measures, on the GPU machine's cores, restore against torch.load; here it runs
    # on this machine's CPUs (2 thread counts, a few training steps) so that it cannot rot unseen
    script = SCRIPT.parent / "gpu_check_restore.py"
    out = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith(("| fp32", "| bf16"))]
    assert len(rows) == 2 * 2 * 2  # 2 dtypes x (delta chain, full base) x threads (1, 2)
    assert all(float(r.split("|")[-2]) > 0 for r in rows)
    assert "restore bit-exact: yes" in out.stdout
