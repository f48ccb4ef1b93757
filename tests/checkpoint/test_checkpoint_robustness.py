"""What the checkpointer does when the store misbehaves or is used read-only: gc that refuses instead of
guessing, store errors that are not mistaken for damaged manifests, commits whose answer was lost, read-only
use, resumed runs without explicit steps, ambiguous ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from gpu_notebook import checkpoint
from gpu_notebook.checkpoint import (
    Checkpointer,
    CheckpointError,
    LocalStore,
    NoCheckpointError,
    StoreError,
)
from gpu_notebook.checkpoint.format.manifest import commit_id


def _files(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


def _three(root: Path, **kw) -> list[str]:  # type: ignore[no-untyped-def]
    ck = Checkpointer(root, full_every=10, preemption=None, **kw)
    x = torch.arange(50_000, dtype=torch.float32)
    for step in range(3):
        ck.save({"x": x + step, "step": step}, block=True)
    ck.close()
    return [c.id for c in Checkpointer(root, preemption=None).list()]


# --------------------------------------------------------------------------- gc
@pytest.mark.parametrize("damage", ["newer", "garbage"])
def test_gc_refuses_when_a_manifest_cannot_be_read(tmp_path: Path, damage: str) -> None:
    ids = _three(tmp_path)
    # a checkpoint this library cannot read, e.g. written by a newer version: its objects are unknown to us
    path = tmp_path / "manifests" / f"{ids[1]}.json"
    if damage == "newer":
        doc = json.loads(path.read_text())
        doc["version"] = 99
        path.write_text(json.dumps(doc))
    else:
        path.write_text("{not json")
    before = _files(tmp_path)
    ck = Checkpointer(tmp_path, preemption=None)
    with pytest.raises(
        CheckpointError, match=f"gc refused, nothing deleted: manifest manifests/{ids[1]}"
    ) as e:
        ck.gc(keep=1, grace_s=0)
    assert ("newer version" in str(e.value)) == (damage == "newer")
    assert set(_files(tmp_path)) >= set(before)  # nothing deleted
    assert ck.restore(ids[0])["step"] == 0


def test_gc_refuses_when_a_manifest_committed_meanwhile_cannot_be_read(tmp_path: Path) -> None:
    ids = _three(tmp_path)

    class Late(LocalStore):
        """A damaged manifest appears between gc's first listing and its re-read."""

        listed = 0

        def list(self, prefix):  # type: ignore[no-untyped-def]
            if prefix == "manifests/":
                self.listed += 1
                if self.listed == 2:
                    (self.root / "manifests" / "000000000009-ffffffff0000.json").write_text("{not json")
            return super().list(prefix)

    ck = Checkpointer(Late(tmp_path), preemption=None)
    objects = {k for k in _files(tmp_path) if k.startswith("objects/")}
    with pytest.raises(CheckpointError, match="gc refused"):
        ck.gc(keep=1, grace_s=0)
    assert objects <= set(_files(tmp_path))  # no object deleted (the dropped manifests are gone: intended)
    assert ck.restore(ids[2])["step"] == 2


def test_gc_dry_run_reports_what_a_real_run_deletes(tmp_path: Path) -> None:
    root = tmp_path / "s"
    ck = Checkpointer(root, full_every=2, preemption=None)
    for step in range(6):
        ck.save({"x": torch.randn(20_000), "step": step}, block=True)
    dry = ck.gc(keep=2, grace_s=0, dry_run=True)
    real = ck.gc(keep=2, grace_s=0)
    assert dry.objects and sorted(dry.objects) == sorted(real.objects)
    assert dry.manifests == real.manifests and dry.bytes == real.bytes
    for cid in real.kept:
        ck.restore(cid)


def test_read_only_checkpointer_refuses_to_gc(tmp_path: Path) -> None:
    _three(tmp_path)
    ro = Checkpointer(tmp_path, read_only=True)
    assert ro.gc(keep=1, grace_s=0, dry_run=True).manifests  # a dry run only reads
    with pytest.raises(CheckpointError, match="read_only"):
        ro.gc(keep=1, grace_s=0)


# ------------------------------------------------------------ store errors are not damaged manifests
class _Failing(LocalStore):
    """A store whose reads of one key fail like an endpoint that went down."""

    def __init__(self, root: Path, bad: str) -> None:
        super().__init__(root)
        self.bad = bad

    def get(self, key):  # type: ignore[no-untyped-def]
        if key == self.bad:
            raise StoreError(f"S3 get of {key} failed after 4 attempts: endpoint down")
        return super().get(key)


def test_a_store_error_on_the_newest_manifest_is_raised_not_skipped(tmp_path: Path) -> None:
    ids = _three(tmp_path)
    ck = Checkpointer(_Failing(tmp_path, f"manifests/{ids[2]}.json"), preemption=None)
    # resuming from step 1 because step 2 could not be fetched *this time* would silently lose work
    with pytest.raises(StoreError, match="endpoint down"):
        ck.restore()
    with pytest.raises(StoreError, match="endpoint down"):
        ck.latest()
    with pytest.raises(StoreError, match="endpoint down"):
        ck.list()
    assert ck.restore(ids[1])["step"] == 1  # the others are still there


# ------------------------------------------------------------ a commit whose answer was lost
class _LostAnswer(LocalStore):
    """The first manifest write is stored, then the connection drops before the answer (as S3 can do)."""

    dropped = 0

    def put(self, key, data, create_only=True):  # type: ignore[no-untyped-def]
        wrote = super().put(key, data, create_only)
        if key.startswith("manifests/") and not self.dropped:
            self.dropped += 1
            raise OSError("connection reset by peer (after the server stored it)")
        return wrote


def test_a_committed_manifest_whose_answer_was_lost_counts_as_saved(tmp_path: Path) -> None:
    store = _LostAnswer(tmp_path)
    ck = Checkpointer(store, retries=2, retry_backoff_s=0.01, preemption=None)
    info = ck.save({"x": torch.ones(1000), "step": 5}).result(30)
    assert store.dropped == 1 and info is not None and info.step == 5
    assert [c.id for c in ck.list()] == [info.id] and not ck.failures
    ck.save({"x": torch.ones(1000) * 2, "step": 6}, block=True)  # and the chain goes on from it
    assert ck.restore()["step"] == 6 and ck.manifest()["parent"] == info.id


def test_another_writers_manifest_under_the_same_id_is_not_taken_for_ours(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, retries=0, preemption=None)
    # another writer's manifest already sits under the id this save will use (it committed after this writer
    # learned the store's places): this save takes the next place, and says so
    step, cid = 3, commit_id(ck._order.propose())
    other = Checkpointer(tmp_path / "other", preemption=None)
    other.save({"x": torch.zeros(10), "step": step}, block=True)
    doc = other.manifest()
    doc["id"] = cid
    (tmp_path / "manifests").mkdir(exist_ok=True)
    (tmp_path / "manifests" / f"{cid}.json").write_text(json.dumps(doc))
    with pytest.warns(RuntimeWarning, match="another writer"):
        info = ck.save({"x": torch.ones(10), "step": step}).result(30)
    assert info is not None and info.id != cid and not ck.failures
    assert torch.equal(ck.restore()["x"], torch.ones(10)) and ck.manifest(cid)["writer"] == doc["writer"]


# ------------------------------------------------------------ read-only use
def test_read_only_never_creates_or_writes(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    with pytest.raises(StoreError, match="no checkpoint store at .*typo"):
        Checkpointer(missing, read_only=True)
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="not a checkpoint store"):
        Checkpointer(tmp_path / "empty", read_only=True)
    assert not list((tmp_path / "empty").iterdir())

    root = tmp_path / "run"
    ids = _three(root)
    before = _files(root)
    ro = Checkpointer(root, read_only=True, current=False)
    assert [c.id for c in ro.list()] == ids
    assert ro.restore()["step"] == 2 and ro.show(ids[1]) and ro.diff(ids[0], ids[2])
    with pytest.raises(CheckpointError, match="cannot save.*read_only"):
        ro.save({"x": torch.ones(1), "step": 9})
    assert _files(root) == before  # not a byte written, not a marker touched


class _ReadOnlyCredentials(LocalStore):
    """Reads work; every write is refused (as with read-only cloud credentials)."""

    def check(self, write: bool = True) -> None:
        pass

    def put(self, key, data, create_only=True):  # type: ignore[no-untyped-def]
        raise StoreError(
            f"access denied writing {self.url}/{key} (AccessDenied): the credentials may be read-only"
        )


def test_read_only_credentials_can_restore_and_writers_fail_at_once(tmp_path: Path) -> None:
    _three(tmp_path)
    with pytest.raises(StoreError, match="access denied"):  # before training starts, not in a background save
        Checkpointer(_ReadOnlyCredentials(tmp_path), preemption=None)
    got = Checkpointer(_ReadOnlyCredentials(tmp_path), read_only=True).restore()
    assert got["step"] == 2


def test_current_false_leaves_the_current_checkpointer_alone(tmp_path: Path) -> None:
    _three(tmp_path / "b")
    main = Checkpointer(tmp_path / "a", preemption=None)
    Checkpointer(tmp_path / "b", read_only=True, current=False)
    assert checkpoint.current() is main


# ------------------------------------------------------------ steps of a resumed run
def test_saves_without_a_step_go_on_after_the_stores_newest(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, preemption=None)
    for i in range(3):
        ck.save({"w": torch.full((100,), float(i))}, block=True)  # no step anywhere: 0, 1, 2
    assert [c.step for c in ck.list()] == [0, 1, 2]
    ck.close()
    # a new process resumes: its first checkpoint must come after the ones it resumed from, or latest()
    # would keep returning the pre-preemption checkpoint
    again = Checkpointer(tmp_path, preemption=None)
    state = again.restore()
    state["w"] = state["w"] + 10
    h1 = again.save(state, block=True)
    h2 = again.save({"w": state["w"] + 1}, block=True)
    assert (h1.step, h2.step) == (3, 4)
    assert again.latest().step == 4 and torch.equal(again.restore()["w"], torch.full((100,), 13.0))  # type: ignore[union-attr]
    again.save({"w": torch.zeros(1), "step": 10}, block=True)  # an explicit step moves the counter on
    assert again.save({"w": torch.zeros(1)}, block=True).step == 11


# ------------------------------------------------------------ ids
def test_an_ambiguous_id_prefix_says_so(tmp_path: Path) -> None:
    ids = _three(tmp_path)
    ck = Checkpointer(tmp_path, read_only=True)
    with pytest.raises(
        NoCheckpointError, match=r"prefix 'c000000000' is ambiguous: it matches 3 checkpoints"
    ):
        ck.restore("c000000000")
    with pytest.raises(NoCheckpointError, match="no checkpoint 'c000000009'"):
        ck.restore("c000000009")
    assert ck.restore(ids[1][:12])["step"] == 1
    assert os.path.isdir(tmp_path)
    # an id and a step together: which one? (the step used to be ignored silently)
    with pytest.raises(ValueError, match="id or a step, not both"):
        ck.restore(ids[1], step=2)
    assert ck.restore("latest", step=1)["step"] == 1  # "latest" names no checkpoint: the step decides


def test_a_dtype_name_from_the_store_must_be_a_dtype(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, preemption=None)
    ck.save({"dt": torch.bfloat16, "step": 0}, block=True)
    assert ck.restore()["dt"] is torch.bfloat16
    path = next((tmp_path / "manifests").iterdir())
    text = path.read_text()
    assert '"bfloat16"' in text
    path.write_text(text.replace('"bfloat16"', '"load"'))  # torch.load is an attribute of torch, not a dtype
    with pytest.raises(ValueError, match="'load' is not a torch dtype"):
        Checkpointer(tmp_path, read_only=True).restore()


def test_a_save_that_reuses_an_orphan_object_makes_it_new_again(tmp_path: Path) -> None:
    # a checkpoint's manifest was deleted (by gc), its objects are orphans, old enough for gc to delete; a save
    # that needs the same bytes finds them there and reuses them: they must now count as new, or a gc running
    # meanwhile could delete what the new checkpoint is about to reference
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 0}
    Checkpointer(tmp_path, threads=1, preemption=None).save(state, block=True)
    for m in (tmp_path / "manifests").iterdir():
        m.unlink()
    old = 1_000_000_000.0
    objects = [p for p in (tmp_path / "objects").rglob("*") if p.is_file()]
    assert objects
    for p in objects:
        os.utime(p, (old, old))
    Checkpointer(tmp_path, threads=1, preemption=None).save(state, block=True)
    assert [p for p in (tmp_path / "objects").rglob("*") if p.is_file()] == objects  # reused, not rewritten
    assert all(p.stat().st_mtime > old + 1e6 for p in objects)
    res = Checkpointer(tmp_path, preemption=None).gc(keep=1)  # default grace: nothing of it goes
    assert not res.objects
