"""The standalone reader (``gpu_notebook/checkpoint/reader.py``) reads every golden store and stores written by
today's code bit-exact against ``Checkpointer.restore``, from a folder and over HTTP, and imports without torch,
ray, boto3 or the rest of gpu_notebook."""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("blake3")

from gpu_notebook.checkpoint import Checkpointer, PerRank, reader  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_STORES = sorted(p.parent for p in GOLDEN.glob("v*/*/expected.json"))
READER = Path(reader.__file__)


def _same(want: Any, got: Any, path: str = "") -> None:
    """``got`` (the reader's numpy state) holds exactly what ``want`` (Checkpointer.restore's) holds."""
    if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):  # tensors="torch"
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert (
            got.view(-1).view(torch.uint8).numpy().tobytes()
            == want.reshape(-1).view(torch.uint8).numpy().tobytes()
        )
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, np.ndarray), path
        assert list(got.shape) == list(want.shape), path
        raw = (
            want.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            if want.numel()
            else b""
        )
        assert got.tobytes() == raw, path
        name = str(want.dtype).removeprefix("torch.")
        assert got.dtype == reader._np_dtype(name), path
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape, path
        assert got.tobytes() == want.tobytes(), path
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), path
        for k in want:
            _same(want[k], got[k], f"{path}/{k!r}")
    elif isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            _same(a, b, f"{path}/{i}")
    elif isinstance(want, torch.dtype):
        assert got in (want, str(want).removeprefix("torch.")), path
    elif isinstance(want, float) and want != want:
        assert got != got, path
    else:
        assert got == want and type(got) is type(want), path


def _check_store(store: Path, source: str | None = None, rank: int = 0, **kw: Any) -> list[str]:
    ck = Checkpointer(store, read_only=True, preemption=None, current=False)
    ids = [c.id for c in ck.list()]
    r = reader.Reader(source or store, **kw)
    if source is None:
        assert reader.list_checkpoints(store) == ids
        assert r.latest() == ck.latest().id
    for cid in ids:
        want = ck.restore(cid, verify=True)
        _same(want, r.read(cid, rank=rank), cid)
    ck.close()
    return ids


@pytest.mark.parametrize("store", GOLDEN_STORES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_the_reader_reads_every_golden_checkpoint_bit_exact(store: Path) -> None:
    assert len(_check_store(store)) >= 2
    latest = reader.read(store)  # the latest, in torch tensors too
    as_torch = reader.read(store, tensors="torch")
    assert as_torch["t"]["bf16"].dtype == torch.bfloat16
    assert as_torch["t"]["bf16"].view(torch.uint16).numpy().tobytes() == latest["t"]["bf16"].tobytes()


def test_every_format_version_from_3_has_golden_stores_of_both_hashes() -> None:
    """The comparison above is what keeps this reader and ``Checkpointer.restore`` (two decoders of one format, see
    reader.py's docstring) from drifting apart: a new format version must come with its golden stores
    (``golden/make_golden.py``) for it to cover that version."""
    have = {(int(p.parent.name.removeprefix("v")), p.name) for p in GOLDEN_STORES}
    want = {(v, h) for v in range(3, reader.FORMAT_VERSION + 1) for h in ("blake3", "sha256")}
    assert have == want


def _state(g: torch.Generator, scale: float) -> dict[str, Any]:
    f = torch.randn(4000, generator=g) * scale
    return {
        "model": torch.nn.Linear(8, 8).state_dict(),  # replaced below: small tensors, grouped
        "small": {f"b{i}": torch.randn(16, generator=g) + scale for i in range(10)},
        "f32": f,
        "bf16": f.bfloat16(),
        "f16": f.half(),
        "f8": (f * 4).to(torch.float8_e4m3fn),
        "i64": torch.arange(700, dtype=torch.int64) * int(scale * 10),
        "c64": torch.randn(300, generator=g, dtype=torch.complex64),
        "np": np.arange(500, dtype=np.float32) * scale,
        "plain": {"lr": 0.1, "tuple": (1, "a"), 3: "int key", "dtype": torch.bfloat16, "nan": float("nan")},
        "loader": PerRank({"epoch": 2, "pos": int(scale * 100)}),
    }


def test_the_reader_reads_todays_stores_full_and_delta(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    ck = Checkpointer(tmp_path, preemption=None, chunk_mb=0.004, full_every=3, rng=True, current=False)
    base = _state(g, 1.0)
    for step in range(4):  # a base, deltas, then a new base (full_every=3)
        s = dict(base)
        s["f32"] = base["f32"] + step * 1e-3
        s["bf16"] = s["f32"].bfloat16()
        s["small"] = {k: v + step for k, v in base["small"].items()}
        s["loader"] = PerRank({"epoch": 2, "pos": step})
        ck.save(s, step=step).result()
    ck.close()
    docs = reader.Reader(tmp_path).list()
    assert [d["is_base"] for d in docs][:2] == [True, False]
    assert any(d["shards"][0].get("groups") for d in docs), "the small tensors were not grouped"
    assert all(d.get("per_rank") for d in docs)
    ids = _check_store(tmp_path)
    _same(
        Checkpointer(tmp_path, read_only=True, preemption=None, current=False).restore(ids[2]),
        reader.read(tmp_path, ids[2], tensors="torch"),
    )
    state = reader.read(tmp_path, ids[1])
    assert state["loader"] == {"epoch": 2, "pos": 1}
    assert reader.Reader(tmp_path).dtypes(ids[1])["bf16"] == "bfloat16"


@pytest.fixture
def http_store(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    g = torch.Generator().manual_seed(1)
    ck = Checkpointer(tmp_path / "s", preemption=None, chunk_mb=0.004, current=False)
    for step in range(2):
        ck.save(
            {"w": torch.randn(3000, generator=g), "bf": torch.randn(100, generator=g).bfloat16()}, step=step
        )
    ck.close()
    handler = functools.partial(_RangeHandler, directory=str(tmp_path / "s"))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield tmp_path / "s", f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server that answers Range requests (as S3, nginx and presigned URLs do)."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        rng = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not rng or not path.is_file():
            return super().do_GET()
        lo, _, hi = rng.removeprefix("bytes=").partition("-")
        data = path.read_bytes()[int(lo) : int(hi) + 1 if hi else None]
        self.send_response(206)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_the_reader_reads_over_http_by_id_and_by_presigned_urls(http_store: tuple[Path, str]) -> None:
    folder, url = http_store
    ids = reader.list_checkpoints(folder)
    _check_store(folder, url)
    with pytest.raises(reader.ReaderError, match="name the checkpoint id"):
        reader.read(url)  # a static server cannot list
    signed = reader.read(url, ids[-1], sign=lambda key: url + key + "?X-Amz-Signature=abc")
    _same(Checkpointer(folder, read_only=True, preemption=None, current=False).restore(ids[-1]), signed)


def test_a_corrupted_chunk_fails_its_hash_check(http_store: tuple[Path, str]) -> None:
    folder, _ = http_store
    doc = reader.Reader(folder).list()[0]
    ch = doc["shards"][0]["leaves"]["w"]["chunks"][0]
    obj = folder / ch["obj"]
    data = bytearray(obj.read_bytes())
    data[ch["off"] + ch["size"] - 1] ^= 0xFF
    obj.chmod(0o644)
    obj.write_bytes(bytes(data))
    with pytest.raises(reader.ReaderError, match="w chunk 0"):
        reader.read(folder, doc["id"])


def test_the_reader_imports_without_torch_ray_boto3_or_gpu_notebook(tmp_path: Path) -> None:
    """A user copies the one file: it must import and read with none of them (a golden store, blake3 and numpy)."""
    copy = tmp_path / "reader.py"
    copy.write_bytes(READER.read_bytes())
    code = (
        "import sys, importlib.util\n"
        "for m in ('torch', 'ray', 'boto3', 'botocore', 'gpu_notebook', 'ml_dtypes'): sys.modules[m] = None\n"
        f"spec = importlib.util.spec_from_file_location('reader', {str(copy)!r})\n"
        "r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)\n"
        f"s = r.read({str(GOLDEN_STORES[0])!r})\n"
        "heavy = ('gpu_notebook', 'torch', 'ray', 'boto3')\n"
        "print(s['t']['bf16'].dtype, sorted(k for k, v in sys.modules.items() if v and k.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["uint16", "[]"]


def test_without_blake3_a_format_3_read_asks_for_it_or_verify_false(tmp_path: Path) -> None:
    """Formats 3 and 4 are hashed with BLAKE3: without the package a verified read refuses with what to do;
    ``verify=False`` reads them, and a SHA-256 store (format 2) is still verified."""
    stores = {p.name: str(p) for p in GOLDEN_STORES}
    code = (
        "import sys, importlib.util\n"
        "sys.modules['blake3'] = None; sys.modules['gpu_notebook'] = None\n"
        f"spec = importlib.util.spec_from_file_location('reader', {str(READER)!r})\n"
        "r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)\n"
        "try:\n"
        f"    r.read({stores['blake3']!r})\n"
        "except r.ReaderError as e:\n"
        "    print('refused:', e)\n"
        f"print(sorted(r.read({stores['blake3']!r}, verify=False)['t']))\n"
        f"print(sorted(r.read({stores['sha256']!r})['t']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("refused:") and "pip install blake3" in lines[0] and "verify=False" in lines[0]
    assert "bf16" in lines[1] and lines[1] == lines[2]


def test_the_reader_reads_an_s3_prefix_with_boto3(http_store: tuple[Path, str]) -> None:
    pytest.importorskip("moto")
    pytest.importorskip("boto3")
    from _s3server import serving

    folder, _ = http_store
    with serving() as srv:
        client = srv.client()
        client.create_bucket(Bucket="reader")
        for f in folder.rglob("*"):
            if f.is_file():
                client.put_object(Bucket="reader", Key=f"run/{f.relative_to(folder)}", Body=f.read_bytes())
        url = "s3://reader/run"
        ids = reader.list_checkpoints(url, endpoint_url=srv.endpoint)
        assert ids == reader.list_checkpoints(folder)
        _check_store(folder, url, endpoint_url=srv.endpoint)
        with pytest.raises(reader.ReaderError, match="missing"):
            reader.read(url, "c0000009999", endpoint_url=srv.endpoint)


def test_the_reader_decodes_every_frame_variant_the_codec_writes() -> None:
    """Every transform, rotation, order and offset of today's encoder (the stores above need not use them all:
    the base-exponent order is chosen only where it pays), and frames of version 1."""
    from gpu_notebook.checkpoint.format import codec

    rng = np.random.default_rng(0)
    for width, dt in ((1, np.uint8), (2, np.float16), (4, np.float32), (8, np.float64)):
        base = rng.standard_normal(3000).astype(dt) if width > 1 else rng.integers(0, 255, 3000, dtype=dt)
        cur = (base * 1.001 + 1e-4).astype(dt) if width > 1 else base + np.uint8(3)
        b, c = base.view(np.uint8), cur.view(np.uint8)
        for t in (0, 1, 2):
            for rot in sorted({0, 3, 8 * width - 1}):
                for perm in (False, True) if t and width > 1 else (False,):
                    for off in (0, -5) if t == 2 else (0,):
                        frame = codec._encode_variant(c, width, b if t or perm else None, (t, rot, perm, off))
                        got = reader.decode_frame(frame, b if t or perm else None)
                        assert got.tobytes() == c.tobytes(), (width, t, rot, perm, off)
        v1 = bytearray(codec._encode_variant(c, width, None, (0, 0, False, 0)))
        v1[4] = 1  # version 1: no flags/rotation/offset field
        del v1[16 : 16 + 10]
        assert reader.decode_frame(bytes(v1)).tobytes() == c.tobytes()


def test_a_manifest_that_claims_a_terabyte_fails_before_anything_is_allocated(
    http_store: tuple[Path, str],
) -> None:
    folder, _ = http_store
    cid = reader.list_checkpoints(folder)[0]
    path = folder / "manifests" / f"{cid}.json"
    doc = json.loads(path.read_text())
    doc["shards"][0]["leaves"]["w"]["nbytes"] = 1 << 40
    path.chmod(0o644)
    path.write_text(json.dumps(doc))
    with pytest.raises(reader.ReaderError, match="w: its chunks do not add up"):
        reader.read(folder, cid)
