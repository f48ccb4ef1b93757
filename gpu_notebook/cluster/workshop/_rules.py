"""The workshop's rules as pure functions: a student's quota, what their workers cost, their budget.

Everything here is arithmetic on plain numbers, so the broker (a Ray actor on the cluster) and the tests use the
same code and a policy is stated once, with doctests:

- a **quota** caps what one student's worker group may hold in all (CPUs, GPUs): ``workers x per-worker``;
- a student is **charged** for what their group holds (reserved, whether their cells run or not), at the
  teacher's price per CPU-hour and GPU-hour (on a cloud cluster, the catalog's node price shared out per GPU, or
  per CPU on CPU nodes);
- the **budget** is dollars per student: the broker warns at 80% and stops the group at 100%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_IDLE_STOP_MIN",
    "WARN_AT",
    "Prices",
    "Quota",
    "budget_state",
    "charge",
    "fmt_held",
    "over_quota",
    "rate_per_hour",
    "requested",
    "within_quota",
]

#: minutes without a running cell after which a student's group is stopped (and a dead kernel's reclaimed)
DEFAULT_IDLE_STOP_MIN = 15.0
#: the share of the budget at which the student is warned
WARN_AT = 0.8


@dataclass(frozen=True)
class Quota:
    """What one student's worker group may hold in all; None: no limit."""

    cpus: float | None = None  # logical CPUs, as Ray counts them (fractions allowed)
    gpus: float | None = None

    def text(self) -> str:
        """``"2 CPU, 0 GPU per student"``.

        >>> Quota(2, 0).text(), Quota().text()
        ('2 CPU, 0 GPU per student', 'no limit')
        """
        parts = [f"{v:g} {k}" for k, v in (("CPU", self.cpus), ("GPU", self.gpus)) if v is not None]
        return ", ".join(parts) + " per student" if parts else "no limit"


@dataclass(frozen=True)
class Prices:
    """What an hour of one CPU and of one GPU costs a student, and where the numbers come from."""

    cpu_hour: float = 0.0  # USD per CPU-hour
    gpu_hour: float = 0.0  # USD per GPU-hour
    source: str = "set by the teacher"  # or "catalog: aws p4d.24xlarge ..."

    def text(self) -> str:
        """What the prices say in a table.

        >>> Prices(0.05, 0).text()
        '$0.05/CPU-hour, $0/GPU-hour (set by the teacher)'
        """
        return f"${self.cpu_hour:g}/CPU-hour, ${self.gpu_hour:g}/GPU-hour ({self.source})"


def requested(size: int, bundle: Mapping[str, float]) -> dict[str, float]:
    """What ``size`` workers of ``bundle`` hold in all.

    >>> requested(3, {"CPU": 0.5}), requested(2, {"CPU": 1, "GPU": 1})
    ({'CPU': 1.5, 'GPU': 0.0}, {'CPU': 2.0, 'GPU': 2.0})
    """
    return {k: round(size * float(bundle.get(k, 0.0)), 6) for k in ("CPU", "GPU")}


def fmt_held(held: Mapping[str, float]) -> str:
    """What a group holds, for a message.

    >>> fmt_held({"CPU": 1.5, "GPU": 0}), fmt_held({"CPU": 2, "GPU": 1})
    ('1.5 CPU', '2 CPU + 1 GPU')
    """
    text = f"{held.get('CPU', 0):g} CPU"
    return text + (f" + {held['GPU']:g} GPU" if held.get("GPU") else "")


def within_quota(quota: Quota, size: int, bundle: Mapping[str, float]) -> bool:
    """Whether ``size`` workers of ``bundle`` fit the quota.

    >>> within_quota(Quota(2), 4, {"CPU": 0.5}), within_quota(Quota(2), 3, {"CPU": 1})
    (True, False)
    >>> within_quota(Quota(None, 1), 2, {"CPU": 1, "GPU": 1})
    False
    """
    return over_quota(quota, size, bundle) is None


def over_quota(
    quota: Quota, size: int, bundle: Mapping[str, float], who: str = "you", workshop: str = ""
) -> str | None:
    """Why ``size`` workers of ``bundle`` do not fit the quota (what was asked, the quota, what would fit), or
    None when they do.

    >>> print(over_quota(Quota(2), 3, {"CPU": 1}, "student 'bob'", "ml101"))
    workshop 'ml101': student 'bob' asked for 3 worker(s) of 1 CPU each = 3 CPU in all, over the quota of 2 CPU per student. Ask for at most 2 CPU in all, e.g. --workers 3 --cpus-per-worker 0.6 or --workers 2 --cpus-per-worker 1.
    """
    total = requested(size, bundle)
    limits = {"CPU": quota.cpus, "GPU": quota.gpus}
    over = [k for k, limit in limits.items() if limit is not None and total[k] > limit + 1e-9]
    if not over:
        return None
    key = over[0]
    limit = float(limits[key] or 0.0)
    each = float(bundle.get(key, 0.0))
    flag = "--cpus-per-worker" if key == "CPU" else "--gpus-per-worker"
    hints = []
    share = math.floor(limit / size * 10) / 10  # the same workers, each with less (tenths, as Ray allows)
    if share > 0:
        hints.append(f"--workers {size} {flag} {share:g}")
    fewer = int(limit // each) if each else 0
    if 0 < fewer < size:
        hints.append(f"--workers {fewer} {flag} {each:g}")
    where = f"workshop {workshop!r}: " if workshop else ""
    per = ", ".join(f"{v:g} {k}" for k, v in bundle.items() if v)
    hint = f", e.g. {' or '.join(hints)}" if hints else ""
    return (
        f"{where}{who} asked for {size} worker(s) of {per} each = {total[key]:g} {key} in all, over the quota "
        f"of {limit:g} {key} per student. Ask for at most {limit:g} {key} in all{hint}."
    )


def rate_per_hour(held: Mapping[str, float], prices: Prices) -> float:
    """USD per hour of what a group holds.

    >>> rate_per_hour({"CPU": 2, "GPU": 0}, Prices(0.05, 2.0)), rate_per_hour({"CPU": 1, "GPU": 1}, Prices(0, 2.5))
    (0.1, 2.5)
    """
    return round(held.get("CPU", 0.0) * prices.cpu_hour + held.get("GPU", 0.0) * prices.gpu_hour, 9)


def charge(held: Mapping[str, float], prices: Prices, seconds: float) -> float:
    """USD for holding ``held`` for ``seconds``.

    >>> round(charge({"CPU": 2}, Prices(0.05), 3600), 6), charge({"CPU": 2}, Prices(0.05), -5)
    (0.1, 0.0)
    """
    return rate_per_hour(held, prices) * max(0.0, seconds) / 3600.0


def budget_state(spent: float, budget: float | None) -> str:
    """``"ok"``, ``"warn"`` (at 80%) or ``"spent"`` (at 100%); always ``"ok"`` without a budget.

    >>> [budget_state(s, 5.0) for s in (1.0, 4.0, 5.0)], budget_state(99.0, None)
    (['ok', 'warn', 'spent'], 'ok')
    """
    if budget is None:
        return "ok"
    if spent >= budget:
        return "spent"
    return "warn" if spent >= WARN_AT * budget else "ok"
