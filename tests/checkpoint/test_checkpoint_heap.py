"""The host memory of a snapshot and of a restore comes without numpy's huge-page advice (``MADV_HUGEPAGE``), as
torch allocates: where the kernel's ``transparent_hugepage/defrag`` is ``madvise`` (Ubuntu's and Debian's default),
a first touch of advised memory may wait for the kernel to compact a huge page (a fresh 10 MiB copy took 12.9 ms
at the median against 2.2 ms here). The kernel's own record of the advice (``VmFlags: hg`` in
``/proc/self/smaps``) is what these tests read."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer
from gpu_notebook.checkpoint.format._scratch import MAP_BYTES, heap_empty, host_empty, is_host_buffer

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc/self/smaps")

BIG = 8 << 20  # numpy advises huge pages from 4 MiB on


def _flags(a: np.ndarray) -> tuple[str, list[str]]:
    """The permissions (``rw-p``: private, ``rw-s``: shared) and the kernel's VmFlags of the mapping that holds the
    middle of ``a``."""
    addr = a.ctypes.data + a.nbytes // 2
    perms = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        words = line.split()
        head = words[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            perms = words[1] if lo <= addr < hi else ""
        elif perms and line.startswith("VmFlags:"):
            return perms, words[1:]
    raise AssertionError("no mapping holds the buffer")


def _advised(a: np.ndarray) -> bool:
    """Whether the kernel has huge-page advice on the middle of ``a`` (numpy advises its 2 MiB-aligned part)."""
    return "hg" in _flags(a)[1]


def test_host_empty_maps_private_memory() -> None:
    """The encoding scratch and the packs of frames are maps of their own (freed at once), private ones as malloc
    makes: Python's default, a shared map, is shared memory, slower to fault in (a fresh 40 MB: 18 ms against 14)."""
    a = host_empty(MAP_BYTES)
    a.fill(1)
    perms, _ = _flags(a)
    assert perms == "rw-p", perms


def test_numpy_advises_huge_pages_for_big_arrays_and_heap_empty_does_not() -> None:
    theirs = np.empty(BIG, np.uint8)
    theirs.fill(1)
    if not _advised(theirs):
        pytest.skip("this numpy does not advise huge pages (NUMPY_MADVISE_HUGEPAGE=0, or an old kernel)")
    ours = heap_empty(BIG)
    ours.fill(1)
    assert not _advised(ours)
    assert is_host_buffer(ours) and not is_host_buffer(ours[1:])  # a whole buffer of ours, not a slice of one
    assert "torch" in sys.modules and heap_empty(1000).base is None  # (small ones stay numpy's own)


def test_a_snapshot_and_a_restore_of_big_tensors_are_not_advised(tmp_path: Path) -> None:
    if not _advised(np.full(BIG, 1, np.uint8)):
        pytest.skip("this numpy does not advise huge pages")
    state = {"w": torch.randn(BIG // 4), "step": 0}
    ck = Checkpointer(tmp_path, progress=False, preemption=None, reuse_buffers=True)
    snap = ck._buffers.take(state, 0, False)
    assert not _advised(snap.leaves[0].data)
    ck.save(state, block=True)
    got = ck.restore()
    assert torch.equal(got["w"], state["w"])
    assert not _advised(got["w"].numpy())
    ck.close()
