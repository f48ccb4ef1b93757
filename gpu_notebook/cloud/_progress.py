"""What a launch shows the user: progress stages with elapsed time, and Ray's own output kept in a log file.

Ray's cluster launcher prints hundreds of lines; a notebook shows the de-duplicated stages (:class:`Stages`)
and keeps the full output next to the cluster's saved state (:class:`LauncherOutput`), quoting its tail when
a launch fails.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

from gpu_notebook._display import Progress, stamp

from . import _ray_compat
from ._state import ClusterState

__all__ = ["LauncherOutput", "Stages"]


class LauncherOutput:
    """Sends the launcher's own console output (Ray's cli_logger, ssh/rsync output) to a log file.

    Ray's launcher prints hundreds of lines; in a notebook the progress stages are enough, and the full log is
    kept next to the cluster state (and its tail is quoted when a launch fails). ``verbose=True`` keeps it on
    the console instead.
    """

    def __init__(self, path: Path, verbose: bool) -> None:
        self.path = path
        self.verbose = verbose
        self.real_stdout: Any = None
        self._file: Any = None
        self._saved: list[Any] = []

    def __enter__(self) -> LauncherOutput:
        self.real_stdout = sys.stdout
        if self.verbose:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in __exit__
        handler = logging.StreamHandler(self._file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log = logging.getLogger("ray.autoscaler")
        self._saved = [sys.stdout, sys.stderr, log.propagate, handler, log.level]
        log.addHandler(handler)
        log.propagate = False
        log.setLevel(logging.INFO)
        sys.stdout = sys.stderr = self._file
        return self

    def __exit__(self, *exc: object) -> None:
        if self.verbose or not self._saved:
            return
        out, err, propagate, handler, level = self._saved
        sys.stdout, sys.stderr = out, err
        log = logging.getLogger("ray.autoscaler")
        log.removeHandler(handler)
        log.propagate = propagate
        log.setLevel(level)
        self._file.close()

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class Stages:
    """Turns launcher events into de-duplicated stage lines with elapsed time."""

    def __init__(self, progress: Progress | None, state: ClusterState | None = None) -> None:
        self.progress = progress
        self.state = state
        self.t0 = time.monotonic()
        self.last: str | None = None
        self.console: Any = None  # the real stdout while launcher output goes to a log file

    def __call__(self, stage: str) -> None:
        if stage == self.last:
            return
        self.last = stage
        elapsed = time.monotonic() - self.t0
        if self.state is not None:
            self.state.events.append({"stage": stage, "elapsed_s": round(elapsed, 2)})
        if self.progress is not None:
            if self.console is not None:
                with contextlib.redirect_stdout(self.console):
                    self.progress(stamp(elapsed, stage))
            else:
                self.progress(stamp(elapsed, stage))

    def ray_event(self, name: str, data: dict[str, Any]) -> None:
        stage = _ray_compat.EVENT_STAGES.get(name)
        if stage:
            self(stage)
