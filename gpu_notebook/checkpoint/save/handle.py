"""The handle :meth:`Checkpointer.save` returns: a future for one background save."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

from ..format.manifest import CheckpointInfo

__all__ = ["SaveHandle"]


class SaveHandle:
    """The result of :meth:`Checkpointer.save`: a future for one background save."""

    def __init__(self, ckpt_id: str | None, step: int, future: cf.Future[Any] | None, skipped: bool = False):
        self._id = ckpt_id
        self.step = step
        self.skipped = skipped
        self._future = future

    @property
    def id(self) -> str | None:
        """The checkpoint's id: the place proposed at the save, until the commit took one (it moves past a place
        another writer on the same store took meanwhile)."""
        f = self._future
        if f is not None and f.done() and not f.cancelled() and f.exception() is None:
            info = f.result()
            if info is not None:
                return str(info.id)
        return self._id

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def result(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Wait for the save; return its :class:`CheckpointInfo` (None if skipped or not written by this rank)."""
        if self._future is None:
            return None
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return None if self._future is None else self._future.exception(timeout)

    def wait_quietly(self) -> None:
        """Wait for the save to end; its failure is recorded by the save itself and raised by the next one."""
        if self._future is not None:
            cf.wait([self._future])

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else ("done" if self.done() else "saving")
        return f"<SaveHandle {self.id} step={self.step} {state}>"
