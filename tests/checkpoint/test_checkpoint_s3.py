"""Tests of the S3 store against a real S3 endpoint over HTTP on loopback (moto's server mode)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _poll import wait_for
from _s3proxy import Cut, Reply, Request, S3Proxy
from _s3server import S3Server, serving

from gpu_notebook.checkpoint import (
    Checkpointer,
    CheckpointSaveError,
    ObjectMissingError,
    S3Store,
    StoreError,
    open_store,
)
from gpu_notebook.checkpoint.stores import s3 as s3mod

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with serving() as srv:
        yield srv


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
    assert len(res.manifests) == 3 and res.objects
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


def _read_only_user(srv: S3Server, bucket: str) -> dict[str, Any]:
    """An IAM user allowed only to read ``bucket`` (its keys), then authentication enforced on ``srv``."""
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=srv.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    iam.create_user(UserName="reader")
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                # moto checks HEAD bucket as "s3:HeadBucket" (AWS: s3:ListBucket)
                "Action": ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation", "s3:HeadBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            }
        ],
    }
    iam.put_user_policy(UserName="reader", PolicyName="read-only", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    srv.client().create_bucket(Bucket=bucket)
    srv.client().put_object(Bucket=bucket, Key="p/FORMAT", Body=b"3")
    req = urllib.request.Request(
        srv.endpoint + "/moto-api/reset-auth",
        data=b"0",
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(req, timeout=10).read()  # from now on every request is authenticated
    return {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}


def test_read_only_credentials_raise_actionable_store_errors(bucket: str) -> None:
    with S3Server(subprocess=True) as srv:  # its own process: enforcing auth must not leak into other tests
        creds = _read_only_user(srv, bucket)
        store = S3Store(
            f"s3://{bucket}/p", endpoint_url=srv.endpoint, retries=1, backoff_s=0.01, multipart_threshold_mb=0.01,
            aws_session_token=None, **creds,
        )  # fmt: skip
        store.check()
        assert store.get("FORMAT") == b"3" and store.exists("FORMAT") and not store.exists("nope")
        assert [o.key for o in store.list("")] == ["FORMAT"]
        with pytest.raises(ObjectMissingError):
            store.get("nope")
        writes = {
            "manifests/a.json": lambda: store.put("manifests/a.json", b"{}"),  # create-only (If-None-Match)
            "objects/b": lambda: store.put("objects/b", b"x", create_only=False),
            "objects/big": lambda: store.put("objects/big", os.urandom(20_000)),  # multipart
        }
        for key, write in writes.items():
            with pytest.raises(StoreError) as ei:
                write()
            msg = str(ei.value)
            assert f"access denied writing s3://{bucket}/p/{key} at {srv.endpoint} (AccessDenied)" in msg, msg
            assert "read-only" in msg and "bucket policy" in msg
            assert isinstance(ei.value, s3mod.S3RequestError) and ei.value.code == "AccessDenied"
            assert creds["aws_secret_access_key"] not in msg and creds["aws_access_key_id"] not in msg
        with pytest.raises(
            StoreError, match=rf"access denied deleting s3://{bucket}/p/FORMAT .*\(AccessDenied\)"
        ):
            store.delete("FORMAT")
        assert store.get("FORMAT") == b"3"
        # unknown keys: rejected credentials are a StoreError too, from any method, without the secret
        bad = S3Store(
            f"s3://{bucket}/p", endpoint_url=srv.endpoint, retries=0, aws_access_key_id="AKIAUNKNOWNUNKNOWN12",
            aws_secret_access_key="not-a-real-secret-at-all", aws_session_token=None,
        )  # fmt: skip
        for call in (lambda: bad.get("FORMAT"), lambda: bad.list(""), lambda: bad.put("x", b"1")):
            with pytest.raises(StoreError, match=r"access denied .* \(InvalidAccessKeyId\)") as ei:
                call()
            assert "not-a-real-secret" not in str(ei.value) and "AKIAUNKNOWN" not in str(ei.value)


def test_missing_bucket_is_a_store_error_from_every_method(s3: S3Server) -> None:
    store = S3Store("s3://no-such-bucket-abc/p", endpoint_url=s3.endpoint, retries=0)
    calls = {
        "writing": lambda: store.put("k", b"1"),
        "reading": lambda: store.get("k"),
        "listing": lambda: store.list(""),
        "deleting": lambda: store.delete("k"),
    }
    for verb, call in calls.items():
        with pytest.raises(StoreError) as ei:
            call()
        assert f"bucket 'no-such-bucket-abc' does not exist ({verb} s3://no-such-bucket-abc/p/" in str(
            ei.value
        )
        assert "(NoSuchBucket)" in str(ei.value) or "NoSuchBucket)" in str(ei.value)
    assert store.exists("k") is False  # a HEAD cannot tell a missing bucket from a missing key


def test_get_retries_a_body_cut_mid_stream(s3: S3Server, bucket: str) -> None:
    blob = os.urandom(2 * 2**20)
    s3.client().put_object(Bucket=bucket, Key="p/objects/blob", Body=blob)
    cut: set[str] = set()

    def fault(req: Request, i: int) -> Cut | None:
        kind = req.headers.get("range", "full")
        if req.method == "GET" and "objects/blob" in req.path and kind not in cut:
            cut.add(kind)  # the first GET of each kind loses its connection half-way through the body
            return Cut(after=len(blob) // 4)
        return None

    with S3Proxy(s3.endpoint, fault) as proxy:
        store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.endpoint, retries=3, backoff_s=0.01)
        assert store.get("objects/blob") == blob
        assert store.get_range("objects/blob", 1000, 2**20) == blob[1000 : 1000 + 2**20]
        gets = proxy.requests_for("GET", "objects/blob")
        assert len(gets) == 4  # each read was re-issued once, as a whole GET
        assert [g.headers.get("range") for g in gets] == [
            None,
            None,
            "bytes=1000-1049575",
            "bytes=1000-1049575",
        ]


def test_transient_errors_are_retried_with_backoff(s3: S3Server, bucket: str) -> None:
    sleeps: list[float] = []  # the store's own backoff (botocore's own retry of a 5xx waits on its own)
    faults: dict[str, list[Reply | Cut]] = {
        # botocore itself retries a 5xx; a 409 OperationAborted or a dropped body is left to the store,
        # which backs off and tries again
        "PUT": [Reply(503, "SlowDown"), Reply(409, "OperationAborted")],
        "GET": [Reply(500, "InternalError"), Cut(after=0)],  # the connection drops before the body
    }

    def fault(req: Request, i: int) -> Reply | Cut | None:
        if "objects/t" in req.path and faults.get(req.method):
            return faults[req.method].pop(0)
        return None

    data = os.urandom(100_000)
    with S3Proxy(s3.endpoint, fault) as proxy:
        store = S3Store(
            f"s3://{bucket}/p", endpoint_url=proxy.endpoint, retries=4, backoff_s=0.01, sleep=sleeps.append
        )
        t0 = time.monotonic()
        assert store.put("objects/t", data) is True
        assert store.get("objects/t") == data
        assert time.monotonic() - t0 < 20
        assert (
            len(proxy.requests_for("PUT", "objects/t")) == 3
        )  # two failures (one retried by botocore), then the upload
        assert len(proxy.requests_for("GET", "objects/t")) == 3
    assert len(sleeps) == 2 and all(0.005 <= s <= 0.015 for s in sleeps)  # the store's backoff, jittered
    assert s3.client().get_object(Bucket=bucket, Key="p/objects/t")["Body"].read() == data
    # after the last retry: a StoreError that says how many attempts were made
    with S3Proxy(s3.endpoint, lambda req, i: Reply(409, "OperationAborted")) as proxy:
        store = S3Store(f"s3://{bucket}/p", endpoint_url=proxy.endpoint, retries=1, backoff_s=0.01)
        with pytest.raises(
            StoreError, match=r"S3 put of s3://.*/p/objects/u failed after 2 attempts .*\(OperationAborted\)"
        ):
            store.put("objects/u", b"1")


def test_uploads_send_no_aws_chunked_encoding_or_checksum_headers(s3: S3Server, bucket: str) -> None:
    """``checksum="when_required"`` (the default) keeps PutObject and UploadPart plain, as MinIO & co need."""
    blob = os.urandom(6 * 2**20)
    with S3Proxy(s3.endpoint) as proxy:
        store = S3Store(
            f"s3://{bucket}/p", endpoint_url=proxy.endpoint, multipart_threshold_mb=5, part_size_mb=5
        )
        assert store.put("manifests/m.json", b"{}") and store.put("objects/big", blob)
        assert store.get("objects/big") == blob
        puts = proxy.requests_for("PUT")
    parts = [r for r in puts if "partNumber=" in r.path and "uploadId=" in r.path]
    assert len(parts) == 2 and len(puts) == 3
    for r in puts:
        h = r.headers
        assert "aws-chunked" not in h.get("content-encoding", ""), h
        assert not h.get("x-amz-content-sha256", "").startswith("STREAMING-"), h
        assert "chunked" not in h.get("transfer-encoding", ""), h
        assert not [
            k
            for k in h
            if k.startswith("x-amz-checksum-") or k in ("x-amz-trailer", "x-amz-sdk-checksum-algorithm")
        ], h
        assert int(h["content-length"]) == r.body_len


def test_missing_boto3_says_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if boto3 were not installed
    with pytest.raises(ImportError, match="pip install boto3"):
        S3Store("s3://some-bucket/run")
    with pytest.raises(ImportError, match=r"\(s3://some-bucket/run\) need boto3.*pip install boto3"):
        open_store("s3://some-bucket/run")


def test_touch_makes_an_object_new_again(s3: S3Server, bucket: str) -> None:
    store = S3Store(f"s3://{bucket}/p", endpoint_url=s3.endpoint)
    store.put("objects/o", b"payload")
    before = {o.key: o.mtime for o in store.list("objects/")}["objects/o"]
    # S3's LastModified has whole seconds: touched in the next one (the test server runs on this clock)
    wait_for(lambda: time.time() >= before + 1, what="the next second")
    store.touch("objects/o")
    after = {o.key: o.mtime for o in store.list("objects/")}["objects/o"]
    assert after >= before + 1 and store.get("objects/o") == b"payload"
    store.touch("objects/gone")  # no error: nothing to protect
    assert not store.exists("objects/gone")


def test_two_writers_on_one_prefix(s3: S3Server, bucket: str) -> None:
    # two jobs save into the same prefix at the same time, with one tensor in common (the same objects: each
    # create-only write of it either creates it or finds it there); every manifest holds its own writer's state
    url = f"s3://{bucket}/shared"
    shared = torch.ones(100_000)
    saved: dict[str, dict[str, torch.Tensor]] = {"a": {}, "b": {}}
    go = threading.Barrier(2)

    def writer(name: str, seed: int) -> None:
        ck = Checkpointer(url, endpoint_url=s3.endpoint, full_every=3, preemption=None, current=False)
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(60_000, generator=g)
        go.wait()
        for step in range(5):
            w = w + 1e-3 * torch.randn(60_000, generator=g)
            info = ck.save({"w": w, "shared": shared, "writer": name, "step": step}, block=True).result()
            saved[name][info.id] = w.clone()
        ck.close()

    threads = [threading.Thread(target=writer, args=(n, s)) for n, s in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    reader = Checkpointer(url, endpoint_url=s3.endpoint, read_only=True)
    lst = reader.list()
    assert len(lst) == 10 and len({c.id for c in lst}) == 10
    for name in ("a", "b"):
        assert len(saved[name]) == 5
        for cid, w in saved[name].items():
            got = reader.restore(cid)
            assert got["writer"] == name and torch.equal(got["w"], w)
            assert torch.equal(got["shared"], shared)
