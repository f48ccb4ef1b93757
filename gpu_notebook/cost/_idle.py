"""The GPU-aware idle stop, and where it reads utilisation from (the cluster's GPU monitor, else the CPU).

Idle means, for the whole window: no ``%%distributed`` cell running, no cell finished, and GPUs (CPUs on a
laptop) under a low utilisation threshold at every check. A countdown shows before the stop.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from typing import Any, Literal

from gpu_notebook import _registry
from gpu_notebook import monitor as gpu_monitor

from ._policy import Notify, Utilisation, default_notify, log, stop_and_report
from ._policy import fmt_duration as _fmt

__all__ = ["CpuUtilisation", "IdleStopPolicy", "MonitorUtilisation", "default_utilisation"]


class MonitorUtilisation:
    """``utilisation(window_s)`` from a running :class:`gpu_notebook.monitor.Monitor`.

    The busiest GPU decides (its mean utilisation over the window). Only when no node has a GPU does the
    busiest node's CPU % decide: on a GPU cluster the CPU of a CPU-only head node (Ray's own daemons, the
    notebook) says nothing about whether the GPUs are used. ``None`` when the monitor has no samples yet.
    """

    kind = "gpu"

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor

    def __call__(self, window_s: float) -> float | None:
        kind, value = gpu_monitor.busiest_utilisation(gpu_monitor.utilisation_summary(self.monitor, window_s))
        self.kind = kind
        return value


class CpuUtilisation:
    """``utilisation(window_s)`` of this machine's CPUs (percent since the previous call), for laptops.

    Uses psutil when installed, else the 1-minute load average divided by the core count.
    """

    kind = "cpu"

    def __init__(self) -> None:
        self._primed = False

    def __call__(self, window_s: float) -> float | None:
        try:
            import psutil

            v = float(psutil.cpu_percent(interval=None))
            if not self._primed:  # psutil's first call has no reference point
                self._primed = True
                return None
            return v
        except ImportError:
            try:
                return 100.0 * os.getloadavg()[0] / (os.cpu_count() or 1)
            except (OSError, AttributeError):
                return None


def _cluster_has_gpus(cluster: Any) -> bool:
    try:
        return any(float((n.get("Resources") or {}).get("GPU", 0)) > 0 for n in cluster.ray_nodes())
    except Exception:  # noqa: BLE001 - Ray unreachable (any Ray error): idle stop falls back to the CPU
        return False


def default_utilisation(cluster: Any) -> Utilisation:
    """Where idle stop reads utilisation from when none is given.

    The cluster's GPU monitor (:func:`gpu_notebook.monitor.monitor_for`, started here when the cluster has GPUs,
    reused when ``%gpu_monitor`` already runs one); otherwise this machine's CPU use (:class:`CpuUtilisation`).
    """
    if cluster is not None:
        try:
            existing = _registry.monitors.get(cluster)
            if existing is not None and getattr(existing, "started", False):
                return MonitorUtilisation(existing)
            if _cluster_has_gpus(cluster):
                return MonitorUtilisation(gpu_monitor.monitor_for(cluster))
        except Exception as e:  # noqa: BLE001 - a monitor problem must not break idle stop
            log.warning("GPU monitor unavailable for idle stop (%s); using CPU utilisation", e)
    return CpuUtilisation()


#: Where an idle stop is: work is running, idle (under the threshold), counting down to the stop, or stopped.
IdleState = Literal["active", "idle", "countdown", "stopped"]


class IdleStopPolicy:
    """Stop the workers after ``minutes`` of idleness, with a countdown first.

    Idle means, for the whole window: no ``%%distributed`` cell running (``cluster.busy``), no cell finished
    (``cluster.last_activity`` / :meth:`touch`), and utilisation (busiest GPU, or CPU on a laptop) under
    ``threshold`` percent at every check. A long data-loading stall inside a running cell is therefore never
    idle. The countdown (``status()['remaining_s']``) starts ``warn_before_s`` before the stop.

    Parameters
    ----------
    minutes
        Idle time before stopping.
    cluster
        Read for ``busy`` and ``last_activity``; stopped with ``cluster.stop(reason=...)`` unless ``stop`` is given.
    utilisation
        ``utilisation(window_s) -> percent or None`` (None: unknown, does not count as busy).
        Default: :func:`default_utilisation`.
    threshold
        Percent under which the hardware counts as idle (default 5 for GPUs, 10 for CPUs).
    warn_before_s
        Length of the visible countdown (default: a sixth of the window, at most 10 minutes).
    """

    name = "idle stop"

    def __init__(
        self,
        minutes: float,
        cluster: Any = None,
        utilisation: Utilisation | None = None,
        threshold: float | None = None,
        warn_before_s: float | None = None,
        stop: Callable[[str], Any] | None = None,
        notify: Notify | None = None,
    ) -> None:
        if not 0 < minutes < math.inf:  # nan and inf too
            raise ValueError(f"--idle-stop must be a positive number of minutes, not {minutes!r}")
        self.window_s = float(minutes) * 60.0
        self._cluster = weakref.ref(cluster) if cluster is not None else None
        self.utilisation = utilisation if utilisation is not None else default_utilisation(cluster)
        self._threshold = threshold
        self.warn_before_s = min(600.0, self.window_s / 6) if warn_before_s is None else float(warn_before_s)
        self._stop = stop
        self.notify = notify or default_notify
        self.idle_since: float | None = None
        self._touched: bool | float | None = None
        self._seen_activity: Any = None
        self._last_check: float | None = None
        self.last_utilisation: float | None = None
        self.state: IdleState = "active"
        self.message = ""
        self.remaining_s: float | None = None

    @property
    def cluster(self) -> Any:
        return self._cluster() if self._cluster is not None else None

    @property
    def threshold(self) -> float:
        if self._threshold is not None:
            return self._threshold
        return 10.0 if getattr(self.utilisation, "kind", "gpu") == "cpu" else 5.0

    def touch(self, at: float | None = None) -> None:
        """Activity now (a cell ran, a widget was used): restart the idle window at ``at`` (default: next check)."""
        self._touched = True if at is None else float(at)

    def check(self, at: float) -> str | None:
        """Evaluate at time ``at``; returns the message of an action taken, else None.

        ``cluster.last_activity`` is compared with its previous value rather than with ``at``, so a change
        seen at a check counts as activity at that check (the policy's clock may be simulated).
        """
        if self.state == "stopped":
            return None
        c = self.cluster
        window = at - self._last_check if self._last_check is not None else min(self.window_s, 60.0)
        self._last_check = at
        if self.idle_since is None:
            self.idle_since = at
        busy = bool(getattr(c, "busy", False)) if c is not None else False
        util: float | None = None
        try:
            util = self.utilisation(max(1.0, window))
        except Exception as e:  # noqa: BLE001 - unknown utilisation does not count as busy
            log.debug("utilisation failed: %s", e)
        self.last_utilisation = util
        last = getattr(c, "last_activity", None) if c is not None else None
        cell_ran = last is not None and self._seen_activity is not None and last != self._seen_activity
        self._seen_activity = last
        if busy or cell_ran or (util is not None and util >= self.threshold):
            self.idle_since = at
        if self._touched is True:
            self.idle_since = at
        elif isinstance(self._touched, float):
            self.idle_since = max(self.idle_since, min(at, self._touched))
        self._touched = None
        idle_for = at - self.idle_since
        remaining = self.window_s - idle_for
        self.remaining_s = max(0.0, remaining)
        what = (
            f"{getattr(self.utilisation, 'kind', 'gpu').upper()} {util:.0f}%"
            if util is not None
            else "utilisation unknown"
        )
        if busy:
            self.state, self.message = "active", "a %%distributed cell is running"
            return None
        if remaining <= 0:
            return self._trigger(idle_for)
        if remaining <= self.warn_before_s:
            was = self.state
            self.state = "countdown"
            self.message = (
                f"idle for {_fmt(idle_for)} ({what}): stopping the workers in {_fmt(remaining)} "
                "unless a cell runs"
            )
            if was != "countdown":
                self.notify(self.message)
                return self.message
            return None
        if idle_for > 0:
            self.state = "idle"
            self.message = f"idle for {_fmt(idle_for)} ({what}); stops after {_fmt(self.window_s)} idle"
        else:
            self.state = "active"
            self.message = f"active ({what}); stops after {_fmt(self.window_s)} idle"
        return None

    def _trigger(self, idle_for: float) -> str:
        reason = (
            f"idle for {_fmt(idle_for)} (no cell running, utilisation under {self.threshold:g}%): "
            f"--idle-stop {self.window_s / 60:g} min"
        )
        self.state = "stopped"
        self.remaining_s = 0.0
        parts = [reason]
        return stop_and_report(self, reason, parts)

    def status(self, at: float | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "message": self.message,
            "remaining_s": self.remaining_s,
            "window_s": self.window_s,
            "utilisation": self.last_utilisation,
        }

    def __repr__(self) -> str:
        return f"<IdleStopPolicy {self.window_s / 60:g} min {self.state}>"
