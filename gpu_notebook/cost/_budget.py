"""The budget cap: warn at 80% of a USD budget; at 100% save a checkpoint (when given a way to) and stop."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Literal

from gpu_notebook import _registry

from ._meter import CostMeter
from ._policy import Notify, default_notify, log, stop_and_report
from ._policy import fmt_duration as _fmt

__all__ = ["DEFAULT_CHECKPOINT_TIMEOUT_S", "BudgetPolicy"]

#: How long a budget stop waits for ``on_budget_checkpoint`` before stopping anyway.
DEFAULT_CHECKPOINT_TIMEOUT_S = 120.0


def _active_checkpointer_note(timeout: float = 60.0) -> str:
    """Finish the in-flight save of this kernel's active Checkpointer (if any) and name its latest checkpoint."""
    try:
        ckpt = _registry.active_checkpointer()
        if ckpt is None:
            return ""
        ckpt.wait(timeout=timeout)
        latest = ckpt.latest()
        if latest is None:
            return ""
        return f"; its pending saves finished, the latest checkpoint is step {latest.step} ({latest.id})"
    except Exception as e:  # noqa: BLE001 - never let this block the stop
        return f"; could not read the active checkpointer ({type(e).__name__}: {e})"


#: Where a budget is: under its warning level, warned (``warn_fraction`` of it spent), or stopped (at 100%).
BudgetState = Literal["ok", "warned", "stopped"]


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
        if not 0 < usd < float("inf"):  # nan and inf too
            raise ValueError(f"--budget must be a positive number of US dollars, not {usd!r}")
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
        self.notify = notify or default_notify
        self.state: BudgetState = "ok"
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
            return self._trigger(at)
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

    def _trigger(self, at: float) -> str:
        if self.on_budget_checkpoint is not None:
            saved = self._checkpoint()
        else:
            saved = "no checkpoint saved (no on_budget_checkpoint given)" + _active_checkpointer_note()
        # The meter stops counting now, as the stop's first step would: the figure the stop names (in the cell
        # it ends, in this message) is then the one every view of the meter shows from now on.
        end = max(at, self.meter.clock())
        self.meter.stop_all(end)
        spent = self.meter.spent(end)
        reason = f"budget of ${self.usd:,.2f} reached: ${spent:,.2f} spent (estimate)"
        self.state = "stopped"
        message = stop_and_report(self, reason, [reason, saved])
        cluster = self.cluster
        if cluster is not None and getattr(cluster, "state", "") == "running":  # the stop failed: count on
            self.meter.poll(end)
        return message

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
