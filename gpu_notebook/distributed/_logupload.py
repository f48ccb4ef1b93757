"""Shipping the rank log files of a node (:mod:`._logfile`) to a local folder or an S3 prefix, as gzip batches.

The invariant: **each byte is sent once and none is lost across a rotation.** A file is known by its inode and
its first bytes, not its name (a rotation renames it); how far each was sent is remembered, in a state file
beside the logs, so a new uploader on the same folder goes on where the last one stopped; only complete lines
are sent. Without a state file the destination's own listing gives the next batch number, so an old batch is
never overwritten.

``distributed`` may not import ``checkpoint`` (the layers in pyproject.toml), so this does not reuse the
checkpoint stores: it needs only "put an object" and "list a prefix", on a folder or through boto3.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import html
import json
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_notebook.distributed._logfile import (
    FILE_NAME,
    OPEN_FLAGS,
    parse_record,
    rotated_numbers,
    safe_name,
    warn,
)

__all__ = ["LogUploader"]

_PIECE = 8 * 2**20  # the most one uploaded batch holds before compression
_HEAD = 256  # bytes of a file's start remembered, to tell it from a later file given the same inode
_BATCH = re.compile(r"(\d+)\.jsonl\.gz")


class _Target(Protocol):
    """Where batches go: a local folder or an S3 prefix."""

    def put(self, key: str, data: bytes) -> None: ...

    def keys(self, prefix: str) -> list[str]:
        """The names (last key part) of the objects under ``prefix`` (which ends in ``/``)."""
        ...


class _FolderTarget:
    def __init__(self, root: str) -> None:
        self.root = root

    def put(self, key: str, data: bytes) -> None:
        path = os.path.join(self.root, *key.split("/"))
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(
                    fd
                )  # the destination is the copy meant to outlive the node: once a batch, not a line
            finally:
                os.close(fd)
            os.replace(tmp, path)  # a reader never sees half a batch
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:  # never made, or its folder is gone: nothing to clean
                pass
            raise

    def keys(self, prefix: str) -> list[str]:
        try:
            return os.listdir(os.path.join(self.root, *prefix.strip("/").split("/")))
        except FileNotFoundError:
            return []


class _S3Target:
    """An S3 prefix through boto3: credentials from boto3's own chain, the endpoint from ``AWS_ENDPOINT_URL_S3``
    or ``AWS_ENDPOINT_URL`` (which boto3 reads itself), neither ever logged."""

    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self._client: Any = None

    def _s3(self) -> Any:
        if self._client is None:
            import boto3  # the aws extra: only a node that uploads to S3 needs it
            from botocore.config import Config

            options: dict[str, Any] = {
                "retries": {"max_attempts": 3, "mode": "standard"},
                "connect_timeout": 10,
                "read_timeout": 60,
            }
            try:  # boto3 >= 1.36 sends checksums by default, which several S3-compatible services reject
                config = Config(
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    **options,
                )
            except TypeError:  # botocore < 1.36
                config = Config(**options)
            self._client = boto3.session.Session().client("s3", config=config)
        return self._client

    def put(self, key: str, data: bytes) -> None:
        self._s3().put_object(
            Bucket=self.bucket, Key=self.prefix + key, Body=data, ContentType="application/gzip"
        )

    def keys(self, prefix: str) -> list[str]:
        pages = (
            self._s3()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=self.prefix + prefix)
        )
        return [o["Key"].rsplit("/", 1)[-1] for page in pages for o in page.get("Contents", [])]


def _target(dest: str) -> _Target:
    if dest.startswith("s3://"):
        bucket, _, prefix = dest[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"an S3 log destination needs a bucket: s3://BUCKET/PREFIX, not {dest!r}")
        prefix = prefix.strip("/")
        return _S3Target(bucket, prefix + "/" if prefix else "")
    if "://" in dest:
        raise ValueError(f"a log destination is a local folder or s3://BUCKET/PREFIX, not {dest!r}")
    return _FolderTarget(os.path.abspath(dest))


@dataclass
class _Sent:
    """How far one file (one inode) has been uploaded."""

    head: bytes  # its first bytes, up to _HEAD: a later file given the same inode starts otherwise
    offset: int  # bytes sent from its start, always at a line's end


@dataclass
class _RankState:
    """What the uploader remembers of one rank."""

    seq: int | None = None  # the next batch's number; None until asked of the destination (or the state file)
    cluster: str | None = None  # the key's parts, read from the rank's first record
    node: str | None = None
    files: dict[int, _Sent] = field(default_factory=dict)  # inode -> how far it was sent


def _load_state(path: str) -> dict[int, _RankState]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        return {
            int(rank): _RankState(
                seq=r["seq"],
                cluster=r["cluster"],
                node=r["node"],
                files={int(i): _Sent(base64.b64decode(h), int(o)) for i, (h, o) in r["files"].items()},
            )
            for rank, r in raw["ranks"].items()
        }
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError):  # a torn or foreign file: start afresh
        return {}  # the destination's own listing still keeps new batches from overwriting old ones


class LogUploader:
    """Ships the rank log files of one folder to a local folder or ``s3://bucket/prefix``, every ``interval_s``.

    Each pass sends what is new of each rank, oldest file first: a rotated file whole (once), the live file from
    where the last pass stopped, complete lines only. Each piece becomes one gzip-compressed batch object
    ``<dest>/<cluster>/<node>/rank-<r>/<seq, 10 digits>.jsonl.gz``, its lines the files' records unchanged.
    Nothing is sent twice and nothing is lost across a rotation, as long as a pass comes before
    ``backups + 1`` files' worth of output is written (after that, rotation drops a file before it is sent).

    A failed upload is counted (:attr:`errors`, :attr:`last_error`) and retried at the next pass; nothing is
    raised into the caller. :meth:`flush_now` runs one pass at once (what a cluster's stop calls, after
    :meth:`RankLogFile.flush`); :meth:`close` stops the thread after a last pass.
    """

    def __init__(self, directory: str, dest: str, interval_s: float = 30.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"a log uploader needs an interval_s above 0, not {interval_s}")
        self.directory = directory
        self.dest = dest
        self.interval_s = interval_s
        self._target = _target(dest)
        #: failed passes over a rank (each retried at the next pass), and the last one's error
        self.errors = 0
        self.last_error: str | None = None
        #: batch objects uploaded so far
        self.batches = 0
        digest = hashlib.sha256(dest.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        self._state_path = os.path.join(directory, f".uploaded-{digest}.json")
        self._state = _load_state(self._state_path)
        self._pass_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="gpu_notebook-log-uploader", daemon=True)
        self._thread.start()

    def flush_now(self) -> int:
        """Upload what is new now, in this thread; returns the number of batches sent. Never raises."""
        with self._pass_lock:
            before = self.batches
            try:
                ranks = self._ranks()
            except OSError as exc:  # the folder is unreadable: counted like a failed upload
                self._count(exc)
                return 0
            for rank in ranks:
                state = self._state.setdefault(rank, _RankState())
                try:
                    self._ship_rank(rank, state)
                except Exception as exc:  # noqa: BLE001 - any failure (disk, network, S3, boto3 missing) must stay
                    # in this uploader, never reach the rank's output path or a cluster's stop: retried next pass
                    self._count(exc)
            return self.batches - before

    def _count(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.errors == 1:
            warn(f"uploading rank logs to {self.dest} failed, retrying every pass ({self.last_error})")

    def close(self) -> None:
        """Stop the thread (after the pass in flight) and run a last pass."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        self.flush_now()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush_now()

    def _ranks(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:  # no rank has written yet
            return []
        return sorted({int(m.group(1)) for m in map(FILE_NAME.fullmatch, names) if m})

    def _inodes(self, rank: int) -> set[int]:
        out = set()
        base = os.path.join(self.directory, f"rank-{rank}.jsonl")
        for path in [base, *(f"{base}.{i}" for i in rotated_numbers(self.directory, rank))]:
            try:
                out.add(os.stat(path).st_ino)
            except FileNotFoundError:
                pass
        return out

    def _ship_rank(self, rank: int, state: _RankState) -> None:
        base = os.path.join(self.directory, f"rank-{rank}.jsonl")
        seen: set[int] = set()
        # oldest first; each file is read through its descriptor, so a rotation during the pass renames it
        # under us harmlessly (a file missed under its new name is sent at the next pass)
        for path in [*(f"{base}.{i}" for i in reversed(rotated_numbers(self.directory, rank))), base]:
            try:
                fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
            except FileNotFoundError:
                continue
            try:
                info = os.fstat(fd)
                if info.st_ino not in seen:
                    seen.add(info.st_ino)
                    self._ship_file(rank, state, fd, info.st_ino, info.st_size)
            finally:
                os.close(fd)
        # forget the files gone from the folder (a renamed one is still there under its next number)
        present = seen | self._inodes(rank)
        for inode in [i for i in state.files if i not in present]:
            del state.files[inode]

    def _ship_file(self, rank: int, state: _RankState, fd: int, inode: int, size: int) -> None:
        sent = state.files.get(inode)
        if sent is not None and os.pread(fd, len(sent.head), 0) != sent.head:
            sent = None  # the inode of a deleted file, given to a new one
        start = sent.offset if sent is not None else 0
        while start < size:
            data = os.pread(fd, min(_PIECE, size - start), start)
            if not data:
                return
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) < _PIECE:
                    return  # the start of a line still being written: sent once it is whole
                cut = len(data)  # one line longer than a batch: sent in pieces
            self._upload(rank, state, data[:cut])
            start += cut
            state.files[inode] = _Sent(os.pread(fd, min(_HEAD, start), 0), start)
            self._save()

    def _upload(self, rank: int, state: _RankState, data: bytes) -> None:
        if state.cluster is None or state.node is None:
            state.cluster, state.node = self._identity(data)
        prefix = f"{safe_name(state.cluster)}/{safe_name(state.node)}/rank-{rank}/"
        if state.seq is None:  # no state file: go on after what the destination holds, never overwrite it
            numbers = [int(m.group(1)) for m in map(_BATCH.fullmatch, self._target.keys(prefix)) if m]
            state.seq = max(numbers, default=-1) + 1
        self._target.put(f"{prefix}{state.seq:010d}.jsonl.gz", gzip.compress(data, compresslevel=6, mtime=0))
        state.seq += 1
        self.batches += 1

    def _identity(self, data: bytes) -> tuple[str, str]:
        """The cluster and node named by the first whole record of ``data``."""
        for raw in data.split(b"\n", 20)[:20]:
            record = parse_record(raw)
            if (
                record is not None
                and isinstance(record.get("cluster"), str)
                and isinstance(record.get("node"), str)
            ):
                return record["cluster"], record["node"]
        return os.path.basename(os.path.normpath(self.directory)), "unknown-node"

    def _save(self) -> None:
        raw = {
            "ranks": {
                str(rank): {
                    "seq": s.seq,
                    "cluster": s.cluster,
                    "node": s.node,
                    "files": {
                        str(i): [base64.b64encode(f.head).decode(), f.offset] for i, f in s.files.items()
                    },
                }
                for rank, s in self._state.items()
            }
        }
        tmp = f"{self._state_path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(raw, f)
        os.replace(tmp, self._state_path)

    # ---- the resource

    def __enter__(self) -> LogUploader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"every {self.interval_s:g} s"
        return f"LogUploader({self.directory} -> {self.dest}, {state}, {self.batches} batches, {self.errors} errors)"

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"
