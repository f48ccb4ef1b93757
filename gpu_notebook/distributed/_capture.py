"""Output capture in a rank's process: everything it writes, from Python, C code and subprocesses alike.

File descriptors 1 and 2 are sent through a pipe that a reader thread copies into a locked buffer (and on to
the original descriptors, so Ray's worker log files still get it); ``sys.stdout`` and ``sys.stderr`` write into
the same buffer. The driver drains the buffer while a cell runs. At the end of a cell a marker written into the
pipe behind the cell's output tells when the reader has read all of it (:meth:`Capture.sync`), so the cell's
output is delivered with the cell and not with the next one.

A forked child (``os.fork``, a DataLoader worker, a fork-started pool) inherits the buffer but nobody drains
its copy, so there :class:`StreamProxy` writes to file descriptors 1 and 2 instead: they are the pipe, and the
parent's reader delivers what the child writes, with the rank's prefix. The buffer's locks are taken around
every fork (``os.register_at_fork``) and made anew in the child, so a fork while another thread prints never
leaves the child a lock that nobody will release.

What the driver has not drained yet is also kept in a file (:meth:`Capture.spool`), written as it arrives and
emptied at every drain: a rank whose process dies (``os._exit``, a segfault, the OOM killer) takes its buffer
with it, but the file stays, and the driver reads it on the death (see :mod:`._remains`). Python's
``faulthandler`` writes the stack of a fatal signal into a second file next to it.
"""

from __future__ import annotations

import codecs
import ctypes
import faulthandler
import io
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Capture", "StreamProxy", "flush_std", "split_sync"]

# Written into the capture pipe at the end of a cell; the reader takes it out and reports having read it.
_SYNC_PREFIX = b"\x00gpu_notebook:sync:"
_SYNC_END = b"\x00"
_SYNC_DIGITS = 20


def split_sync(buf: bytes) -> tuple[bytes, list[int], bytes]:
    """Take the end-of-cell markers out of bytes read from the capture pipe.

    Returns the bytes that are output, the sequence numbers of the markers found, and a tail to hold back
    until the next read (the beginning of a marker that the read cut off).
    """
    out: list[bytes] = []
    seqs: list[int] = []
    pos = 0
    while True:
        i = buf.find(_SYNC_PREFIX, pos)
        if i < 0:
            break
        start = i + len(_SYNC_PREFIX)
        j = buf.find(_SYNC_END, start, start + _SYNC_DIGITS + 1)
        tail = buf[start:]
        if j < 0 and len(tail) <= _SYNC_DIGITS and (not tail or tail.isdigit()):
            out.append(buf[pos:i])
            return b"".join(out), seqs, buf[i:]  # cut off by the read
        if j > start and buf[start:j].isdigit():
            out.append(buf[pos:i])
            seqs.append(int(buf[start:j]))
            pos = j + 1
        else:  # not one of ours: the user's output
            out.append(buf[pos : i + 1])
            pos = i + 1
    rest = buf[pos:]
    for k in range(min(len(rest), len(_SYNC_PREFIX) - 1), 0, -1):
        if _SYNC_PREFIX.startswith(rest[-k:]):
            out.append(rest[:-k])
            return b"".join(out), seqs, rest[-k:]
    out.append(rest)
    return b"".join(out), seqs, b""


class Capture:
    """A process-wide sink for output: a locked list of text chunks plus the file-descriptor pipe reader."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._lock = threading.Lock()
        self._total = 0
        self._fd_thread: threading.Thread | None = None
        self._orig_fds: dict[int, int] = {}
        self._sync_fd: int | None = None  # our own end of the pipe, for end-of-cell markers
        self._sync_cond = threading.Condition()
        self._sync_sent = 0
        self._sync_seen = 0
        self.forked = False  # this is a forked child's copy: its streams write to fds 1 and 2
        self.tee: Callable[[str], None] | None = None  # also gets every write (a rank's log file)
        self._spool_fd: int | None = None  # the file holding what was not drained yet (see spool())
        self._fault_file: Any = None  # where faulthandler writes the stack of a fatal signal
        _CAPTURES.add(self)

    def spool(self, path: str, fault_path: str | None = None) -> None:
        """Also keep what is not drained yet in the file ``path`` (it outlives the process), and have
        ``faulthandler`` write the current thread's stack into ``fault_path`` on a fatal signal.

        Writes go straight to the file (no Python buffer): once a ``write`` returned, the text survives an
        ``os._exit`` or a segfault a moment later.
        """
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with self._lock:
            self._spool_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
            if self._chunks:
                _write_all(self._spool_fd, "".join(self._chunks).encode("utf-8", "replace"))
        if fault_path is not None:
            self._fault_file = open(fault_path, "w")  # noqa: SIM115 - faulthandler keeps it for the process
            faulthandler.enable(file=self._fault_file, all_threads=False)

    def close_spool(self) -> None:
        """Stop spooling and writing fatal-signal stacks (the worker is ending cleanly)."""
        with self._lock:
            fd, self._spool_fd = self._spool_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        if self._fault_file is not None:
            faulthandler.disable()
            self._fault_file.close()
            self._fault_file = None

    def write(self, text: str) -> None:
        tee = self.tee
        if text and tee is not None:
            tee(text)
        if text:
            with self._lock:
                self._chunks.append(text)
                self._total += len(text)
                if self._total > 8_000_000:  # never grow without bound between drains
                    whole = "".join(self._chunks)
                    joined = whole[-4_000_000:]
                    # counted, so a kernel that attaches after hours away says what it missed
                    dropped = whole.count("\n", 0, len(whole) - len(joined))
                    note = f"[... {dropped} lines of output dropped: nobody read them for a while ...]\n"
                    self._chunks = [note, joined]
                    self._total = len(joined)
                    self._truncate_spool(joined)
                elif self._spool_fd is not None:
                    _write_all(self._spool_fd, text.encode("utf-8", "replace"))

    def _truncate_spool(self, keep: str) -> None:
        """Empty the spool file, keeping ``keep`` (called under the lock)."""
        if self._spool_fd is None:
            return
        try:
            os.ftruncate(self._spool_fd, 0)  # O_APPEND: the next write goes to the new end
        except OSError:
            return
        if keep:
            _write_all(self._spool_fd, keep.encode("utf-8", "replace"))

    def _before_fork(self) -> None:
        self._lock.acquire()
        self._sync_cond.acquire()

    def _after_fork_in_parent(self) -> None:
        self._sync_cond.release()
        self._lock.release()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._sync_cond = threading.Condition()
        self._chunks, self._total = [], 0
        self._spool_fd = None  # the parent's file: only the parent drains it
        self.forked = True

    def drain(self) -> str:
        with self._lock:
            text = "".join(self._chunks)
            self._chunks = []
            self._total = 0
            self._truncate_spool("")
        return text

    def capture_fds(self) -> None:
        """Send file descriptors 1 and 2 (C code, subprocesses) through a pipe into this buffer.

        What arrives is also copied to the original descriptors, so Ray's own worker log files still get it.
        """
        if self._fd_thread is not None:
            return
        read_fd, write_fd = os.pipe()
        for fd in (1, 2):
            try:
                self._orig_fds[fd] = os.dup(fd)
                os.dup2(write_fd, fd)
            except OSError:
                pass
        self._sync_fd = write_fd
        orig_out = self._orig_fds.get(1)

        def pump() -> None:
            decoder = codecs.getincrementaldecoder("utf-8")("replace")  # characters cut by a read stay whole
            held = b""
            with os.fdopen(read_fd, "rb", buffering=0) as pipe:
                while True:
                    data = pipe.read(65536)
                    if not data:
                        self.write(decoder.decode(held, final=True))
                        return
                    data, seqs, held = split_sync(held + data)
                    if data:
                        self.write(decoder.decode(data))
                        if orig_out is not None:
                            try:
                                os.write(orig_out, data)
                            except OSError:
                                pass
                    if seqs:
                        with self._sync_cond:
                            self._sync_seen = max(self._sync_seen, *seqs)
                            self._sync_cond.notify_all()

        self._fd_thread = threading.Thread(target=pump, name="gpu_notebook-fd-capture", daemon=True)
        self._fd_thread.start()

    def sync(self, timeout: float = 2.0) -> bool:
        """Wait until the pipe reader has read everything written to file descriptors 1 and 2 so far.

        A marker goes through the pipe behind what is already in it; returns False if it was not read in time.
        """
        if self._sync_fd is None or self._fd_thread is None or not self._fd_thread.is_alive():
            return False
        with self._sync_cond:
            self._sync_sent += 1
            seq = self._sync_sent
        try:
            os.write(self._sync_fd, _SYNC_PREFIX + str(seq).encode() + _SYNC_END)
        except OSError:
            return False
        deadline = time.monotonic() + timeout
        with self._sync_cond:
            while self._sync_seen < seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._sync_cond.wait(left)
        return True


_CAPTURES: weakref.WeakSet[Capture] = weakref.WeakSet()


def _before_fork() -> None:
    for capture in list(_CAPTURES):
        capture._before_fork()


def _after_fork_in_parent() -> None:
    for capture in list(_CAPTURES):
        capture._after_fork_in_parent()


def _after_fork_in_child() -> None:
    for capture in list(_CAPTURES):
        capture._after_fork_in_child()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


class StreamProxy(io.TextIOBase):
    """A text stream that writes into the capture buffer (used as sys.stdout and sys.stderr).

    In a forked child it writes whole lines to its file descriptor instead (see the module docstring); a
    line not ended yet is written by :meth:`flush` (multiprocessing flushes the streams when a child ends).
    """

    def __init__(self, capture: Capture, name: str) -> None:
        super().__init__()
        self._capture = capture
        self.name = name
        self._pending = ""  # a forked child's unfinished line

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:  # type: ignore[override]
        if self._capture.forked:
            self._pending += s
            if "\n" in s:
                lines, _, self._pending = self._pending.rpartition("\n")
                _write_fd(self.fileno(), lines + "\n")
        else:
            self._capture.write(s)
        return len(s)

    def flush(self) -> None:
        if self._pending:
            text, self._pending = self._pending, ""
            _write_fd(self.fileno(), text)

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # subprocess.run(stdout=sys.stdout) needs a real descriptor: the captured fd
        return 1 if self.name == "<stdout>" else 2


def _write_fd(fd: int, text: str) -> None:
    _write_all(fd, text.encode("utf-8", "replace"))


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:  # the pipe or file is gone (the rank ended before its child), a full disk: nowhere left
        pass


_LIBC: Any = None


def flush_std() -> None:
    """Flush Python's own streams and every C stdio stream (``printf`` output sits in libc's buffer)."""
    global _LIBC
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing left to flush into it
            pass
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None)
        _LIBC.fflush(None)
    except (OSError, AttributeError):  # no libc (not Linux/macOS): nothing buffered there to lose
        pass
