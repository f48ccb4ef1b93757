"""The teacher's side of a workshop: start its broker on the shared cluster, see the students, stop them.

>>> ws = Workshop.start("ml101", quota_cpus=2, budget_usd=5, price_cpu_hour=0.05)   # doctest: +SKIP
>>> ws.students()                                  # a table: usage, utilisation, cost, state  # doctest: +SKIP
>>> ws.stop_student("bob"); ws.stop_all(); ws.stop()                                         # doctest: +SKIP

A :class:`Workshop` is a handle on the broker actor (:mod:`._broker`), which keeps running on the cluster when
the teacher's kernel ends; :meth:`Workshop.connect` finds it again. Prices: the teacher's per CPU-hour and
GPU-hour, or, on a cloud cluster of this kernel, the catalog's price of its nodes shared out per GPU (per CPU
on CPU-only nodes).
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook import _registry, cost
from gpu_notebook._display import Progress, fmt_duration
from gpu_notebook._registry import current_cluster
from gpu_notebook.cluster import _connect, _package_check
from gpu_notebook.cluster._runtime_env import prepare_for_workers
from gpu_notebook.cluster.workshop._broker import BROKER_NAME, Broker, namespace_of
from gpu_notebook.cluster.workshop._rules import DEFAULT_IDLE_STOP_MIN, Prices, Quota
from gpu_notebook.cluster.workshop._seat import WorkshopError, find_broker
from gpu_notebook.cluster.workshop._student import check_id

__all__ = ["StudentInfo", "StudentsReport", "Workshop", "catalog_prices", "current_workshop"]

# the workshops this kernel's teacher started or connected to (the current one last) are kernel state:
# _registry.workshops


def current_workshop() -> Workshop:
    """The workshop this kernel started or connected to last; a :class:`WorkshopError` when none."""
    ws: Workshop | None = _registry.workshops.latest()
    if ws is None:
        raise WorkshopError(
            "no workshop in this kernel: start one with %gpu_cluster workshop start NAME (or name one with "
            "--workshop NAME)"
        )
    return ws


@dataclass(frozen=True)
class StudentInfo:
    """One student as the teacher sees them."""

    student: str
    state: str  # running | detached (kernel gone, kept) | stopping | stopped | reclaimed | refused | joined
    why: str  # why it is in that state ('' while running)
    kernel: str  # alive | gone | ?
    workers: int
    held: str  # "1 CPU + 1 GPU", "-" when nothing is held
    usd_per_hour: float
    spent_usd: float
    budget_usd: float | None
    utilisation: float | None  # the share of the held time a cell was running (None: nothing held yet)
    idle_s: float
    idle_stop_in_s: float | None

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> StudentInfo:
        return cls(
            student=r["student"],
            state=r["state"],
            why=r["why"],
            kernel=r["kernel"],
            workers=int(r["size"]) if r["state"] in ("running", "detached", "stopping") else 0,
            held=r["held_text"],
            usd_per_hour=float(r["usd_per_hour"]),
            spent_usd=float(r["spent"]),
            budget_usd=r["budget_usd"],
            utilisation=r["utilisation"],
            idle_s=float(r["idle_s"]),
            idle_stop_in_s=r["idle_stop_in_s"],
        )

    @property
    def status(self) -> str:
        """What the teacher reads: ``running``, ``kernel gone (workers kept; idle stop in 12m)``, ..."""
        if self.state == "detached":
            left = (
                f"; idle stop in {fmt_duration(self.idle_stop_in_s, minutes=True)}"
                if self.idle_stop_in_s is not None
                else ""
            )
            return f"kernel gone (workers kept for a reconnect{left})"
        if self.state in ("running", "joined"):
            return self.state
        return f"{self.state}: {self.why}" if self.why else self.state


@dataclass
class StudentsReport:
    """The teacher view: every student with usage, utilisation and cost (text and HTML)."""

    workshop: str
    rules: str
    students: list[StudentInfo] = field(default_factory=list)

    def rows(self) -> list[list[str]]:
        out = []
        for s in self.students:
            budget = f" / ${s.budget_usd:g}" if s.budget_usd is not None else ""
            util = f"{100 * s.utilisation:.0f}%" if s.utilisation is not None else "-"
            out.append(
                [
                    s.student,
                    str(s.workers),
                    s.held,
                    util,
                    f"${s.usd_per_hour:.3f}/h",
                    f"${s.spent_usd:.3f}{budget}",
                    s.kernel,
                    s.status,
                ]
            )
        return out

    HEADER = ("student", "workers", "holds", "busy", "rate", "spent", "kernel", "state")

    def text(self) -> str:
        rows = [list(self.HEADER), *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER) - 1)]
        lines = [f"workshop {self.workshop!r}: {self.rules}"]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
        if not self.students:
            lines.append("no students yet")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{h}</th>" for h in self.HEADER)
        body = (
            "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self.rows())
            or f"<tr><td colspan='{len(self.HEADER)}'>no students yet</td></tr>"
        )
        return (
            f"<div><b>workshop {html.escape(self.workshop)}</b>: {html.escape(self.rules)}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        )


def catalog_prices(cluster: Any) -> Prices | None:
    """A cloud cluster's node prices from the catalog, shared out per GPU (per CPU on CPU-only nodes); None
    for a cluster that is not priced (a local one)."""
    if cluster is None or not getattr(cluster, "cloud_state", None):
        return None
    meter = cost.cost_meter_for(cluster)
    usd_gpu = usd_cpu = gpus = cpus = 0.0
    for node in cluster.ray_nodes():
        price = meter.price_for(node["NodeID"]).usd_per_hour
        res = node.get("Resources", {})
        if res.get("GPU"):
            usd_gpu, gpus = usd_gpu + price, gpus + float(res["GPU"])
        elif res.get("CPU") and "node:__internal_head__" not in res:
            usd_cpu, cpus = usd_cpu + price, cpus + float(res["CPU"])
    if not gpus and not cpus:
        return None
    return Prices(
        usd_cpu / cpus if cpus else 0.0,
        usd_gpu / gpus if gpus else 0.0,
        f"catalog prices of cluster {cluster.name!r}'s nodes",
    )


class Workshop:
    """A handle on a workshop's broker (see the module docstring); made by :meth:`start` or :meth:`connect`."""

    def __init__(self, name: str, broker: Any) -> None:
        self.name = name
        self.namespace = namespace_of(name)
        self.broker = broker

    def __repr__(self) -> str:
        return f"<Workshop {self.name!r}>"

    def _repr_html_(self) -> str:
        return self.students()._repr_html_()

    @classmethod
    def start(
        cls,
        name: str,
        quota_cpus: float | None = None,
        quota_gpus: float | None = None,
        budget_usd: float | None = None,
        price_cpu_hour: float | None = None,
        price_gpu_hour: float | None = None,
        idle_stop_minutes: float = DEFAULT_IDLE_STOP_MIN,
        address: str | None = None,
        heartbeat_s: float = 5.0,
        tick_s: float = 2.0,
        progress: Progress | None = None,
    ) -> Workshop:
        """Start the workshop's broker on the connected Ray cluster (or the one at ``address``); a workshop of
        that name already running gets these settings instead. Returns its handle (the kernel's current one).
        """
        import ray

        say = progress or (lambda msg: None)
        check_id(name, "workshop name")
        for what, v in (
            ("quota_cpus", quota_cpus),
            ("quota_gpus", quota_gpus),
            ("budget_usd", budget_usd),
            ("price_cpu_hour", price_cpu_hour),
            ("price_gpu_hour", price_gpu_hour),
        ):
            if v is not None and not 0 <= v < float("inf"):
                raise ValueError(f"{what} must be a finite number >= 0, not {v!r}")
        if not 0 < idle_stop_minutes < float("inf"):
            raise ValueError(f"idle_stop_minutes must be a positive number, not {idle_stop_minutes!r}")
        _connected(address, say)
        prices = None
        if price_cpu_hour is None and price_gpu_hour is None:
            prices = catalog_prices(current_cluster())
        settings = {
            "quota_cpus": quota_cpus,
            "quota_gpus": quota_gpus,
            "budget_usd": budget_usd,
            "price_cpu_hour": prices.cpu_hour if prices else (price_cpu_hour or 0.0),
            "price_gpu_hour": prices.gpu_hour if prices else (price_gpu_hour or 0.0),
            "price_source": prices.source if prices else "set by the teacher",
            "idle_stop_minutes": idle_stop_minutes,
            "heartbeat_s": heartbeat_s,
            "tick_s": tick_s,
        }
        try:
            broker = find_broker(name)
        except WorkshopError:
            broker = None
        if broker is not None:
            ray.get(broker.configure.remote(settings), timeout=30)
            say(f"workshop {name!r} was already running: its settings are now these")
        else:
            runtime_env, _ = prepare_for_workers(None, _package_check.with_package(None, True, say), say)
            opts: dict[str, Any] = {
                "name": BROKER_NAME,
                "namespace": namespace_of(name),
                "lifetime": "detached",  # outlives the teacher's kernel
                "num_cpus": 0,  # fits on the smallest machine, never takes a student's CPU
                "max_concurrency": 8,  # students' calls and the teacher's at once (each is short)
            }
            if runtime_env:
                opts["runtime_env"] = runtime_env
            actor_class: Any = ray.remote(Broker)
            broker = actor_class.options(**opts).remote(name, settings)
            ray.get(broker.ping.remote(), timeout=120)
        ws = cls(name, broker)
        _registry.workshops.add(ws)
        gcs = ray.get_runtime_context().gcs_address
        say(f"workshop {name!r} ready: {ws.rules_text()}")
        say(f"students run: %gpu_cluster start --address {gcs} --workshop {name} --student THEIR_ID")
        return ws

    @classmethod
    def connect(cls, name: str, address: str | None = None) -> Workshop:
        """The running workshop ``name`` (its broker outlives the kernel that started it)."""
        check_id(name, "workshop name")
        _connected(address, lambda msg: None)
        ws = cls(name, find_broker(name))
        _registry.workshops.add(ws)
        return ws

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return ray.get(getattr(self.broker, method).remote(*args), timeout=30)
        except ray.exceptions.RayActorError:
            raise WorkshopError(f"the broker of workshop {self.name!r} is gone") from None

    def settings(self) -> dict[str, Any]:
        """The workshop's rules as the broker has them."""
        return dict(self._call("get_settings"))

    def rules_text(self) -> str:
        s = self.settings()
        prices = Prices(s["price_cpu_hour"], s["price_gpu_hour"], s["price_source"])
        budget = f"budget ${s['budget_usd']:g} per student" if s["budget_usd"] is not None else "no budget"
        return (
            f"quota {Quota(s['quota_cpus'], s['quota_gpus']).text()}, {budget}, {prices.text()}, idle stop "
            f"{s['idle_stop_minutes']:g} min"
        )

    def students(self) -> StudentsReport:
        """Every student: workers, what they hold, utilisation, cost, kernel and state."""
        recs = self._call("students")
        return StudentsReport(self.name, self.rules_text(), [StudentInfo.from_record(r) for r in recs])

    def student(self, student: str) -> StudentInfo:
        for s in self.students().students:
            if s.student == student:
                return s
        raise KeyError(f"no student {student!r} in workshop {self.name!r}")

    def stop_student(self, student: str, why: str = "stopped by the teacher") -> str:
        """Stop one student's workers: their kernel is told (a running cell ends as "cluster stopped"), and
        the broker ends the workers within a few heartbeats whatever the kernel does."""
        import ray

        try:
            return str(ray.get(self.broker.stop_student.remote(student, why), timeout=30))
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, KeyError):
                raise WorkshopError(str(cause.args[0])) from None
            raise

    def stop_all(self, why: str = "stopped by the teacher") -> list[str]:
        """Stop every student's workers."""
        return list(self._call("stop_all", why))

    def stop(self) -> str:
        """End every student's workers now, then the broker itself: the workshop is over."""
        import ray

        ended = self._call("shutdown", "the workshop ended")
        ray.kill(self.broker, no_restart=True)
        _registry.workshops.remove_if(lambda w: w.name == self.name)
        return f"workshop {self.name!r} ended: {ended} student group(s) stopped"

    def wait_until(self, student: str, states: tuple[str, ...], timeout: float = 60.0) -> StudentInfo:
        """Wait until ``student`` is in one of ``states`` (a test, or a teacher's script); returns it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = self.student(student)
                if info.state in states:
                    return info
            except KeyError:
                info = None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"student {student!r} did not reach {states} in {timeout:g} s (now: {info})"
                )
            time.sleep(0.2)


def _connected(address: str | None, say: Progress) -> None:
    """This kernel connected to the workshop's Ray cluster: the one it is connected to, or ``address``."""
    import ray

    if ray.is_initialized() and address is None:
        return
    if address is None and _connect.address_from_env() is None:
        raise WorkshopError(
            "a workshop runs on a Ray cluster the students can reach: give --address HOST:PORT (e.g. after "
            "`ray start --head` on the big machine), or connect first with %gpu_cluster start --address ..."
        )
    _connect.connect(address or _connect.address_from_env(), progress=say)
