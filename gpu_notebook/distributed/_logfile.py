"""Each rank's output in JSON-lines files on its node, which outlive the kernel, the rank and the cluster.

The driver's :class:`~._output.RankLog` keeps a rank's recent lines only while the kernel lives. A
:class:`RankLogFile` also writes every line of a rank to ``rank-<r>.jsonl`` in a folder on the rank's node
(:func:`default_log_dir`), one JSON object a line, for a log collector (Fluent Bit, Vector, Promtail: see
``docs/guide/logs-collectors.md``) or a :class:`~._logupload.LogUploader` to ship, and for :func:`read_tail` to read back.

The invariants:

* **A line that ``write`` returned from is in the file**, even when the process is killed right after: the
  complete lines of a call are written with ``os.write`` on an ``O_APPEND`` descriptor before it returns, with
  no Python buffer in between (one call per rotation they span). (It is in the
  kernel's page cache, not on the platter: surviving a machine crash would need an ``fsync`` a line, which costs
  milliseconds each; the uploader ships the files off the machine instead.)
* **The disk a rank uses is capped**: the file rotates like :class:`logging.handlers.RotatingFileHandler`
  (``rank-0.jsonl`` becomes ``rank-0.jsonl.1``, ``.1`` becomes ``.2``, ..., the oldest is dropped) before a
  record would take it past ``max_bytes``, and a record is at most ``max_bytes / 2`` (a longer line is cut,
  with a note), so the files of a rank never hold more than ``(backups + 1) * max_bytes``.
* **A failing disk never fails a cell**: the first ``OSError`` (disk full, folder removed) turns the file off
  with one warning on the process's real stderr; ``write`` never raises into the rank's output path.

``_logupload`` ships the files off the node (:class:`~._logupload.LogUploader`); the names both modules share
(the file names, reading a record) are here.

Files and folders are the user's only (``0o600``/``0o700``): a rank's output can hold secrets.
"""

from __future__ import annotations

import errno
import hashlib
import html
import json
import os
import re
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from json.encoder import encode_basestring  # the C encoder: non-ASCII kept as UTF-8, as collectors expect
from typing import Any, BinaryIO

__all__ = [
    "FILE_NAME",
    "OPEN_FLAGS",
    "RankLogFile",
    "default_log_dir",
    "parse_record",
    "read_tail",
    "rotated_numbers",
    "safe_name",
    "warn",
]

_BASE = "gpu_notebook-logs"  # the folder under the temp dir that holds one folder per cluster
_MIN_BYTES = 1024  # below this a file holds too few records to be worth rotating
_BLOCK = 64 * 1024  # read_tail reads a file backwards in blocks of this size
FILE_NAME = re.compile(r"rank-(\d+)\.jsonl(?:\.(\d+))?")
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
OPEN_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def safe_name(name: str) -> str:
    """``name`` as one path component and one S3 key part.

    A safe name is kept as it is, so the folders read as the cluster's and node's names. Any other has its other
    characters replaced and a hash of the original appended: two names never share a folder, and none climbs out
    of its parent (``..``, ``a/../../b``).

    >>> safe_name("my-cluster"), safe_name("a/b") == safe_name("a_b"), safe_name("..").startswith("_-")
    ('my-cluster', False, True)
    """
    if _SAFE.fullmatch(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80].lstrip(".") or "_"
    return f"{cleaned}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def default_log_dir(cluster: str) -> str:
    """The folder of ``cluster``'s rank log files on this node: ``<temp dir>/gpu_notebook-logs/<cluster>``.

    The temp dir is :func:`tempfile.gettempdir` (``/tmp`` unless ``TMPDIR`` says otherwise), so the collectors'
    glob ``/tmp/gpu_notebook-logs/*/rank-*.jsonl`` finds every cluster's files. The cluster's name is made safe
    for a path (see :func:`safe_name`). Nothing is created here; :class:`RankLogFile` makes the folder.
    """
    return os.path.join(tempfile.gettempdir(), _BASE, safe_name(cluster))


def _private_dir(path: str) -> None:
    """Make ``path`` (and its parent) user-only folders, and refuse one that is not this user's own.

    The default folder is in a temp dir that every user can write: a folder (or a link) planted there by someone
    else would get the rank's output, so the leaf must be a real folder owned by this user. (So a second user of
    the same node, whose clusters' folders cannot go under the first user's ``gpu_notebook-logs``, gets no files:
    its ranks warn once and run on.)
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(errno.EPERM, "not a folder of this user", path)
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)


def warn(text: str) -> None:
    """One line on the process's real stderr, which the rank's output capture does not intercept."""
    err = sys.__stderr__
    if err is None:
        return
    try:
        err.write(f"gpu_notebook: {text}\n")
        err.flush()
    except (OSError, ValueError):  # the real stderr is closed too: there is nowhere left to tell
        pass


class RankLogFile:
    """One rank's output lines, as JSON records in size-capped, rotating files on its node.

    Parameters
    ----------
    directory
        The folder of the files (:func:`default_log_dir` of the cluster); made user-only when missing.
    rank, node, cluster
        Written into every record, so a collector that merges many nodes' files can tell them apart.
    max_bytes
        The size at which ``rank-<rank>.jsonl`` rotates (at least 1024).
    backups
        How many rotated files are kept (``rank-<rank>.jsonl.1`` is the newest); 0 drops the file's records
        when it rotates.

    Each complete line becomes ``{"time": <unix seconds>, "rank": ..., "node": ..., "cluster": ..., "stream":
    ..., "line": <the line without its newline>}``. Text comes in chunks as the rank prints; what follows a
    stream's last newline waits for the rest of its line (:meth:`flush` writes it as it is). Thread-safe.
    """

    def __init__(
        self,
        directory: str,
        rank: int,
        node: str,
        cluster: str,
        max_bytes: int = 10 * 2**20,
        backups: int = 3,
    ) -> None:
        if rank < 0:
            raise ValueError(f"a rank log file needs a rank of 0 or more, not {rank}")
        if max_bytes < _MIN_BYTES:
            raise ValueError(f"a rank log file needs max_bytes of at least {_MIN_BYTES}, not {max_bytes}")
        if backups < 0:
            raise ValueError(f"a rank log file needs backups of 0 or more, not {backups}")
        self.directory = directory
        self.rank = rank
        self.node = node
        self.cluster = cluster
        self.max_bytes = max_bytes
        self.backups = backups
        self.path = os.path.join(directory, f"rank-{rank}.jsonl")
        #: why the file is off (None while it is on): the first OSError it met
        self.error: str | None = None
        self._cut = max_bytes // 4  # a longer line keeps this many characters and a note
        self._max_record = max_bytes // 2
        self._fixed = (
            f', "rank": {rank}, "node": {encode_basestring(node)}, "cluster": {encode_basestring(cluster)}'
        )
        self._streams: dict[str, str] = {}  # stream -> its encoded ', "stream": ..., "line": ' part
        self._partial: dict[str, str] = {}  # stream -> the start of its line still waiting for a newline
        # streams whose over-long partial line was written cut: what comes up to its newline is dropped
        self._skipping: set[str] = set()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        try:
            _private_dir(directory)
            self._open()
        except OSError as exc:
            self._fail(exc)

    # ---- writing

    def write(self, text: str, stream: str = "stdout") -> None:
        """Write the complete lines of ``text`` (with what ``stream`` had pending) as records; never raises."""
        if not text:
            return
        with self._lock:
            if self._fd is None:
                return
            lines = (self._partial.pop(stream, "") + text).split("\n")
            rest = lines.pop()
            if stream in self._skipping:  # the tail of a line already written cut: up to its newline, gone
                if not lines:
                    return
                self._skipping.discard(stream)
                lines.pop(0)
            unfinished = len(rest) > self._cut
            if unfinished:  # a line that grows without a newline (a progress bar): cut it now, drop the rest
                lines.append(rest)
                self._skipping.add(stream)
            elif rest:
                self._partial[stream] = rest
            if lines:
                self._emit(stream, lines, unfinished)

    def flush(self) -> None:
        """Write every stream's pending partial line as a record of its own."""
        with self._lock:
            pending, self._partial = self._partial, {}
            self._skipping.clear()
            if self._fd is None:
                return
            for stream, rest in pending.items():
                self._emit(stream, [rest])

    def close(self) -> None:
        """Write the pending partial lines and close the file; later writes are ignored."""
        self.flush()
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:  # closing a file we only appended to loses nothing
                    pass
                self._fd = None

    @property
    def active(self) -> bool:
        """Whether lines still go to the file (not closed, no error met)."""
        return self._fd is not None

    def _emit(self, stream: str, lines: list[str], unfinished: bool = False) -> None:
        """Write ``lines`` as records; ``unfinished``: the last one is the start of a line still going on."""
        # one time stamp a call: the lines of one chunk of output arrived together
        stamp = f'{{"time": {time.time():.6f}{self._fixed}'
        part = self._streams.get(stream)
        if part is None:
            part = self._streams[stream] = f', "stream": {encode_basestring(stream)}, "line": '
        last = len(lines) - 1
        records = [self._record(stamp + part, line, unfinished and i == last) for i, line in enumerate(lines)]
        try:
            self._append(records)
        except OSError as exc:
            self._fail(exc)

    def _record(self, head: str, line: str, unfinished: bool = False) -> bytes:
        if len(line) <= self._cut and not unfinished:
            data = self._encode(head, line)
            if len(data) <= self._max_record:
                return data
        note = "the rest of the line dropped" if unfinished else f"{len(line)} characters in all"
        keep = self._cut
        while True:  # escapes or wide characters can make a record far bigger than its characters
            data = self._encode(head, f"{line[:keep]} [... line cut at {keep} characters: {note}]")
            if len(data) <= self._max_record:
                return data
            keep //= 2

    @staticmethod
    def _encode(head: str, text: str) -> bytes:
        # A lone surrogate (bytes that were not UTF-8, decoded with surrogateescape) cannot be UTF-8:
        # backslashreplace writes it as \udcXX, which inside a JSON string is that character's escape.
        return f"{head}{encode_basestring(text)}}}\n".encode("utf-8", "backslashreplace")

    def _append(self, records: list[bytes]) -> None:
        chunk: list[bytes] = []
        size = self._size
        for record in records:
            if size and size + len(record) > self.max_bytes:
                self._write_all(b"".join(chunk))
                chunk = []
                self._rotate()
                size = 0
            chunk.append(record)
            size += len(record)
        self._write_all(b"".join(chunk))

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            assert self._fd is not None
            n = os.write(self._fd, view)
            view = view[n:]
            self._size += n

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | OPEN_FLAGS, 0o600)
        try:
            info = os.fstat(fd)
            if info.st_mode & 0o077:
                os.fchmod(fd, 0o600)
            self._fd, self._size = fd, info.st_size
            if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
                # an earlier writer was killed mid-record: its torn end stays a line of its own, which readers skip
                self._write_all(b"\n")
        except OSError:
            self._fd = None
            os.close(fd)
            raise

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        if self.backups:
            for i in range(self.backups - 1, 0, -1):
                try:
                    os.replace(f"{self.path}.{i}", f"{self.path}.{i + 1}")  # replaces (drops) the oldest
                except FileNotFoundError:  # fewer rotations so far than backups
                    pass
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._open()

    def _fail(self, exc: OSError) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:  # already failing; the file is off either way
                pass
            self._fd = None
        self.error = f"{type(exc).__name__}: {exc}"
        warn(f"rank {self.rank}'s log file {self.path} is off, its output goes on without it ({exc})")

    # ---- the resource

    def __enter__(self) -> RankLogFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"off: {self.error}" if self.error else ("open" if self._fd is not None else "closed")
        return f"RankLogFile(rank {self.rank}, {self.path}, {self._size} bytes, {state})"

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"


# ---- reading back


def rotated_numbers(directory: str, rank: int) -> list[int]:
    """The numbers of ``rank``'s rotated files in ``directory``, newest (1) first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [m for m in map(FILE_NAME.fullmatch, names) if m and int(m.group(1)) == rank and m.group(2)]
    return sorted(int(m.group(2)) for m in found)


def _lines_backwards(f: BinaryIO) -> Iterator[bytes]:
    """The lines of ``f``, the last first (a torn last line included: the caller skips what does not parse)."""
    pos = f.seek(0, os.SEEK_END)
    rest = b""
    while pos > 0:
        step = min(_BLOCK, pos)
        pos -= step
        f.seek(pos)
        parts = (f.read(step) + rest).split(b"\n")
        rest = parts.pop(0)  # may be the end of a line that starts in the block before
        for part in reversed(parts):
            if part:
                yield part
    if rest:
        yield rest


def parse_record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except ValueError:  # a torn line (a writer killed mid-write, or one being written now)
        return None
    return record if isinstance(record, dict) and "line" in record else None


def read_tail(directory: str, rank: int, n: int | None = 50) -> list[dict[str, Any]]:
    """The newest ``n`` records (all for None) of ``rank`` in ``directory``, oldest first.

    Reads the live file and then the rotated ones backwards, only as far as it needs; a line that is not a
    whole record (torn by a kill, or being written now) is skipped. Records come in the order they were
    written, which is the order of their times.
    """
    if n is not None and n <= 0:
        return []
    base = os.path.join(directory, f"rank-{rank}.jsonl")
    newest_first: list[dict[str, Any]] = []
    seen: set[int] = set()
    for path in [base, *(f"{base}.{i}" for i in rotated_numbers(directory, rank))]:
        try:
            f = open(path, "rb")
        except FileNotFoundError:  # rotated away between the listing and here
            continue
        with f:
            inode = os.fstat(f.fileno()).st_ino
            if inode in seen:  # a rotation renamed it while we read: already read under its old name
                continue
            seen.add(inode)
            for raw in _lines_backwards(f):
                record = parse_record(raw)
                if record is not None:
                    newest_first.append(record)
                    if n is not None and len(newest_first) >= n:
                        return newest_first[::-1]
    return newest_first[::-1]
