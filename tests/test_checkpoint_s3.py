"""Tests of the S3 store against a real S3 endpoint over HTTP on loopback (moto's server mode)."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator

import pytest
import torch
from _s3server import S3Server, fake_credentials

from gpu_notebook.checkpoint import Checkpointer, CheckpointSaveError, S3Store, StoreError

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    old = {k: os.environ.get(k) for k in fake_credentials()}
    os.environ.update(fake_credentials())
    srv = S3Server().start()
    try:
        yield srv
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture()
def bucket(s3: S3Server) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    return name


def test_round_trip_over_http_with_deltas_and_gc(s3: S3Server, bucket: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = Checkpointer(f"s3://{bucket}/runs/exp1", endpoint_url=s3.endpoint, full_every=3)
    for step in range(4):
        model(torch.randn(8, 256)).sum().backward()
        opt.step()
        ckpt.save({"model": model, "optim": opt, "step": step})
    ckpt.wait()
    lst = ckpt.list()
    assert [c.step for c in lst] == [0, 1, 2, 3] and [c.is_base for c in lst] == [True, False, False, True]
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "runs/exp1/FORMAT" in keys and any(k.startswith("runs/exp1/manifests/") for k in keys)
    m2 = torch.nn.Linear(256, 256)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    state = Checkpointer(f"s3://{bucket}/runs/exp1", endpoint_url=s3.endpoint).restore(
        into={"model": m2, "optim": o2}
    )
    assert state["step"] == 3 and torch.equal(m2.weight, model.weight)
    assert torch.equal(o2.state_dict()["state"][0]["exp_avg_sq"], opt.state_dict()["state"][0]["exp_avg_sq"])
    manifest = json.dumps(ckpt.manifest())
    for secret in (
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "aws_secret",
        os.environ["AWS_SECRET_ACCESS_KEY"] * 2,
    ):
        assert secret not in manifest  # credentials never end up in a manifest
    res = ckpt.gc(keep=1, grace_s=0)
    assert len(res["manifests"]) == 3 and res["objects"]
    assert ckpt.restore()["step"] == 3


def test_create_only_and_multipart(s3: S3Server, bucket: str) -> None:
    store = S3Store(f"s3://{bucket}/p", endpoint_url=s3.endpoint, multipart_threshold_mb=5, part_size_mb=5)
    store.check()
    assert store.put("manifests/a.json", b"first") is True
    assert store.put("manifests/a.json", b"second") is False  # If-None-Match: * -> 412
    assert store.get("manifests/a.json") == b"first"
    assert store._conditional is True
    blob = os.urandom(12 * 2**20)
    assert store.put("objects/big", blob) is True
    head = s3.client().head_object(Bucket=bucket, Key="p/objects/big")
    assert head["ETag"].strip('"').endswith("-3")  # three parts
    assert store.get("objects/big") == blob
    assert store.get_range("objects/big", 10, 100) == blob[10:110]
    assert store.put("objects/big", b"x" * (6 * 2**20)) is False  # create-only for multipart too
    # the HEAD + PUT fallback for services without conditional writes
    store._conditional = False
    assert store.put("manifests/b.json", b"1") is True and store.put("manifests/b.json", b"2") is False
    assert [o.key for o in store.list("manifests/")] == ["manifests/a.json", "manifests/b.json"]


def test_missing_bucket_fails_before_training(s3: S3Server) -> None:
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-xyz' does not exist"):
        Checkpointer("s3://no-such-bucket-xyz/run", endpoint_url=s3.endpoint)


def test_access_denied_fails_before_training() -> None:
    with S3Server(auth=True) as srv:  # moto with authentication enforced: our made-up keys are unknown
        with pytest.raises(StoreError, match="access denied") as ei:
            Checkpointer("s3://some-bucket/run", endpoint_url=srv.endpoint, aws_access_key_id="AKIAUNKNOWN",
                         aws_secret_access_key="not-a-real-secret")  # fmt: skip
        assert "not-a-real-secret" not in str(ei.value)


class _GatedS3(S3Store):
    """Pauses object uploads after the first one so the test can take the endpoint down mid-save."""

    def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.armed = False
        self.first = threading.Event()
        self.go = threading.Event()
        self.n = 0

    def put(self, key, data, create_only=True):  # type: ignore[no-untyped-def]
        if self.armed and key.startswith("objects/"):
            self.n += 1
            if self.n >= 2:
                self.first.set()
                self.go.wait(30)
        return super().put(key, data, create_only)


def test_endpoint_down_mid_upload(bucket: str) -> None:
    srv = S3Server().start()
    srv.client().create_bucket(Bucket=bucket)
    store = _GatedS3(
        f"s3://{bucket}/run", endpoint_url=srv.endpoint, retries=2, backoff_s=0.01, connect_timeout_s=1
    )
    ckpt = Checkpointer(store, chunk_mb=0.25, pack_kb=1, threads=1, retries=1, retry_backoff_s=0.01)
    torch.manual_seed(0)
    w = torch.randn(300_000)
    ckpt.save({"w": w, "step": 1}, block=True)
    store.armed = True
    ckpt.save({"w": torch.randn(300_000), "step": 2})
    assert store.first.wait(30)
    srv.stop()  # the endpoint goes away in the middle of the upload
    store.go.set()
    with pytest.warns(RuntimeWarning, match="NOT saved"):
        with pytest.raises(CheckpointSaveError, match="failed after 3 attempts"):
            ckpt.wait()
    assert ckpt.failures
    srv = S3Server(port=srv.port).start()  # same in-process backend: the data is still there
    try:
        reader = Checkpointer(f"s3://{bucket}/run", endpoint_url=srv.endpoint)
        assert [c.step for c in reader.list()] == [1]
        assert torch.equal(reader.restore()["w"], w)
    finally:
        srv.stop()
