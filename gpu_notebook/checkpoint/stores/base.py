"""The interface every checkpoint store implements, and what a store hands back (:class:`ObjectInfo`).

A store maps string keys (``objects/ab/abcdef...``, ``manifests/<id>.json``) to immutable bytes. Writes of
content-addressed objects and manifests are *create-only*: a key is never overwritten, so a half-finished
save can never damage what an earlier checkpoint needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import ObjectMissingError, StoreError

__all__ = ["Store", "ObjectInfo", "StoreError", "ObjectMissingError"]


@dataclass(frozen=True)
class ObjectInfo:
    """A listed object: key, size in bytes, modification time (``time.time()`` seconds)."""

    key: str
    size: int
    mtime: float


class Store:
    """The interface every store implements (all methods are thread-safe)."""

    url: str = ""

    def check(self, write: bool = True) -> None:
        """Verify the store is reachable (and writable, with ``write``; without it, create nothing); raise
        :class:`StoreError` with a clear message if not."""
        raise NotImplementedError

    def put(self, key: str, data: bytes | memoryview, create_only: bool = True) -> bool:
        """Write ``data`` at ``key``. With ``create_only``, return False (and write nothing) if it exists."""
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        """Read a whole object; :class:`ObjectMissingError` if it does not exist."""
        raise NotImplementedError

    def get_range(self, key: str, offset: int, length: int) -> bytes | memoryview:
        """Read ``length`` bytes at ``offset`` (bytes, or a read-only view of them)."""
        return self.get(key)[offset : offset + length]

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str) -> list[ObjectInfo]:
        """All objects whose key starts with ``prefix``, sorted by key."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Delete a key (no error if it is already gone)."""
        raise NotImplementedError

    def touch(self, key: str) -> None:
        """Make an existing object count as new (its modification time: now), so that a concurrent ``gc``'s
        grace window protects it. A save calls it on an object it reuses that it did not write (a create-only
        ``put`` that found it there): such an object may be an orphan a ``gc`` is about to delete. No error if
        the key is gone."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
