"""A checkpoint store in a folder of a local (or shared network) file system."""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

from .._errors import ObjectMissingError, StoreError
from .base import ObjectInfo, Store

__all__ = ["LocalStore"]

_MAP_BYTES = 256 * 1024  # ranges from this size up are read through a memory map


class LocalStore(Store):
    """A folder on a local (or shared network) file system.

    Writes go to a temporary file in the same folder, are fsynced, and are then published with
    ``os.link`` (fails if the key exists: create-only) or ``os.replace``; readers never see partial files.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.expanduser(os.fspath(root))).absolute()
        self.url = str(self.root)
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad key {key!r}")
        return self.root / key

    def check(self, write: bool = True) -> None:
        if not write:
            if not self.root.is_dir():
                raise StoreError(f"no checkpoint store at {self.url}: the folder does not exist")
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise StoreError(f"checkpoint folder {self.url} is not writable: {e}") from e

    def put(self, key: str, data: bytes | memoryview, create_only: bool = True) -> bool:
        path = self._path(key)
        if create_only and path.exists():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if create_only:
                try:
                    os.link(tmp, path)  # atomic and fails if the name exists
                except FileExistsError:
                    return False
                except OSError:  # a file system without hard links: check, then rename
                    if path.exists():
                        return False
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            else:
                os.replace(tmp, path)
            try:
                dfd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError:  # pragma: no cover - some file systems refuse directory fsync
                pass
            return True
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectMissingError(key) from None

    def get_range(self, key: str, offset: int, length: int) -> bytes | memoryview:
        """Read ``length`` bytes at ``offset``; a big range is a read-only view of the file mapped into memory
        (no copy, no fresh pages: the decoder reads the page cache directly). Objects are immutable once
        published (written aside, then linked in), so the mapping never sees a file change under it."""
        try:
            with open(self._path(key), "rb") as f:
                if length >= _MAP_BYTES:
                    size = os.fstat(f.fileno()).st_size
                    if size >= offset + length:
                        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                        return memoryview(m)[offset : offset + length]
                f.seek(offset)
                return f.read(length)
        except FileNotFoundError:
            raise ObjectMissingError(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self.root
        out: list[ObjectInfo] = []
        # walk only the top folder of the prefix
        top = prefix.split("/")[0] if "/" in prefix else ""
        start = base / top if top else base
        if not start.exists():
            return []
        for dirpath, _dirs, files in os.walk(start):
            for fn in files:
                if fn.startswith(".tmp-") or fn.startswith(".probe-"):
                    continue
                p = Path(dirpath) / fn
                key = p.relative_to(base).as_posix()
                if key.startswith(prefix):
                    try:
                        st = p.stat()
                    except FileNotFoundError:
                        continue
                    out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def touch(self, key: str) -> None:
        try:
            os.utime(self._path(key))
        except FileNotFoundError:
            pass

    def clean_temporaries(self, older_than_s: float = 3600.0) -> int:
        """Remove temporary files left by killed writers (older than ``older_than_s``)."""
        n = 0
        now = time.time()
        for dirpath, _d, files in os.walk(self.root):
            for fn in files:
                if fn.startswith(".tmp-"):
                    p = Path(dirpath) / fn
                    try:
                        if now - p.stat().st_mtime > older_than_s:
                            p.unlink()
                            n += 1
                    except FileNotFoundError:
                        pass
        return n
