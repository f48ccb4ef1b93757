"""What every cost policy is, and what the policies share: how they stop a cluster and say why.

A policy (:class:`Policy`) is checked by the :class:`~gpu_notebook.cost.PolicyWatcher` every few seconds with
the time of the check; it keeps its own state and message, and stops the cluster itself when it triggers
(:func:`stop_and_report`), so one policy's action never depends on another's.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from gpu_notebook._display import fmt_duration as _fmt_duration

__all__ = ["Notify", "Policy", "Utilisation", "default_notify", "fmt_duration", "log", "stop_and_report"]

log = logging.getLogger("gpu_notebook.cost")

#: Receives a policy's warning and stop messages.
Notify = Callable[[str], None]
#: ``utilisation(window_s) -> percent or None`` (None: unknown).
Utilisation = Callable[[float], "float | None"]


class Policy(Protocol):
    """The contract of a cost policy, as the watcher and the cost widget use it.

    ``check(at)`` evaluates the policy at time ``at`` (seconds since the epoch; tests pass a simulated clock)
    and returns the message of an action it took (a warning, a stop), else None; it must not raise for a
    condition of the cluster (the watcher reports an exception as a failed check and goes on). ``state`` is
    ``"stopped"`` once the policy stopped the cluster; a stopped policy does nothing more. ``message`` is the
    one line the widget and ``%gpu_cost`` show; ``status(at)`` is that state as a dict.
    """

    name: str
    state: str
    message: str

    def check(self, at: float) -> str | None: ...

    def status(self, at: float | None = None) -> dict[str, Any]: ...


class _Stoppable(Protocol):
    """What :func:`stop_and_report` needs of a policy."""

    _stop: Callable[[str], Any] | None
    message: str
    notify: Notify

    @property
    def cluster(self) -> Any: ...


#: durations in the policies' messages, rounded up: a countdown never says ``0s`` while time is left
fmt_duration = partial(_fmt_duration, round_up=True)


def default_notify(msg: str) -> None:
    print(f"gpu_notebook: {msg}", file=sys.stderr, flush=True)


def stop_and_report(policy: _Stoppable, reason: str, parts: list[str]) -> str:
    """Stop the workers for a policy (its own stop callable, else its cluster) and notify one message."""
    try:
        if policy._stop is not None:
            policy._stop(reason)
        elif policy.cluster is not None:
            _stop_cluster(policy.cluster, reason)
        parts.append("workers stopped")
    except Exception as e:  # noqa: BLE001 - a failed stop is reported in the policy's message, never raised
        parts.append(f"stopping the workers FAILED ({type(e).__name__}: {e}); stop them yourself")
    policy.message = "; ".join(parts)
    policy.notify(policy.message)
    return str(policy.message)


def _stop_cluster(cluster: Any, reason: str) -> str:
    try:
        return str(cluster.stop(reason=reason))
    except TypeError:
        return str(cluster.stop())
