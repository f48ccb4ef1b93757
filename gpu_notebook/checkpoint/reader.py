"""A standalone reader of gpu_notebook checkpoints: numpy and zstandard only (blake3 to verify formats 3 to 5).

Copy this one file anywhere: it imports nothing of gpu_notebook, nor ray, boto3 or torch (torch only when
tensors are asked for, boto3 only for ``s3://``). It follows ``docs/checkpoint-format.md``: the store layout,
manifests, trees, leaves, groups, per-rank sections, chunk entries with their ``base`` chains, and frames.

>>> state = read("ckpts/")                              # the latest checkpoint  # doctest: +SKIP
>>> state = read("https://host/ckpts/", "c0000000042")  # a static file server  # doctest: +SKIP
>>> state = read("s3://bucket/ckpts")                   # with boto3 installed  # doctest: +SKIP

Tensors come back as numpy arrays. ``bfloat16`` and ``float8_e4m3fn``/``float8_e5m2`` have no numpy dtype: with
``ml_dtypes`` installed they come back as its dtypes, else as ``uint16`` / ``uint8`` arrays of the same bit patterns
(a *view*; :meth:`Reader.dtypes` names the real dtype of every leaf). ``tensors="torch"`` gives torch tensors
of the saved dtypes instead.

Why this duplicates ``gpu_notebook.checkpoint``'s own decoding (``restore/decode.py``, ``format/codec.py``,
``format/tree.py``): a file that can be copied anywhere cannot import them, and the library cannot import this
file's decoding instead, since its own decodes in parallel, with ranged reads ahead and the C kernels of
``_planes.c``. So the format is decoded twice, once here for portability and once there for speed, and the two are
held together by tests rather than by shared code: ``tests/checkpoint/test_checkpoint_reader.py`` reads every
golden store (every format version from 3 to ``FORMAT_VERSION``, both hashes; ``tests/checkpoint/golden/``) and
stores written by today's code through this reader and through ``Checkpointer.restore`` and compares them bit for
bit, and fails when a format version from 3 to ``FORMAT_VERSION`` has no golden store.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import sys
import urllib.parse
import urllib.request
from typing import Any

import numpy as np

__all__ = ["read", "list_checkpoints", "Reader", "ReaderError", "decode_frame"]

#: the newest format version this reader knows, and the one a writer writes (format/manifest.py imports it from
#: here: this file stays free of gpu_notebook imports, so it can be copied anywhere)
FORMAT_VERSION = 5
_HDR = struct.Struct("<4sBBBBQ")
_EXT = struct.Struct("<BBq")
_PLANE = struct.Struct("<BQ")
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_NUMPY = {
    "float64": np.float64, "float32": np.float32, "float16": np.float16,
    "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8,
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "bool": np.bool_, "complex64": np.complex64, "complex128": np.complex128,
}  # fmt: skip
#: dtypes numpy lacks: their bit patterns as these unsigned integers (or ml_dtypes' types when installed)
_VIEWS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}
#: byte-plane width of a dtype (complex numbers split into their two floats)
_WIDTH = {"complex64": 4, "complex128": 8}
_MAX_DEPTH = 1000
#: the largest chunk a reader accepts (writers cut 4 MiB chunks by default)
_MAX_CHUNK = 4 << 30


#: inside gpu_notebook (loaded as ``gpu_notebook.checkpoint.reader``) the errors derive from the package's root
#: error, which its package has loaded already; a copy of this file on its own imports nothing to find it
_ROOT: type[Exception] = getattr(sys.modules.get("gpu_notebook.errors"), "GpuNotebookError", Exception)


class ReaderError(_ROOT):  # type: ignore[valid-type,misc]
    """A checkpoint cannot be read: missing, damaged, of a newer format, or failing its hash check."""


def _np_dtype(name: str) -> Any:
    if name in _NUMPY:
        return np.dtype(_NUMPY[name]).newbyteorder("<")
    if name in _VIEWS:
        try:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError):
            return np.dtype(_VIEWS[name]).newbyteorder("<")
    raise ReaderError(f"unknown dtype {name!r}")


def _hasher(version: int) -> Any:
    if version >= 3:
        try:
            from blake3 import blake3
        except ImportError:
            return None
        return lambda b: blake3(b).hexdigest()
    return lambda b: hashlib.sha256(b).hexdigest()


# -- frames -------------------------------------------------------------------------------------------


def _planes(mv: memoryview, pos: int, width: int, plane_len: int) -> list[Any]:
    import zstandard

    heads = [_PLANE.unpack_from(mv, pos + i * _PLANE.size) for i in range(width)]
    pos += width * _PLANE.size
    out = []
    buf: Any
    for kind, clen in heads:
        payload = mv[pos : pos + clen]
        if len(payload) != clen:
            raise ValueError("frame is truncated")
        pos += clen
        if kind == 1:
            declared = zstandard.frame_content_size(payload)
            if declared not in (-1, plane_len):
                raise ValueError(f"plane claims {declared} bytes, the frame {plane_len}")
            try:
                buf = zstandard.ZstdDecompressor().decompress(payload, max_output_size=plane_len)
            except zstandard.ZstdError as err:
                raise ValueError(f"plane does not decompress: {err}") from None
        elif kind == 0:
            buf = payload
        else:
            raise ValueError("unknown plane kind")
        if len(buf) != plane_len:
            raise ValueError("plane has the wrong length")
        out.append(np.frombuffer(buf, dtype=np.uint8))
    return out


def _order(base: np.ndarray, width: int) -> np.ndarray:
    u: Any = _UINT[width]
    key = (base.view(u) >> u(8 * width - 9)) & u(0xFF)
    return np.argsort(key, kind="stable")


def decode_frame(frame: bytes | memoryview, base: np.ndarray | None = None) -> np.ndarray:
    """Decode one frame (see "Frames" in docs/checkpoint-format.md) to its raw bytes (``uint8``)."""
    mv = memoryview(frame)
    if len(mv) < _HDR.size:
        raise ValueError("frame is truncated")
    magic, ver, mode, t, width, n = _HDR.unpack_from(mv, 0)
    if magic != b"GNCK" or ver > 2:
        raise ValueError("not a chunk frame of version 1 or 2")
    if mode == 0:
        body = mv[_HDR.size :]
        if len(body) != n:
            raise ValueError("raw frame has the wrong length")
        return np.frombuffer(body, dtype=np.uint8).copy()
    if mode != 1 or width not in _UINT or t > 2 or n % width:
        raise ValueError("unknown frame mode")
    pos, flags, rot, off = _HDR.size, 0, 0, 0
    if ver >= 2:
        flags, rot, off = _EXT.unpack_from(mv, pos)
        pos += _EXT.size
        if flags & ~1 or rot >= 8 * width:
            raise ValueError("unknown frame flags")
    perm = bool(flags & 1)
    if (t or perm) and (base is None or base.nbytes != n):
        raise ValueError("delta frame needs its base chunk")
    u: Any = _UINT[width]
    planes = _planes(mv, pos, width, n // width)
    z = np.empty((n // width, width), dtype=np.uint8)
    for i, p in enumerate(planes):  # byte plane i is byte i of every element
        z[:, i] = p
    x = z.reshape(-1).view(u)
    if perm:  # undo the stable order of the base elements' exponent bits
        y = np.empty_like(x)
        y[_order(base, width)] = x  # type: ignore[arg-type]
        x = y
    if rot:  # undo a left rotation by ``rot`` bits
        x = (x >> u(rot)) | (x << u(8 * width - rot))
    if t == 1:
        x = x ^ base.view(u)  # type: ignore[union-attr]
    elif t == 2:  # un-zigzag, add the offset and the base (wrapping)
        x = (x >> u(1)) ^ (u(0) - (x & u(1)))
        if off:
            x = x + np.array(off).astype(_INT[width]).view(u)
        x = x + base.view(u)  # type: ignore[union-attr]
    return np.ascontiguousarray(x).view(np.uint8).reshape(-1)


# -- stores -------------------------------------------------------------------------------------------


class _Local:
    def __init__(self, root: str) -> None:
        self.root = root

    def get(self, key: str, off: int = 0, size: int | None = None) -> bytes:
        path = os.path.join(self.root, *key.split("/"))
        try:
            with open(path, "rb") as f:
                f.seek(off)
                return f.read() if size is None else f.read(size)
        except FileNotFoundError:
            raise ReaderError(f"{key} is missing from {self.root}") from None

    def manifests(self) -> list[str] | None:
        try:
            names = os.listdir(os.path.join(self.root, "manifests"))
        except FileNotFoundError:
            raise ReaderError(f"{self.root} is not a checkpoint store (no manifests/)") from None
        return [n[:-5] for n in names if n.endswith(".json")]


class _Http:
    """Objects under a base URL (a static file server, a bucket's website endpoint). ``sign(key)`` may map a key
    to its own URL (presigned URLs). A listing is not part of HTTP: give the checkpoint id, or serve
    ``manifests/index.json`` (a JSON list of ids)."""

    def __init__(self, base: str, sign: Any = None, timeout: float = 60.0) -> None:
        self.base = base.rstrip("/") + "/"
        self.sign = sign
        self.timeout = timeout

    def get(self, key: str, off: int = 0, size: int | None = None) -> bytes:
        url = self.sign(key) if self.sign else self.base + urllib.parse.quote(key)
        req = urllib.request.Request(url)
        if off or size is not None:
            req.add_header("Range", f"bytes={off}-" + ("" if size is None else str(off + size - 1)))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - http(s) only
                data = resp.read()
                if (off or size is not None) and resp.status == 200:  # the server ignored the range
                    data = data[off : None if size is None else off + size]
                return bytes(data)
        except urllib.error.HTTPError as err:
            raise ReaderError(f"{key}: HTTP {err.code} from {urllib.parse.urlsplit(url).netloc}") from None

    def manifests(self) -> list[str] | None:
        try:
            return [str(x) for x in json.loads(self.get("manifests/index.json"))]
        except ReaderError:
            return None


class _S3:
    """An ``s3://bucket/prefix`` store read with boto3 (imported only here): ranged GETs and one listing."""

    def __init__(self, url: str, endpoint_url: str | None) -> None:
        try:
            import boto3
        except ImportError:
            raise ReaderError(
                "reading s3:// needs boto3 (pip install boto3), or use presigned URLs"
            ) from None
        parts = urllib.parse.urlsplit(url)
        self.bucket, self.prefix = parts.netloc, parts.path.strip("/") + "/" if parts.path.strip("/") else ""
        self.client = boto3.client("s3", endpoint_url=endpoint_url)

    def get(self, key: str, off: int = 0, size: int | None = None) -> bytes:
        kw: dict[str, Any] = {}
        if off or size is not None:
            kw["Range"] = f"bytes={off}-" + ("" if size is None else str(off + size - 1))
        try:
            return bytes(
                self.client.get_object(Bucket=self.bucket, Key=self.prefix + key, **kw)["Body"].read()
            )
        except self.client.exceptions.NoSuchKey:
            raise ReaderError(f"{key} is missing from s3://{self.bucket}/{self.prefix}") from None

    def manifests(self) -> list[str] | None:
        ids = []
        pages = self.client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix + "manifests/"):
            for obj in page.get("Contents", []):
                name = obj["Key"].rsplit("/", 1)[-1]
                if name.endswith(".json"):
                    ids.append(name[:-5])
        return ids


def _order_key(doc: dict[str, Any]) -> tuple[Any, ...]:
    """Commit order: ``c`` ids by seq, after every format-3 id (by step, then created_at)."""
    cid = doc["id"]
    if cid.startswith("c"):
        return (1, int(doc.get("seq", cid[1:])), 0.0)
    return (0, int(doc.get("step", 0)), float(doc.get("created_at", 0.0)))


# -- the reader ---------------------------------------------------------------------------------------


class Reader:
    """Reads checkpoints from a folder or an ``http(s)://`` base URL.

    Parameters
    ----------
    source
        A store folder, an ``s3://bucket/prefix``, or the ``http(s)://`` URL the store's keys live under
        (``FORMAT``, ``manifests/...``, ``objects/...``).
    endpoint_url
        For ``s3://`` (read with boto3, which must be installed): an S3-compatible endpoint.
    sign
        For HTTP: a function from a key to its URL (presigned URLs) instead of ``source + key``.
    verify
        Check every decoded chunk against its ``raw`` hash. Formats 3 and 4 need the ``blake3`` package for it:
        without it a read raises, unless ``verify=False``.
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        *,
        sign: Any = None,
        verify: bool = True,
        endpoint_url: str | None = None,
    ) -> None:
        src = os.fspath(source)
        if src.startswith(("http://", "https://")):
            self.store: Any = _Http(src, sign)
        elif src.startswith("s3://"):
            self.store = _S3(src, endpoint_url)
        elif "://" in src:
            raise ReaderError(f"{src}: a folder, an http(s):// or an s3:// URL can be read")
        else:
            self.store = _Local(src)
        self.verify = verify
        try:
            fmt = json.loads(self.store.get("FORMAT"))
        except ReaderError:
            fmt = None  # an object listing without FORMAT (e.g. presigned URLs of the manifests only)
        if fmt is not None and int(fmt.get("version", 0)) > FORMAT_VERSION:
            raise ReaderError(
                f"the store is of format version {fmt['version']}; this reader knows {FORMAT_VERSION}"
            )

    def manifest(self, checkpoint_id: str) -> dict[str, Any]:
        """A checkpoint's manifest (parsed JSON)."""
        doc = json.loads(self.store.get(f"manifests/{checkpoint_id}.json"))
        if not isinstance(doc, dict) or doc.get("id") != checkpoint_id:
            raise ReaderError(f"manifest {checkpoint_id} is damaged (its id does not match)")
        if int(doc.get("version", 0)) > FORMAT_VERSION:
            raise ReaderError(f"checkpoint {checkpoint_id} is of format version {doc['version']}")
        for part in [*doc.get("shards", []), *(doc.get("per_rank") or [])]:
            _expand_groups(part, checkpoint_id)
        return doc

    def list(self) -> list[dict[str, Any]]:
        """Every checkpoint's manifest, oldest commit first."""
        ids = self.store.manifests()
        if ids is None:
            raise ReaderError("this store cannot be listed over HTTP: name the checkpoint id")
        return sorted((self.manifest(i) for i in ids), key=_order_key)

    def latest(self) -> str:
        docs = self.list()
        if not docs:
            raise ReaderError("the store holds no checkpoint")
        return str(docs[-1]["id"])

    def dtypes(self, checkpoint_id: str | None = None, rank: int = 0) -> dict[str, str]:
        """Leaf name -> saved dtype name (to interpret the ``uint16``/``uint8`` views of bf16 and fp8)."""
        doc = self.manifest(checkpoint_id or self.latest())
        shard, section = self._parts(doc, rank)
        out = {k: v["dtype"] for k, v in shard["leaves"].items()}
        if section is not None:
            out.update({k: v["dtype"] for k, v in section["leaves"].items()})
        return out

    def read(
        self, checkpoint_id: str | None = None, *, rank: int = 0, tensors: str = "numpy"
    ) -> dict[str, Any]:
        """The state of a checkpoint (the latest when None): plain dicts, lists, tuples, scalars and arrays.
        ``rank``: the shard (sharded saves) and per-rank section to read. ``tensors``: "numpy" or "torch"."""
        if tensors not in ("numpy", "torch"):
            raise ValueError("tensors: 'numpy' or 'torch'")
        doc = self.manifest(checkpoint_id or self.latest())
        hasher = _hasher(int(doc.get("version", 2)))
        if self.verify and hasher is None:
            raise ReaderError(
                f"checkpoint {doc['id']} (format {doc['version']}) is hashed with BLAKE3: pip install blake3 "
                "to verify it, or read it with verify=False"
            )
        shard, section = self._parts(doc, rank)
        values = self._leaves(doc, shard, hasher, tensors)
        state = _unflatten(shard["tree"], values, tensors)
        if section is not None:
            sec = _unflatten(section["tree"], self._leaves(doc, section, hasher, tensors), tensors)
            for path, v in sec.get("values", []):
                state = _put(state, list(path), v)
        return state  # type: ignore[no-any-return]

    def _parts(self, doc: dict[str, Any], rank: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
        shards = doc["shards"]
        if len(shards) == 1 or doc.get("replicated"):
            shard = shards[0]
        else:
            found = [s for s in shards if s.get("rank") == rank]
            if not found:
                raise ReaderError(f"checkpoint {doc['id']} has no shard of rank {rank}")
            shard = found[0]
        sections = [s for s in doc.get("per_rank") or [] if s.get("rank") == rank]
        return shard, (sections[0] if sections else None)

    def _chunk(self, doc: dict[str, Any], ch: dict[str, Any], hasher: Any, where: str, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ReaderError(f"{where}: the base chain of checkpoint {doc['id']} is too deep")
        base = None
        if ch.get("t") in ("xor", "sub") or ch.get("base"):
            if not ch.get("base"):
                raise ReaderError(f"{where}: a delta chunk without its base in checkpoint {doc['id']}")
            base = self._chunk(doc, ch["base"], None, where, depth + 1)
        frame = self.store.get(ch["obj"], int(ch["off"]), int(ch["size"]))
        try:
            raw = decode_frame(frame, base)
        except ValueError as err:
            raise ReaderError(
                f"{where}: frame in {ch['obj']} does not decode ({err}), checkpoint {doc['id']}"
            ) from None
        if raw.nbytes != int(ch["len"]):
            raise ReaderError(
                f"{where}: chunk has {raw.nbytes} bytes, not {ch['len']}, checkpoint {doc['id']}"
            )
        if hasher is not None and self.verify and hasher(raw) != ch["raw"]:
            raise ReaderError(f"{where}: chunk does not match its hash ({ch['obj']}), checkpoint {doc['id']}")
        return raw

    def _bytes(self, doc: dict[str, Any], name: str, leaf: dict[str, Any], hasher: Any) -> np.ndarray:
        chunks = leaf.get("chunks", [])
        lens = [ch.get("len") for ch in chunks]
        # a damaged or hostile manifest must fail here, before anything of the size it claims is allocated
        if not all(type(n) is int and 0 <= n <= _MAX_CHUNK for n in lens) or sum(lens) != leaf.get("nbytes"):
            raise ReaderError(f"{name}: its chunks do not add up to its nbytes, checkpoint {doc['id']}")
        buf = np.empty(int(leaf["nbytes"]), dtype=np.uint8)
        pos = 0
        for i, ch in enumerate(leaf.get("chunks", [])):
            raw = self._chunk(doc, ch, hasher, f"{name} chunk {i}")
            if pos + raw.nbytes > buf.nbytes:
                raise ReaderError(f"{name}: chunks hold more than nbytes, checkpoint {doc['id']}")
            buf[pos : pos + raw.nbytes] = raw
            pos += raw.nbytes
        if pos != buf.nbytes:
            raise ReaderError(f"{name}: chunks hold {pos} bytes, not {buf.nbytes}, checkpoint {doc['id']}")
        return buf

    def _leaves(self, doc: dict[str, Any], part: dict[str, Any], hasher: Any, tensors: str) -> dict[str, Any]:
        groups = {g: self._bytes(doc, f"group {g}", e, hasher) for g, e in (part.get("groups") or {}).items()}
        out: dict[str, Any] = {}
        for name, leaf in part["leaves"].items():
            if leaf["kind"] == "pickle":
                continue  # never unpickled: the tree's $pickle node raises if it is reached
            if "group" in leaf:
                g, off, n = groups.get(leaf["group"]), int(leaf["goff"]), int(leaf["nbytes"])
                if g is None or off < 0 or off + n > g.nbytes:
                    raise ReaderError(f"{name} lies outside its group, checkpoint {doc['id']}")
                raw = g[off : off + n].copy()
            else:
                raw = self._bytes(doc, name, leaf, hasher)
            out[name] = _array(raw, leaf, tensors)
        return out


def _expand_groups(part: dict[str, Any], checkpoint_id: str) -> None:
    """Format 5 lists the members of a group of small tensors in the group (``names`` and ``shapes``, in the order
    of their bytes there): list them as leaves, as format 4 did."""
    for key, g in (part.get("groups") or {}).items():
        names, shapes = g.pop("names", None), g.pop("shapes", None)
        if names is None:
            continue
        if not isinstance(names, list) or not isinstance(shapes, list) or len(names) != len(shapes):
            raise ReaderError(f"group {key} of checkpoint {checkpoint_id}: its names and shapes do not match")
        size, off = _np_dtype(g["dtype"]).itemsize, 0
        for name, shape in zip(names, shapes, strict=True):
            n = int(np.prod(shape, dtype=np.int64)) * size
            part["leaves"][name] = {
                "kind": "tensor",
                "dtype": g["dtype"],
                "shape": shape,
                "nbytes": n,
                "chunks": [],
                "group": key,
                "goff": off,
            }
            off += n


def _array(raw: np.ndarray, leaf: dict[str, Any], tensors: str) -> Any:
    shape = tuple(int(s) for s in leaf["shape"])
    if raw.nbytes != int(np.prod(shape, dtype=np.int64)) * _np_dtype(leaf["dtype"]).itemsize:
        raise ReaderError(f"a leaf of {raw.nbytes} bytes cannot be {leaf['dtype']} of shape {list(shape)}")
    if tensors == "torch" and leaf["kind"] == "tensor":
        import torch

        dt = getattr(torch, leaf["dtype"])
        if raw.nbytes == 0:
            return torch.empty(shape, dtype=dt)
        return torch.frombuffer(bytearray(raw.tobytes()), dtype=dt).reshape(shape)
    return raw.view(_np_dtype(leaf["dtype"])).reshape(shape)


def _unflatten(node: Any, values: dict[str, Any], tensors: str) -> Any:
    # (calls itself at module level: a closure that called itself would be a reference cycle keeping every
    # tensor read alive until the cyclic collector ran)
    if isinstance(node, list):
        return [_unflatten(v, values, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((tag, val),) = node.items()
        if tag.startswith("$"):
            if tag == "$dict":
                return {
                    _hashable(_unflatten(k, values, tensors)): _unflatten(v, values, tensors) for k, v in val
                }
            if tag == "$tuple":
                return tuple(_unflatten(v, values, tensors) for v in val)
            if tag == "$float":
                return float(val)
            if tag == "$bytes":
                return base64.b64decode(val)
            if tag in ("$tensor", "$ndarray"):
                return values[val]
            if tag == "$pickle":
                raise ReaderError(f"{val} was pickled: this reader never unpickles (use gpu_notebook)")
            if tag == "$state":
                return _unflatten(val["value"], values, tensors)
            if tag in ("$dtype", "$device", "$size"):
                if tensors == "torch":
                    import torch

                    cls = {
                        "$dtype": lambda v: getattr(torch, v),
                        "$device": torch.device,
                        "$size": torch.Size,
                    }
                    return cls[tag](val)
                return tuple(val) if tag == "$size" else str(val)
            raise ReaderError(f"unknown tree tag {tag!r}")
    return {k: _unflatten(v, values, tensors) for k, v in node.items()}


def _hashable(k: Any) -> Any:
    return tuple(k) if isinstance(k, list) else k


def _put(node: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(node, dict):
        node[k] = _put(node.get(k), rest, value)
        return node
    if isinstance(node, list) and isinstance(k, int) and k < len(node):
        node[k] = _put(node[k], rest, value)
        return node
    if isinstance(node, tuple) and isinstance(k, int) and k < len(node):
        return tuple(_put(v, rest, value) if i == k else v for i, v in enumerate(node))
    if node is None:
        return {k: _put(None, rest, value)}
    raise ReaderError(f"cannot put a per-rank value back at {'/'.join(map(str, path))}")


def read(
    source: str | os.PathLike[str],
    checkpoint_id: str | None = None,
    *,
    rank: int = 0,
    tensors: str = "numpy",
    verify: bool = True,
    sign: Any = None,
    endpoint_url: str | None = None,
) -> dict[str, Any]:
    """The state of a checkpoint (the latest when ``checkpoint_id`` is None); see :class:`Reader`."""
    r = Reader(source, sign=sign, verify=verify, endpoint_url=endpoint_url)
    return r.read(checkpoint_id, rank=rank, tensors=tensors)


def list_checkpoints(source: str | os.PathLike[str], *, endpoint_url: str | None = None) -> list[str]:
    """The ids of a store's checkpoints, oldest commit first (the last is the latest)."""
    return [str(d["id"]) for d in Reader(source, endpoint_url=endpoint_url).list()]
