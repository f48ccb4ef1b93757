"""When to save: the ``every_steps`` / ``every_minutes`` schedule of :meth:`Checkpointer.maybe_save`, and the
spot preemption notice that overrides it (agreed on by every rank of a job, so that they all save together)."""

from __future__ import annotations

import logging
import time
from typing import Any

from gpu_notebook import _registry, _settings

from ._group import agree_min
from ._preemption import DEFAULT_WARNING_S, PreemptionNotice, PreemptionWatcher

__all__ = ["due", "guard_notice", "Preemption"]

log = logging.getLogger("gpu_notebook.checkpoint")


def due(
    step: int,
    every_steps: int | None,
    every_minutes: float | None,
    last_step: int | None,
    last_time: float | None,
    created: float,
) -> bool:
    """Whether the schedule says to save at ``step``: no schedule saves every time; else ``every_steps`` steps
    or ``every_minutes`` minutes since the last save (the clock starts when the checkpointer was created)."""
    if every_steps is None and every_minutes is None:
        return True
    if every_steps is not None:
        if last_step is None or step - last_step >= every_steps:
            return True
    if every_minutes is not None:
        ref = last_time if last_time is not None else created
        if time.time() - ref >= 60.0 * every_minutes:
            return True
    return False


class Preemption:
    """A watcher of the metadata service (or none) and what it told this process: the notice, agreed on by the
    ranks of a job, and whether the save it calls for was made."""

    def __init__(self, preemption: Any, on_preemption: str, world_size: int) -> None:
        self.on_preemption = on_preemption
        self.world_size = world_size
        self.watcher: PreemptionWatcher | None = None
        if preemption is not None and preemption is not False:
            self.watcher = (
                preemption
                if isinstance(preemption, PreemptionWatcher)
                else PreemptionWatcher(str(preemption))
            )
        self.notice: PreemptionNotice | None = None
        self.saved = False
        # a rank of a detached cluster: its guard (idle stop, budget) may announce a stop, as a cloud a preemption
        self.guarded = _settings.guarded()
        self._ranks_watch: bool | None = None  # multi-rank: does any rank watch for notices (agreed once)

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def full_save(self, notice: PreemptionNotice, full_rate: float | None, last_raw: int) -> bool:
        """Whether the save on ``notice`` is a full base: ``on_preemption`` says so, or (``"auto"``) a full save at
        the last measured speed (``full_rate`` raw bytes/s for ``last_raw`` bytes) fits in half the time left."""
        if self.on_preemption != "auto":
            return self.on_preemption == "full"
        left = notice.seconds_left()
        if full_rate and last_raw:
            return last_raw / full_rate <= 0.5 * left
        return left >= 60.0  # no full save measured yet: AWS's two minutes, not GCP's or Azure's 30 s

    def agreed_notice(self) -> PreemptionNotice | None:
        """This process's notice; in a multi-rank job, any rank's (every rank then saves together)."""
        w = self.watcher
        cloud_watch = w is not None and w.cloud is not None
        watching = cloud_watch or self.guarded
        multi = self.world_size > 1
        if multi and self._ranks_watch is None:
            # once: whether any rank watches. Ranks can differ (a node whose cloud was not recognised, or
            # preemption=None on one): every rank must then take part in the agreement below, or the ranks
            # that watch would wait in an all-reduce the others never join
            try:
                agreed = agree_min(0 if watching else 1)
            except Exception as e:  # noqa: BLE001 - no working process group after all: decide locally
                log.debug("preemption agreement skipped: %s", e)
                agreed = None
            self._ranks_watch = watching if agreed is None else agreed == 0
        if not (watching or (multi and self._ranks_watch)):
            return self.notice
        local = w.notice if cloud_watch and w is not None else None
        if local is None and self.guarded:
            local = guard_notice()
        if multi and self._ranks_watch:
            try:
                # 0 on every rank as soon as one rank has a notice
                if agree_min(0 if local is not None else 1) == 0 and local is None:
                    cloud = (w.cloud if w is not None else None) or "unknown"
                    now = time.time()
                    local = PreemptionNotice(cloud, "peer", now + DEFAULT_WARNING_S.get(cloud, 30.0), now)
            except Exception as e:  # noqa: BLE001 - no working process group after all: decide locally
                log.debug("preemption agreement skipped: %s", e)
        if local is not None and self.notice is None:
            self.notice = local
        return self.notice


def guard_notice() -> PreemptionNotice | None:
    """The notice of a detached cluster's guard that it stops this rank soon (its idle stop or budget fired), as a
    :class:`PreemptionNotice` of the cloud ``"guard"``; None while there is none."""
    got = _registry.stop_notice.get()
    if not got:
        return None
    return PreemptionNotice("guard", str(got.get("why", "stop")), float(got["deadline"]), detail=dict(got))
