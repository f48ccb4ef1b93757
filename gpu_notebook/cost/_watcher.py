"""One watcher thread per cluster that polls the cost meter and checks its policies; attaching them to a cluster.

``attach_policies(cluster, idle_stop_minutes=..., budget_usd=...)`` wires a cost meter, a budget cap and an idle
stop to a cluster and starts the watcher; this is what ``%gpu_cluster start --idle-stop MINUTES --budget USD``
calls. ``PolicyWatcher.tick()`` runs one check (tests drive it with a simulated clock).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from gpu_notebook import _registry

from ._budget import DEFAULT_CHECKPOINT_TIMEOUT_S, BudgetPolicy
from ._idle import IdleStopPolicy
from ._meter import CostMeter, cost_meter_for
from ._policy import Notify, Utilisation, log

__all__ = [
    "PolicyWatcher",
    "attach_from_options",
    "attach_policies",
    "describe",
    "last_stopped",
    "watcher_for",
]

_DEFAULT: Any = object()


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
            except Exception as e:  # noqa: BLE001 - the watcher thread outlives a failed round: the next one retries
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


def watcher_for(cluster: Any) -> PolicyWatcher | None:
    """The policy watcher attached to ``cluster`` by :func:`attach_policies`, if any."""
    return _registry.policy_watchers.get(cluster)


def last_stopped() -> tuple[str, CostMeter, str] | None:
    """The name, cost meter and stop reason of the last cluster with policies that stopped (its meter holds
    its final figures), or None."""
    return _registry.stopped_cost.get()


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


def add_policies(
    cluster: Any, idle_stop_minutes: float | None = None, budget_usd: float | None = None
) -> tuple[PolicyWatcher, list[str]]:
    """Attach a budget cap and/or an idle stop to ``cluster`` on top of the policies it has: the kind not given
    is kept as it is (with its threshold), a kind given replaces the earlier one of that kind. Returns the running
    watcher and what was replaced (e.g. ``["the earlier budget $100.00"]``); what ``%gpu_cost policies`` calls.
    """
    old = watcher_for(cluster)
    budget, idle, threshold, replaced = budget_usd, idle_stop_minutes, None, []
    for p in list(old.policies) if old is not None else []:
        if isinstance(p, BudgetPolicy):
            if budget is None:
                budget = p.usd
            else:
                replaced.append(f"the earlier budget ${p.usd:,.2f}")
        elif isinstance(p, IdleStopPolicy):
            if idle is None:
                idle, threshold = p.window_s / 60, p.threshold
            else:
                replaced.append(f"the earlier idle stop after {p.window_s / 60:g} min")
    w = attach_policies(cluster, idle_stop_minutes=idle, budget_usd=budget, idle_threshold=threshold)
    return w, replaced


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
    old = _registry.policy_watchers.get(cluster)
    if old is not None:
        old.stop()
    meter.budget_usd = float(budget_usd) if budget_usd is not None else None
    meter.policies = policies
    watcher = PolicyWatcher(meter, policies, interval_s=interval_s, clock=clock or meter.clock)
    _registry.policy_watchers.set(cluster, watcher)
    if idle_stop_minutes is not None:
        watcher._unhook = _hook_ipython_cells(watcher)
    if hasattr(cluster, "add_stop_hook"):
        ref = weakref.ref(watcher)
        name = str(getattr(cluster, "name", "") or "")

        def _cluster_stopping(reason: str) -> None:
            w = ref()
            if w is not None:
                w.stop(join=False)
                _registry.stopped_cost.set((name, w.meter, reason))

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
