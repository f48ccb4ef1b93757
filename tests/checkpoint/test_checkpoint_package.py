"""The public surface of ``gpu_notebook.checkpoint``: every name of ``__all__`` resolves, importing it is cheap,
the library does not reach into the fakes, and the results of show/diff/gc are dataclasses."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import torch

import gpu_notebook.checkpoint as checkpoint
from gpu_notebook.checkpoint import Checkpointer, DiffResult, GcResult, ShowResult


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in checkpoint.__all__:
        assert getattr(checkpoint, name) is not None, name
    assert set(checkpoint.__all__) <= set(dir(checkpoint))
    assert "FakeMetadataServer" not in checkpoint.__all__  # a fake: gpu_notebook.testing.cloud_metadata


def test_importing_the_package_loads_no_heavy_module() -> None:
    code = (
        "import sys, gpu_notebook.checkpoint as c; c.open_store; "
        "print(sorted(m for m in ('torch', 'boto3', 'zstandard', 'numpy', 'gpu_notebook.testing') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def test_show_diff_and_gc_return_dataclasses(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, progress=False, preemption=None) as ck:
        w = torch.zeros(1000)
        a = ck.save({"w": w, "lr": 0.1}, 0, block=True).result()
        b = ck.save({"w": w + 1, "lr": 0.05}, 1, block=True).result()
        assert a is not None and b is not None
        shown, diff, gc = ck.show(b.id), ck.diff(a.id, b.id), ck.gc(keep=1, grace_s=0, dry_run=True)
    assert isinstance(shown, ShowResult) and isinstance(diff, DiffResult) and isinstance(gc, GcResult)
    assert all(dataclasses.is_dataclass(r) and not isinstance(r, dict) for r in (shown, diff, gc))
    assert shown.info.id == b.id and "w" in shown.tensors
    assert diff.changed == {"w": {"chunks": 1, "chunks_changed": 1}} and diff.values == {"lr": (0.1, 0.05)}
    assert gc.kept == [b.id] and gc.manifests == [a.id]
    assert repr(gc).startswith("gc: kept 1 checkpoint(s), deleted 1 checkpoint(s)")
    assert repr(diff).splitlines()[1] == "  tensors: 1 changed, 0 unchanged, 0 added, 0 removed"
