"""The golden checkpoints of every past format version (``tests/checkpoint/golden/``, written once by the code of
their day with ``make_golden.py``) restore bit-exact with today's code: a format change that stops reading them
fails here. Each is opened read-only, as a user with read-only access to an old bucket would."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("blake3")

from gpu_notebook.checkpoint import Checkpointer  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
STORES = sorted(p.parent for p in GOLDEN.glob("v*/*/expected.json"))


def _describe() -> Any:
    spec = importlib.util.spec_from_file_location("_make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.describe


def test_there_are_golden_stores_of_both_hashes() -> None:
    assert {p.name for p in STORES} >= {"blake3", "sha256"}, STORES


@pytest.mark.parametrize("store", STORES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_every_golden_checkpoint_restores_bit_exact(store: Path) -> None:
    describe = _describe()
    expected = json.loads((store / "expected.json").read_text())
    ck = Checkpointer(store, read_only=True, preemption=None, current=False)
    listed = [c.id for c in ck.list()]
    assert listed == [c["id"] for c in expected["checkpoints"]]
    assert ck.latest().id == expected["checkpoints"][-1]["id"]
    kinds = [c["is_base"] for c in expected["checkpoints"]]
    assert kinds[0] and not all(kinds), "the golden chain must hold a base and deltas"
    for want in expected["checkpoints"]:
        got = ck.restore(want["id"], verify=True)
        assert got["step"] == want["step"]
        assert describe(got) == want["state"], want["id"]
    ck.close()


def test_a_golden_store_resumes_and_a_new_save_follows_it(tmp_path: Path) -> None:
    """A store written by an older version is a store a newer one resumes from and appends to."""
    import shutil

    import torch

    src = STORES[0]
    dst = tmp_path / "store"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("expected.json"))
    expected = json.loads((src / "expected.json").read_text())
    ck = Checkpointer(dst, preemption=None, current=False, chunk_mb=0.01)
    state = ck.restore()
    assert state["step"] == expected["checkpoints"][-1]["step"]
    state["t"]["f32"] += 1.0
    info = ck.save({**state, "step": state["step"] + 1}, block=True).result()
    assert ck.latest().id == info.id
    again = ck.restore()
    assert torch.equal(again["t"]["f32"], state["t"]["f32"])
    ck.close()


@pytest.mark.parametrize("store", STORES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_the_standalone_reader_reads_every_golden_checkpoint(store: Path) -> None:
    """``gpu_notebook/checkpoint/reader.py`` (one file, no gpu_notebook imports) reads every past format too, with
    every chunk verified: format 5's columnar group members come back as the tensors they were."""
    from gpu_notebook.checkpoint import reader

    describe = _describe()
    expected = json.loads((store / "expected.json").read_text())
    r = reader.Reader(str(store))
    for want in expected["checkpoints"]:
        got = r.read(want["id"], tensors="torch")
        assert got["step"] == want["step"]
        assert describe(got) == want["state"], want["id"]
