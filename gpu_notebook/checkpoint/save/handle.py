"""The handle :meth:`Checkpointer.save` returns: a future for one background save."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

from ..format.manifest import CheckpointInfo

__all__ = ["SaveHandle"]


class SaveHandle:
    """The result of :meth:`Checkpointer.save`: a future for one background save."""

    def __init__(self, ckpt_id: str | None, step: int, future: cf.Future[Any] | None, skipped: bool = False):
        self.id = ckpt_id
        self.step = step
        self.skipped = skipped
        self._future = future

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
