"""Budget cap and GPU-aware idle stop for a cluster, checked by one watcher thread.

* :class:`BudgetPolicy` warns at 80% of a USD budget; at 100% it saves a checkpoint (when given a way to),
  stops the workers and says why.
* :class:`IdleStopPolicy` stops the workers after ``minutes`` of idleness: no ``%%distributed`` cell running
  (``cluster.busy``), no cell finished (``cluster.last_activity``, or :meth:`IdleStopPolicy.touch`), and GPUs
  (CPUs on a laptop) under a low utilisation threshold the whole time. A countdown shows before it stops.
* :class:`PolicyWatcher` polls the cost meter and checks the policies every ``interval_s``; ``tick()`` runs
  one check (tests drive it with a simulated clock).

``attach_policies(cluster, idle_stop_minutes=..., budget_usd=...)`` wires all of it to a cluster; this is
what ``%gpu_cluster start --idle-stop MINUTES --budget USD`` calls.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ._meter import CostMeter, cost_meter_for

log = logging.getLogger("gpu_notebook.cost")

#: How long a budget stop waits for ``on_budget_checkpoint`` before stopping anyway.
DEFAULT_CHECKPOINT_TIMEOUT_S = 120.0
_DEFAULT: Any = object()

Notify = Callable[[str], None]
Utilisation = Callable[[float], "float | None"]


def _fmt(s: float) -> str:
    s = max(0, int(math.ceil(s)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _default_notify(msg: str) -> None:
    print(f"gpu_notebook: {msg}", file=sys.stderr, flush=True)


def _stop_and_report(policy: Any, reason: str, parts: list[str]) -> str:
    """Stop the workers for a policy (its own stop callable, else its cluster) and notify one message."""
    try:
        if policy._stop is not None:
            policy._stop(reason)
        elif policy.cluster is not None:
            _stop_cluster(policy.cluster, reason)
        parts.append("workers stopped")
    except Exception as e:  # noqa: BLE001
        parts.append(f"stopping the workers FAILED ({type(e).__name__}: {e}); stop them yourself")
    policy.message = "; ".join(parts)
    policy.notify(policy.message)
    return str(policy.message)


def _stop_cluster(cluster: Any, reason: str) -> str:
    try:
        return str(cluster.stop(reason=reason))
    except TypeError:
        return str(cluster.stop())


def _active_checkpointer_note(timeout: float = 60.0) -> str:
    """Finish the in-flight save of this kernel's active Checkpointer (if any) and name its latest checkpoint."""
    mod = sys.modules.get("gpu_notebook.checkpoint._checkpointer")
    if mod is None:
        return ""
    try:
        ckpt = mod.current()
        if ckpt is None:
            return ""
        ckpt.wait(timeout=timeout)
        latest = ckpt.latest()
        if latest is None:
            return ""
        return f"; its pending saves finished, the latest checkpoint is step {latest.step} ({latest.id})"
    except Exception as e:  # noqa: BLE001 - never let this block the stop
        return f"; could not read the active checkpointer ({type(e).__name__}: {e})"


# -- utilisation sources ----------------------------------------------------------------------------------------
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
        from gpu_notebook.monitor import utilisation_summary

        summary = utilisation_summary(self.monitor, window_s)
        nodes = [node for node in summary.values() if node.get("samples")]
        any_gpu = any(node.get("has_gpu") for node in nodes)
        key = "max_gpu_util" if any_gpu else "cpu_percent"
        vals: list[float] = []
        for node in nodes:
            if any_gpu and not node.get("has_gpu"):
                continue
            v = node.get(key, math.nan)
            if v is not None and not math.isnan(v):
                vals.append(float(v))
        self.kind = "gpu" if any_gpu else "cpu"
        return max(vals) if vals else None


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
    except Exception:  # noqa: BLE001
        return False


def default_utilisation(cluster: Any) -> Utilisation:
    """Where idle stop reads utilisation from when none is given.

    The cluster's GPU monitor (:func:`gpu_notebook.monitor.monitor_for`, started here when the cluster has GPUs,
    reused when ``%gpu_monitor`` already runs one); otherwise this machine's CPU use (:class:`CpuUtilisation`).
    """
    if cluster is not None:
        try:
            existing = None
            if "gpu_notebook.monitor._monitor" in sys.modules:
                existing = sys.modules["gpu_notebook.monitor._monitor"]._BY_CLUSTER.get(cluster)
            if existing is not None and getattr(existing, "started", False):
                return MonitorUtilisation(existing)
            if _cluster_has_gpus(cluster):
                from gpu_notebook.monitor import monitor_for

                return MonitorUtilisation(monitor_for(cluster))
        except Exception as e:  # noqa: BLE001 - a monitor problem must not break idle stop
            log.warning("GPU monitor unavailable for idle stop (%s); using CPU utilisation", e)
    return CpuUtilisation()


# -- policies -------------------------------------------------------------------------------------------------------
class BudgetPolicy:
    """Stop the workers when the estimated cost reaches ``usd``; warn at ``warn_fraction`` of it.

    Parameters
    ----------
    usd
        The budget in US dollars (estimated from list prices, see :class:`CostMeter`).
    meter
        The cost meter to read.
    cluster
        Stopped with ``cluster.stop(reason=...)`` at 100% unless ``stop`` is given.
    on_budget_checkpoint
        Called before stopping, on a thread of its own, to save a checkpoint; its return value is shown. Errors
        are reported and do not prevent the stop. It must not wait for the workers: a ``cluster.run``/``call``
        queues behind the cell that is training and would only start when training ends. Save from inside the
        training loop instead (``Checkpointer.maybe_save`` with ``every_minutes``); see ``docs/cost.md``.
    checkpoint_timeout_s
        How long the stop waits for ``on_budget_checkpoint`` (default 120 s; None: no limit). After that it
        warns and stops the workers anyway.
    stop
        ``stop(reason)`` instead of ``cluster.stop``.
    notify
        Receives the warning and stop messages (default: printed).
    """

    name = "budget"

    def __init__(
        self,
        usd: float,
        meter: CostMeter,
        cluster: Any = None,
        warn_fraction: float = 0.8,
        on_budget_checkpoint: Callable[[], Any] | None = None,
        stop: Callable[[str], Any] | None = None,
        notify: Notify | None = None,
        checkpoint_timeout_s: float | None = DEFAULT_CHECKPOINT_TIMEOUT_S,
    ) -> None:
        if not usd > 0:
            raise ValueError("--budget must be a positive number of US dollars")
        if not 0 < warn_fraction < 1:
            raise ValueError("warn_fraction is between 0 and 1")
        if checkpoint_timeout_s is not None and not checkpoint_timeout_s > 0:
            raise ValueError("budget_checkpoint_timeout_s must be a positive number of seconds (or None)")
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self.usd = float(usd)
        self.meter = meter
        self._cluster = weakref.ref(cluster) if cluster is not None else None
        self.warn_fraction = warn_fraction
        self.on_budget_checkpoint = on_budget_checkpoint
        self._stop = stop
        self.notify = notify or _default_notify
        self.state = "ok"  # ok | warned | stopped
        self.message = ""

    @property
    def cluster(self) -> Any:
        return self._cluster() if self._cluster is not None else None

    def check(self, at: float) -> str | None:
        """Evaluate at time ``at``; returns the message of an action taken (warning or stop), else None."""
        if self.state == "stopped":
            return None
        spent = self.meter.spent(at)
        rate = self.meter.usd_per_hour()
        if spent >= self.usd:
            return self._trigger(spent, at)
        left = self.usd - spent
        eta = f"; runs out in ~{_fmt(left / rate * 3600)} at ${rate:,.2f}/h" if rate > 0 else ""
        if spent >= self.warn_fraction * self.usd:
            self.message = f"${spent:,.2f} of ${self.usd:,.2f} spent ({100 * spent / self.usd:.0f}%){eta}"
            if self.state == "ok":
                self.state = "warned"
                msg = f"budget warning: {self.message} (estimate); the workers stop at 100%"
                self.notify(msg)
                return msg
            return None
        if self.meter.is_local and rate == 0:
            self.message = f"${self.usd:,.2f} budget; a local cluster costs $0, so it will not be reached"
        else:
            self.message = f"${spent:,.2f} of ${self.usd:,.2f} spent ({100 * spent / self.usd:.0f}%){eta}"
            unknown = self.meter.unknown_prices()
            if unknown:
                self.message += f"; not counted: nodes with no known price ({', '.join(unknown)})"
        return None

    def _trigger(self, spent: float, at: float) -> str:
        reason = f"budget of ${self.usd:,.2f} reached: ${spent:,.2f} spent (estimate)"
        parts = [reason]
        if self.on_budget_checkpoint is not None:
            parts.append(self._checkpoint())
        else:
            parts.append("no checkpoint saved (no on_budget_checkpoint given)" + _active_checkpointer_note())
        self.state = "stopped"
        return _stop_and_report(self, reason, parts)

    def _checkpoint(self) -> str:
        """Run ``on_budget_checkpoint`` on its own thread for at most ``checkpoint_timeout_s``; say what happened."""
        fn = self.on_budget_checkpoint
        assert fn is not None
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - reported below (or dropped once the stop went on)
                outcome["error"] = e

        t = threading.Thread(target=run, name="gpu_notebook-budget-checkpoint", daemon=True)
        t.start()
        t.join(self.checkpoint_timeout_s)
        if t.is_alive():
            timeout = self.checkpoint_timeout_s or 0.0
            msg = (
                f"checkpoint NOT finished after {_fmt(timeout)} (budget_checkpoint_timeout_s): "
                "on_budget_checkpoint is still running, e.g. queued behind the training cell; stopping anyway"
            )
            log.warning(msg)
            return msg
        if "error" in outcome:
            e = outcome["error"]
            return f"checkpoint FAILED ({type(e).__name__}: {e})"
        saved = outcome.get("value")
        return "checkpoint saved" + (f": {saved}" if saved is not None else "")

    def status(self, at: float | None = None) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "message": self.message, "budget_usd": self.usd}

    def __repr__(self) -> str:
        return f"<BudgetPolicy ${self.usd:,.2f} {self.state}>"


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
        if not minutes > 0:
            raise ValueError("--idle-stop must be a positive number of minutes")
        self.window_s = float(minutes) * 60.0
        self._cluster = weakref.ref(cluster) if cluster is not None else None
        self.utilisation = utilisation if utilisation is not None else default_utilisation(cluster)
        self._threshold = threshold
        self.warn_before_s = min(600.0, self.window_s / 6) if warn_before_s is None else float(warn_before_s)
        self._stop = stop
        self.notify = notify or _default_notify
        self.idle_since: float | None = None
        self._touched: bool | float | None = None
        self._seen_activity: Any = None
        self._last_check: float | None = None
        self.last_utilisation: float | None = None
        self.state = "active"  # active | idle | countdown | stopped
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
        return _stop_and_report(self, reason, parts)

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


# -- the watcher ----------------------------------------------------------------------------------------------------
class PolicyWatcher:
    """Polls the cost meter and checks the policies every ``interval_s`` seconds on a daemon thread.

    ``tick(at)`` does one round (tests call it with a simulated clock instead of starting the thread).
    """

    def __init__(
        self,
        meter: CostMeter,
        policies: list[Any],
        interval_s: float = 10.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.meter = meter
        self.policies = list(policies)
        self.interval_s = float(interval_s)
        self.clock = clock or meter.clock
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._unhook: Callable[[], None] | None = None

    def tick(self, at: float | None = None) -> list[str]:
        """One round: refresh the meter's nodes, then check each policy. Returns the actions' messages."""
        at = self.clock() if at is None else at
        out: list[str] = []
        with self._lock:
            self.meter.poll(at)
            for p in self.policies:
                try:
                    msg = p.check(at)
                except Exception as e:  # noqa: BLE001 - one broken policy must not stop the others
                    msg = f"{getattr(p, 'name', p)} check failed: {type(e).__name__}: {e}"
                    log.warning(msg)
                if msg:
                    out.append(msg)
                    self.messages.append((at, msg))
                    del self.messages[:-50]
            self.meter.snapshot(at)  # records the $ history the widget plots
        return out

    def touch(self, at: float | None = None) -> None:
        """Tell the idle policies that the user did something."""
        at = self.clock() if at is None else at
        for p in self.policies:
            if hasattr(p, "touch"):
                p.touch(at)

    def start(self) -> PolicyWatcher:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpu_notebook-cost-policies", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001
                log.warning("cost policy tick failed: %s", e)
            if all(getattr(p, "state", "") == "stopped" for p in self.policies) and self.policies:
                break

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        t = self._thread
        if join and t is not None and t is not threading.current_thread():
            t.join(timeout=5)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self, at: float | None = None) -> list[dict[str, Any]]:
        return [p.status(at) for p in self.policies]

    def __repr__(self) -> str:
        return f"<PolicyWatcher {self.policies} {'running' if self.running else 'idle'}>"


_WATCHERS: weakref.WeakKeyDictionary[Any, PolicyWatcher] = weakref.WeakKeyDictionary()


def watcher_for(cluster: Any) -> PolicyWatcher | None:
    """The policy watcher attached to ``cluster`` by :func:`attach_policies`, if any."""
    return _WATCHERS.get(cluster)


def _hook_ipython_cells(watcher: PolicyWatcher) -> Callable[[], None] | None:
    """Any cell the user runs resets the idle countdown (IPython's ``post_run_cell`` event)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    if ip is None:
        return None

    def _cell_ran(result: Any = None) -> None:
        watcher.touch()

    ip.events.register("post_run_cell", _cell_ran)

    def unhook() -> None:
        try:
            ip.events.unregister("post_run_cell", _cell_ran)
        except ValueError:
            pass

    return unhook


def attach_policies(
    cluster: Any,
    idle_stop_minutes: float | None = None,
    budget_usd: float | None = None,
    *,
    node_pricing: Any = None,
    utilisation: Utilisation | None = None,
    on_budget_checkpoint: Callable[[], Any] | None = None,
    idle_threshold: float | None = None,
    interval_s: float = 10.0,
    clock: Callable[[], float] | None = None,
    start: bool = True,
    notify: Notify | None = None,
    budget_checkpoint_timeout_s: Any = _DEFAULT,
) -> PolicyWatcher:
    """Attach a cost meter, a budget cap and/or an idle stop to ``cluster``; returns the running watcher.

    This is what ``%gpu_cluster start --idle-stop MINUTES --budget USD`` calls. Attaching again replaces the
    previous policies. The watcher ends when the cluster stops. ``on_budget_checkpoint`` and
    ``budget_checkpoint_timeout_s`` (default 120 s) default to the cluster's options of those names; see
    :class:`BudgetPolicy`.

    Examples
    --------
    >>> from gpu_notebook.cost import attach_policies
    >>> w = attach_policies(cluster, idle_stop_minutes=60, budget_usd=25)   # doctest: +SKIP
    """
    kwargs: dict[str, Any] = {}
    if node_pricing is not None:
        kwargs["node_pricing"] = node_pricing
    if clock is not None:
        kwargs["clock"] = clock
    meter = cost_meter_for(cluster, **kwargs)
    if clock is not None:
        meter.clock = clock
    if node_pricing is not None:
        meter.node_pricing = node_pricing
        meter.reprice()
    opts = getattr(cluster, "options", None) or {}
    if on_budget_checkpoint is None:
        on_budget_checkpoint = opts.get("on_budget_checkpoint")
    if budget_checkpoint_timeout_s is _DEFAULT:
        budget_checkpoint_timeout_s = opts.get("budget_checkpoint_timeout_s", DEFAULT_CHECKPOINT_TIMEOUT_S)
    policies: list[Any] = []
    if budget_usd is not None:
        policies.append(
            BudgetPolicy(
                budget_usd,
                meter,
                cluster,
                on_budget_checkpoint=on_budget_checkpoint,
                notify=notify,
                checkpoint_timeout_s=budget_checkpoint_timeout_s,
            )
        )
    if idle_stop_minutes is not None:
        policies.append(
            IdleStopPolicy(
                idle_stop_minutes, cluster, utilisation=utilisation, threshold=idle_threshold, notify=notify
            )
        )
    old = _WATCHERS.get(cluster)
    if old is not None:
        old.stop()
    meter.budget_usd = float(budget_usd) if budget_usd is not None else None
    meter.policies = policies
    watcher = PolicyWatcher(meter, policies, interval_s=interval_s, clock=clock or meter.clock)
    _WATCHERS[cluster] = watcher
    if idle_stop_minutes is not None:
        watcher._unhook = _hook_ipython_cells(watcher)
    if hasattr(cluster, "add_stop_hook"):
        ref = weakref.ref(watcher)

        def _cluster_stopping(reason: str) -> None:
            w = ref()
            if w is not None:
                w.stop(join=False)

        cluster.add_stop_hook(_cluster_stopping)
    if start:
        watcher.start()
    return watcher


def attach_from_options(cluster: Any, **kwargs: Any) -> PolicyWatcher | None:
    """Attach the policies ``cluster.options`` asks for (``idle_stop`` minutes, ``budget`` USD); None if neither.

    ``%gpu_cluster start --idle-stop 60 --budget 25`` stores those options on the cluster; call this after
    ``cluster.start()``. ``node_pricing`` and ``on_budget_checkpoint`` are read from the options too; ``kwargs``
    go to :func:`attach_policies`.
    """
    opts = getattr(cluster, "options", None) or {}
    idle, budget = opts.get("idle_stop"), opts.get("budget")
    if idle is None and budget is None:
        return None
    kwargs.setdefault("node_pricing", opts.get("node_pricing"))
    return attach_policies(cluster, idle_stop_minutes=idle, budget_usd=budget, **kwargs)


def describe(watcher: PolicyWatcher | None) -> str:
    """One line saying which policies watch the cluster (what the magics print after start)."""
    if watcher is None or not watcher.policies:
        return "no budget or idle stop"
    parts = []
    for p in watcher.policies:
        if isinstance(p, BudgetPolicy):
            parts.append(f"budget ${p.usd:,.2f} (warns at {p.warn_fraction:.0%}, then checkpoint and stop)")
        elif isinstance(p, IdleStopPolicy):
            parts.append(
                f"idle stop after {p.window_s / 60:g} min without cells or {p.threshold:g}% utilisation"
            )
    return "; ".join(parts) + (
        "; cost is a list-price estimate" if not watcher.meter.is_local else "; local cluster: $0"
    )
