"""Workshop mode: one shared cluster, many students, each with their own worker group inside a quota.

The teacher starts a broker on the cluster (:class:`Workshop`); each student's :class:`WorkshopCluster` (what
``%gpu_cluster start --address ... --workshop NAME --student ID`` makes) gets its worker group placed by it,
inside a per-student quota, budget and idle stop, and reconnects to it by ID after a kernel restart.

The modules: ``_rules`` (the quota and cost arithmetic, pure), ``_broker`` (the detached broker actor),
``_seat`` (a student's link to it and the worker group it places), ``_student`` (the student's cluster) and
``_teacher`` (the teacher's handle and view). See ``docs/workshops.md``.
"""

from gpu_notebook.cluster.workshop._rules import DEFAULT_IDLE_STOP_MIN, Prices, Quota
from gpu_notebook.cluster.workshop._seat import BudgetSpentError, QuotaError, WorkshopError
from gpu_notebook.cluster.workshop._student import WorkshopCluster
from gpu_notebook.cluster.workshop._teacher import (
    StudentInfo,
    StudentsReport,
    Workshop,
    catalog_prices,
    current_workshop,
)

__all__ = [
    "DEFAULT_IDLE_STOP_MIN",
    "BudgetSpentError",
    "Prices",
    "Quota",
    "QuotaError",
    "StudentInfo",
    "StudentsReport",
    "Workshop",
    "WorkshopCluster",
    "WorkshopError",
    "catalog_prices",
    "current_workshop",
]
