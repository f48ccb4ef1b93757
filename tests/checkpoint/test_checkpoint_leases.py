"""Leases: a gc in another process (a second notebook on the same prefix) never deletes what a save in flight
reuses, nor what it has written so far; a save whose parent was deleted before it began reuses nothing of it; a
dead writer's lease expires."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_notebook.checkpoint import Checkpointer, LocalStore
from gpu_notebook.checkpoint.save.lease import Lease, read_leases

pytestmark = pytest.mark.timeout(120)

OLD = 1_000_000_000.0  # an mtime far outside any grace period: objects a gc may delete

# a second notebook on the same prefix: it starts its own run there (a new root, newer than anything) and
# cleans up, keeping one checkpoint and no grace period
_OTHER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from gpu_notebook.checkpoint import Checkpointer, open_store
    url, endpoint = sys.argv[1], sys.argv[2]
    opts = {"endpoint_url": endpoint} if endpoint else {}
    ck = Checkpointer(open_store(url, **opts), preemption=None, progress=False, current=False)
    ck.save({"z": np.full(1000, 7.0), "step": 100}, block=True)
    res = ck.gc(keep=1, grace_s=0)
    print("GC", len(res.manifests), len(res.objects), res.leases, flush=True)
    """
)


def _other_notebook(url: str, endpoint: str = "") -> str:
    out = subprocess.run(
        [sys.executable, "-c", _OTHER, url, endpoint], capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _state(k: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    frozen = rng.standard_normal(60_000).astype(np.float32)  # unchanged: reused from the parent as it is
    w = rng.standard_normal(60_000).astype(np.float32) + np.float32(1e-3 * k)  # a delta against its base
    return {"frozen": frozen, "w": w, "step": k}


def _age_objects(root: Path) -> None:
    for p in (root / "objects").rglob("*"):
        if p.is_file():
            os.utime(p, (OLD, OLD))


def _ck(store: Any, **kw: Any) -> Checkpointer:
    return Checkpointer(store, preemption=None, progress=False, current=False, chunk_mb=0.05, **kw)


def _same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(np.array_equal(got[k], want[k]) for k in ("frozen", "w")) and got["step"] == want["step"]


class _Held(LocalStore):
    """A store whose object writes stop, once armed, until released: a save held in the middle."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.armed = False
        self.reached = threading.Event()
        self.release = threading.Event()

    def put(self, key: str, data: Any, create_only: bool = True) -> bool:
        if self.armed and key.startswith("objects/"):
            self.reached.set()
            assert self.release.wait(60)
        return super().put(key, data, create_only)


def test_gc_in_another_process_during_a_save_keeps_what_the_save_needs(tmp_path: Path) -> None:
    store = _Held(tmp_path)
    ck = _ck(store)
    for k in range(2):
        ck.save(_state(k), block=True)
    _age_objects(tmp_path)  # the parent's objects are old: only its lease keeps them
    store.armed = True
    want = _state(2)
    handle = ck.save(want)  # reuses the parent's unchanged chunks and delta bases
    assert store.reached.wait(30)
    assert list((tmp_path / "leases").iterdir())  # the save holds a lease while it runs
    out = _other_notebook(str(tmp_path))  # deletes the abandoned checkpoints, and every object nothing needs
    assert out.startswith("GC") and out.split()[3] == "1", out  # it saw the lease
    store.release.set()
    store.armed = False
    with pytest.warns(RuntimeWarning, match="another writer"):  # (the other notebook took this save's place)
        info = handle.result(60)
    assert info is not None and not list((tmp_path / "leases").iterdir())  # released at commit
    got = _ck(tmp_path, read_only=True).restore(info.id)
    assert _same(got, want)


def test_a_save_whose_parent_was_collected_meanwhile_writes_what_it_needs(tmp_path: Path) -> None:
    ck = _ck(tmp_path)
    for k in range(2):
        ck.save(_state(k), block=True)
    _age_objects(tmp_path)
    out = _other_notebook(str(tmp_path))  # this writer's checkpoints and their objects are gone
    assert out.split()[1] == "2" and int(out.split()[2]) > 0, out
    want = _state(2)
    with pytest.warns(RuntimeWarning, match="another writer"):
        info = ck.save(want, block=True).result()
    # nothing of the lost parent is reused
    assert info is not None and info.is_base and info.extra["stats"]["reused_bytes"] == 0
    assert _same(_ck(tmp_path, read_only=True).restore(info.id), want)


def _write_lease(root: Path, manifests: list[str], objects: list[str], expires_at: float) -> Path:
    path = root / "leases" / f"hand-{uuid.uuid4().hex[:8]}.json"
    path.parent.mkdir(exist_ok=True)
    doc = {
        "format": "gpu_notebook.checkpoint",
        "lease": path.stem,
        "manifests": manifests,
        "objects": objects,
        "started_at": OLD,
        "expires_at": expires_at,
    }
    path.write_text(json.dumps(doc))
    return path


def test_a_live_lease_keeps_its_checkpoint_and_a_dead_one_is_cleaned(tmp_path: Path) -> None:
    ck = _ck(tmp_path)
    ids = [ck.save(_state(k), block=True).result().id for k in range(3)]  # type: ignore[union-attr]
    _age_objects(tmp_path)
    live = _write_lease(tmp_path, [ids[0]], [], time.time() + 600)
    dead = _write_lease(tmp_path, [ids[1]], [], time.time() - 3600)
    res = ck.gc(keep=1, grace_s=0)
    assert res.kept == [ids[0], ids[2]] and res.manifests == [ids[1]] and res.leases == 1
    assert live.exists() and not dead.exists()
    assert _same(ck.restore(ids[0]), _state(0))
    live.unlink()
    assert ck.gc(keep=1, grace_s=0).manifests == [ids[0]]


def test_a_lease_keeps_the_objects_it_names(tmp_path: Path) -> None:
    ck = _ck(tmp_path)
    ck.save(_state(0), block=True)
    orphan = "objects/ff/ff" + "0" * 62
    (tmp_path / orphan).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / orphan).write_bytes(b"a frame a save in flight found and reuses")
    _age_objects(tmp_path)
    lease = _write_lease(tmp_path, [], [orphan], time.time() + 600)
    assert orphan not in ck.gc(keep=1, grace_s=0).objects
    lease.unlink()
    assert ck.gc(keep=1, grace_s=0).objects == [orphan]


def test_a_lease_is_renewed_while_its_save_runs_and_deleted_after(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    lease = Lease(store, "renewed", ["c0000000001"], {"objects/aa/aa"}, ttl_s=0.3)
    lease.take()
    try:
        first = json.loads(store.get(lease.key))["expires_at"]
        deadline = time.monotonic() + 10
        while json.loads(store.get(lease.key))["expires_at"] == first:  # renewed every ttl/3
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert read_leases(store).live == 1
    finally:
        lease.release()
    assert not store.exists(lease.key) and read_leases(store).live == 0


# ------------------------------------------------------------ S3
@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    pytest.importorskip("moto")
    sys.path.insert(0, str(Path(__file__).parent))
    from _s3server import serving

    with serving() as srv:
        yield srv


def test_on_s3_a_save_holds_a_lease_that_gc_in_another_process_honours(s3: Any) -> None:
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/run"
    ck = _ck(url, endpoint_url=s3.endpoint)
    first = ck.save(_state(0), block=True).result()
    assert first is not None
    gate, reached = threading.Event(), threading.Event()
    real_put = ck.store.put

    def held_put(key: str, data: Any, create_only: bool = True) -> bool:
        if key.startswith("objects/"):
            reached.set()
            assert gate.wait(60)
        return real_put(key, data, create_only)

    ck.store.put = held_put  # type: ignore[method-assign]
    want = _state(1)
    handle = ck.save(want)
    assert reached.wait(30)
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket, Prefix="run/leases/")["Contents"]]
    assert len(keys) == 1
    lease = json.loads(s3.client().get_object(Bucket=bucket, Key=keys[0])["Body"].read())
    assert lease["manifests"] == [first.id] and lease["objects"]
    out = _other_notebook(url, s3.endpoint)
    assert out.split()[3] == "1", out  # the other process listed and honoured it
    gate.set()
    ck.store.put = real_put  # type: ignore[method-assign]
    with pytest.warns(RuntimeWarning, match="another writer"):
        info = handle.result(60)
    assert info is not None
    assert "Contents" not in s3.client().list_objects_v2(Bucket=bucket, Prefix="run/leases/")
    assert _same(_ck(url, endpoint_url=s3.endpoint, read_only=True).restore(info.id), want)
