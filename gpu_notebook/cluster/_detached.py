"""Detached clusters: workers (and a local cluster's Ray) that outlive the kernel, and attaching to them later.

``Cluster(detach=True)`` (``%gpu_cluster start --detach``) makes a :class:`DetachedCluster`. What differs from
a plain cluster:

- **its Ray**: a local one is started as a daemon of its own (``ray start --head --block`` in a new session,
  not ``ray.init`` inside the kernel, whose Ray dies with it) and the kernel connects to it by address; one
  reached by ``--address`` is as it was;
- **its workers** are detached, named actors in the cluster's Ray namespace, in a detached placement group,
  so they live on when the kernel exits or is killed, with their variables, models and process group;
- **its keeper** (:mod:`._keeper`), a small detached actor beside them, holds the group's record, who drives
  it, the running cell and the guards (idle stop, budget) that stop it when no kernel is attached;
- **its stop**: at the kernel's exit the workers are left to the keeper (the kernel only lets go); an explicit
  ``stop`` (from any kernel attached to it) ends the workers, the keeper and a local cluster's Ray daemon.

:func:`attach` (``%gpu_cluster attach``) re-binds the workers from any kernel that reaches the cluster: the
local daemons started on this machine are found by their record file (:func:`records`), others by
``address``. A cell that ran when the old kernel went is followed as a background cell (``%gpu_result``).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_notebook import _settings, cost
from gpu_notebook._display import Progress, fmt_duration
from gpu_notebook._registry import get_manager
from gpu_notebook.cluster import _connect, _detached_cloud
from gpu_notebook.cluster._cluster import Cluster
from gpu_notebook.cluster._daemon import record_path, records, start_daemon
from gpu_notebook.cluster._errors import ClusterError
from gpu_notebook.cluster._keeper import KEEPER_NAME, NAMESPACE_PREFIX, Keeper, kill_tree, namespace_of
from gpu_notebook.cluster._records import group_record, record_of
from gpu_notebook.cluster._run import run_following
from gpu_notebook.cluster._status import ClusterStatus
from gpu_notebook.cluster.providers import LocalProvider, Provider
from gpu_notebook.distributed import BackgroundCell, RayPlacement, WorkerGroup

__all__ = ["DetachedCluster", "attach_cluster", "attachable", "records"]

#: the reason the kernel's exit hook gives its clusters' stop (see gpu_notebook._registry)
KERNEL_EXIT = "kernel exit"
#: seconds between the holder's heartbeats to the keeper
HEARTBEAT_S = 5.0

_LOCAL = LocalProvider()


def _ray() -> Any:
    import ray

    return ray


# ---- the cluster -------------------------------------------------------------------------------------------
def _who(cloud_state: Any = None) -> dict[str, Any]:
    """This kernel, as the keeper names it to another one; ``tears_down``: it has the cloud cluster's saved
    state, so it tears the cluster down itself when the guards fire while it holds it."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "notebook": os.environ.get("JPY_SESSION_NAME", ""),
        "tears_down": cloud_state is not None,
    }


class DetachedCluster(Cluster):
    """A cluster whose workers outlive the kernel (see the module docstring); made by ``Cluster(detach=True)``."""

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.keeper: Any = None
        self.daemon_pid: int | None = None
        self._job_id = ""
        self._beat: threading.Thread | None = None
        self._beat_stop = threading.Event()
        #: the cell the workers ran for a kernel that is gone, followed here after an attach (None: none)
        self.following: BackgroundCell | None = None

    @property
    def provider(self) -> Provider:
        if self.daemon_pid is not None:
            return _LOCAL
        return self._cloud if self._cloud is not None else super().provider  # (a cloud one attached by name)

    @property
    def namespace(self) -> str:
        return namespace_of(self.name)

    def start(self, progress: Progress | None = None) -> DetachedCluster:
        """Start the Ray daemon (a local cluster), the detached workers and their keeper."""
        if self.state == "running":
            return self
        policies, cloud = self.settings.policies, self.settings.launch.cloud
        if cloud:
            _detached_cloud.check_start(cloud, policies.budget, policies.idle_stop)
        say = progress or (lambda msg: None)
        if not self.name:
            self.name = get_manager().unique_name("detached")
        _check_name(self.name)
        if self.address is None and not cloud:
            self.address, self.daemon_pid = start_daemon(self.name, say, self.settings.runtime.dashboard)
            use_token_auth()
        try:
            super().start(progress)
            self._make_keeper()
            if cloud:
                guards = _detached_cloud.guards_text(policies.budget, policies.idle_stop)
                _detached_cloud.hand_over(self.name, guards, say)
        except BaseException:
            if cloud and self.state == "running":  # launched, but not detached: torn down, not left billing
                Cluster.stop(self, "its detached start failed")
            self._end_daemon()
            raise
        self._start_beat()
        say(self.detached_text())
        return self

    def detached_text(self) -> str:
        what = "its local Ray daemon and " if self.daemon_pid else ""
        if self.settings.launch.cloud:
            rate = self._rate()
            what = f"its {self.settings.launch.cloud} nodes" + (f" (${rate:.2f}/h)" if rate else "") + " and "
        guards = (
            self._policy_text() if self.settings.policies.idle_stop or self.settings.policies.budget else ""
        )
        return (
            f"detached: {what}its {self.world_size} worker(s) keep running when this kernel goes "
            f"(%gpu_cluster attach {self.name} from any kernel brings them back, variables and all). They "
            f"{'bill' if self.settings.launch.cloud else 'hold their CPUs/GPUs'} until %gpu_cluster stop {self.name}"
            + (f"; {guards.replace('watching: ', 'guards: ')}" if guards else "; no idle stop or budget set")
        )

    def _new_group(self, workers: int, **kwargs: Any) -> WorkerGroup:
        env = {**(kwargs.pop("env", None) or {}), _settings.GUARDED_VAR: "1"}
        return WorkerGroup(workers, placement=RayPlacement(self.namespace), env=env, **kwargs)

    def _make_keeper(self) -> None:
        ray = _ray()
        policies = self.settings.policies
        info = {
            "name": self.name,
            "kind": self.kind,
            "address": self.address,
            "idle_stop_minutes": policies.idle_stop,
            "budget_usd": policies.budget,
            "usd_per_hour": self._rate(),
            "checkpoint_timeout_s": policies.budget_checkpoint_timeout_s,
            "daemon_pid": self.daemon_pid,
            "tick_s": 2.0,
        }
        cloud = self.settings.launch.cloud
        info.update(_detached_cloud.keeper_info(cloud) if cloud else {})
        remote = ray.remote(num_cpus=0, max_restarts=0)(Keeper)
        self.keeper = remote.options(
            name=KEEPER_NAME,
            namespace=self.namespace,
            lifetime="detached",
            **(_detached_cloud.KEEPER_OPTIONS if cloud else {}),
        ).remote(info)
        self._job_id = ray.get_runtime_context().get_job_id()
        reply = ray.get(self.keeper.hold.remote(self._job_id, _who(self.cloud_state)), timeout=60)
        assert reply.get("ok"), reply
        self._record_group()

    def _record_group(self) -> None:
        """The keeper keeps the group's record, and each rank writes its output to log files on its node too."""
        assert self.group is not None
        ray = _ray()
        rec = {**record_of(self.group, self.namespace), "pg": self.group.placement.reservation}
        ray.get(self.keeper.set_group.remote(self._job_id, rec), timeout=30)
        dest = self.settings.runtime.log_to
        ray.get([w.actor.open_log.remote(self.name, dest) for w in self.group.workers], timeout=60)

    def logs(self, rank: int | None = None, tail: int | None = 50) -> dict[int, list[str]]:
        """Each rank's recent output from its log files on its node: also what it printed before this kernel
        attached (see :meth:`Cluster.logs` for the arguments)."""
        got = super().logs(rank, tail)  # checks rank and tail; the lines this kernel saw
        if self.group is None or not self.running:
            return got
        ray = _ray()
        workers = {w.rank: w for w in self.group.workers}
        refs = {r: workers[r].actor.log_tail.remote(tail) for r in got if r in workers}
        for r, ref in refs.items():
            try:
                lines = ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - a rank that does not answer: the lines this kernel saw
                continue
            if lines:
                got[r] = lines
        return got

    def _rate(self) -> float | None:
        """The hourly rate for the keeper's budget; None (the keeper keeps the rate it has) when this kernel
        cannot price the nodes (no node_pricing here: a kernel that attached)."""
        if self.node_pricing is None:
            return None
        try:
            return float(cost.cost_meter_for(self).snapshot().usd_per_hour or 0.0)
        except Exception:  # noqa: BLE001 - a meter that cannot price the nodes: the keeper's rate stands
            return None

    # ---- the heartbeat -----------------------------------------------------------------------------------
    def _start_beat(self) -> None:
        self._beat_stop.clear()
        self._beat = threading.Thread(target=self._beat_loop, daemon=True, name="gpu_notebook-keeper-beat")
        self._beat.start()

    def _beat_loop(self) -> None:
        ray = _ray()
        while not self._beat_stop.wait(HEARTBEAT_S):
            try:
                reply = ray.get(
                    self.keeper.heartbeat.remote(self._job_id, self.busy, self.last_activity, self._rate()),
                    timeout=10,
                )
            except Exception:  # noqa: BLE001 - a missed beat is retried at the next one
                continue
            if reply.get("taken") is not None:
                who = _holder_text(reply["taken"])
                print(f"gpu_notebook: cluster {self.name!r} was taken over by {who}", file=sys.stderr)
                self._let_go(f"taken over by {who}")
                return
            if reply.get("stop"):
                print(f"gpu_notebook: cluster {self.name!r} stopped: {reply['stop']}", file=sys.stderr)
                self._beat_stop.set()
                if self.cloud_state is not None:  # this kernel tears it down (the reaper finishes if it dies)
                    _detached_cloud.hand_over(self.name, None, lambda m: None)
                super().stop(str(reply["stop"]))
                return

    # ---- running code: the keeper knows the cell -------------------------------------------------------------
    def run(self, code: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """As :meth:`Cluster.run`; the keeper is told the cell (what a kernel attaching later follows)."""
        ray = _ray()
        label = kwargs.get("label") or f"distributed-cell-{self._cell_counter + 1}"
        kwargs["label"] = label
        meta = {
            "label": label,
            "name": kwargs.get("name") or str(self._cell_counter + 1),
            "code": code[:2000],
        }
        ray.get(self.keeper.cell_started.remote(self._job_id, meta), timeout=10)
        if kwargs.get("block", True) is False:
            done = kwargs.get("on_done")

            def on_done(cell: BackgroundCell) -> None:
                self._cell_ended()
                if done is not None:
                    done(cell)

            kwargs["on_done"] = on_done
            return super().run(code, *args, **kwargs)
        try:
            return super().run(code, *args, **kwargs)
        finally:
            self._cell_ended()

    def note_cell(self, name: str, **meta: Any) -> None:
        """More about the cell ``name`` for a kernel that attaches later (``out``: its ``-o`` variable)."""
        _ray().get(self.keeper.cell_note.remote(self._job_id, name, meta), timeout=10)

    def _cell_ended(self) -> None:
        try:
            _ray().get(self.keeper.cell_ended.remote(self._job_id), timeout=10)
        except Exception:  # noqa: BLE001 - the keeper then learns it from the workers
            pass

    def status(self) -> ClusterStatus:
        """As :meth:`Cluster.status`, with who holds the workers, the guards and the cost so far (the keeper's)."""
        st = super().status()
        try:
            d = _ray().get(self.keeper.describe.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the keeper does not answer: say so
            st.detached = "its keeper does not answer (the cluster may be stopping)"
            return st
        held = "this kernel" if (d.get("holder") or {}).get("job_id") == self._job_id else "another kernel"
        guards = [f"idle stop {d['idle_stop_minutes']:g} min"] if d.get("idle_stop_minutes") else []
        guards += [f"budget ${d['budget_usd']:g}"] if d.get("budget_usd") else []
        st.detached = (
            f"held by {held}; the workers outlive it ({'its Ray daemon pid ' + str(d['daemon_pid']) if d.get('daemon_pid') else 'on the Ray at ' + str(d.get('address'))}); "
            f"guards: {', '.join(guards) or 'none'}; ${d.get('spent_usd', 0.0):.2f} so far"
        )
        return st

    def scale(self, workers: int, progress: Progress | None = None) -> str:
        msg = super().scale(workers, progress)
        self._record_group()
        return msg

    def restart(self, progress: Progress | None = None) -> str:
        msg = super().restart(progress)
        self._record_group()
        return msg

    # ---- stopping -----------------------------------------------------------------------------------------
    def stop(self, reason: str = "stopped by the user") -> str:
        """End the workers, the keeper and a local cluster's Ray daemon; at the kernel's exit only let go."""
        if self.state != "running":
            return super().stop(reason)
        if reason == KERNEL_EXIT:
            return self._let_go(reason)
        self._beat_stop.set()
        here = self.cloud_state is not None  # a cloud cluster this kernel can tear down (and verify) itself
        if here:
            _detached_cloud.hand_over(self.name, None, lambda m: None)
        if self.group is not None:
            self.group.stop(reason)  # a running cell ends as "cluster stopped"
        try:
            _ray().get(self.keeper.stop.remote(reason, not here), timeout=60)
        except Exception:  # noqa: BLE001 - the keeper gone: its workers were ended above
            pass
        n = self.world_size
        msg = super().stop(reason)
        if self._cloud is not None and not here:
            return (
                f"cluster {self.name!r} stopped: {n} worker(s) ended; its head tears the cloud cluster down "
                f"(no saved state of it on this machine to verify that with: check your cloud console)"
            )
        if self.daemon_pid is None:
            return msg
        self._end_daemon()
        return f"cluster {self.name!r} stopped: {n} worker(s) ended, its Ray daemon shut down"

    def kernel_shutdown(self) -> str:
        return self._let_go(KERNEL_EXIT)

    @classmethod
    def attach(cls, name: str, **kwargs: Any) -> DetachedCluster:  # type: ignore[override]
        """See :func:`attach_cluster`."""
        return attach_cluster(name, **kwargs)

    def _let_go(self, why: str) -> str:
        """Leave the workers running for the next kernel: tell the keeper, forget them here, disconnect."""
        self._beat_stop.set()
        n = self.world_size
        if self.keeper is not None:
            try:
                _ray().get(self.keeper.release.remote(self._job_id, why), timeout=10)
            except Exception:  # noqa: BLE001 - at exit: the keeper sees the job end all the same
                pass
        if self.group is not None:
            self.group.detach()
            self.group = None
        if (
            self._cloud is not None
        ):  # nothing torn down here; the reaper sees the hand-over at the kernel's end
            self._cloud.reaper = self._cloud.state = None
        super().stop(why)
        return (
            f"cluster {self.name!r} detached: its {n} worker(s) keep running (%gpu_cluster attach {self.name} "
            f"from any kernel)"
        )

    def _end_daemon(self) -> None:
        if self.daemon_pid is not None:
            kill_tree(self.daemon_pid)
            record_path(self.name).unlink(missing_ok=True)


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or len(name) > 60:
        raise ValueError(
            f"a detached cluster's name is 1-60 letters, digits, '-', '_' and '.', not {name!r} (it names its Ray "
            f"namespace and record file)"
        )


def _holder_text(h: dict[str, Any]) -> str:
    if not h:
        return "another kernel"
    nb = f", notebook {h['notebook']}" if h.get("notebook") else ""
    since = time.strftime("%H:%M:%S", time.localtime(h["since"])) if h.get("since") else "?"
    return f"kernel pid {h.get('pid', '?')} on {h.get('host', '?')}{nb} (since {since})"


# ---- attaching -------------------------------------------------------------------------------------------------
class Attachable(list[dict[str, Any]]):
    """What :func:`attachable` found: one dict per detached cluster (the keeper's description)."""

    def __repr__(self) -> str:
        if not self:
            return (
                "no detached cluster found (this machine's local ones, or the Ray cluster at --address); start one "
                "with %gpu_cluster start --detach"
            )
        rows = ["detached clusters you can attach to (%gpu_cluster attach NAME):"]
        for d in self:
            h = d.get("holder") or {}
            held = "no kernel" if not h else ("held by " if h.get("alive") else "was held by ")
            held += _holder_text(h) if h else ""
            cell = d.get("cell") or {}
            running = ""
            if cell and cell.get("ended") is None:
                running = f", cell {cell.get('name')} running for {fmt_duration(d['now'] - cell['started'])}"
            rows.append(
                f"  {d['name']:<16} {d.get('kind', '?'):<7} {d.get('size') or '?'} worker(s), up "
                f"{fmt_duration(d['now'] - d['created'])}, ${d.get('spent_usd', 0.0):.2f} so far, {held}{running}"
            )
        return "\n".join(rows)


def _keepers(address: str | None) -> list[tuple[str, str, Any]]:
    """(name, address, keeper handle) of every detached cluster on the connected Ray."""
    ray = _ray()
    out = []
    for a in ray.util.list_named_actors(all_namespaces=True):
        ns = str(a.get("namespace", ""))
        if a.get("name") == KEEPER_NAME and ns.startswith(NAMESPACE_PREFIX):
            out.append((ns[len(NAMESPACE_PREFIX) :], address or "", ray.get_actor(KEEPER_NAME, namespace=ns)))
    return out


def use_token_auth() -> None:
    """Send Ray's token (``~/.ray/auth_token``) when connecting: ``ray start`` turns token authentication on
    (the daemon listens on the node's IP), and ``ray.init`` with an explicit address sends it only in token
    mode. Left to the user when ``RAY_AUTH_MODE`` is set."""
    if "RAY_AUTH_MODE" in os.environ or not (Path.home() / ".ray" / "auth_token").exists():
        return
    try:  # what ray.init does for a local cluster: the mode, and Ray's cached config refreshed to see it
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()
    except Exception:  # noqa: BLE001 - a Ray without it: the variable alone (read when Ray's config loads)
        os.environ["RAY_AUTH_MODE"] = "token"


def _connect_to(address: str, say: Progress) -> None:
    use_token_auth()
    conn = _connect.current_connection()
    if conn is not None and conn.address == address:
        return
    if conn is not None:
        raise ClusterError(
            f"this kernel is connected to the Ray at {conn.address}; the cluster is at {address}: attach from a "
            f"fresh kernel, or stop this kernel's clusters first"
        )
    _connect.connect(address, progress=say)


def attachable(address: str | None = None, progress: Progress | None = None) -> Attachable:
    """Every detached cluster this kernel can attach to: this machine's local ones, or those on ``address``."""
    say = progress or (lambda msg: None)
    ray = _ray()
    found = Attachable()
    targets = [address] if address else [r["address"] for r in records()]
    for addr in targets:
        _connect_to(addr, say)
        for _, _, keeper in _keepers(addr):
            try:
                found.append(ray.get(keeper.describe.remote(), timeout=10))
            except Exception:  # noqa: BLE001 - a keeper that does not answer is not attachable
                continue
        if not address and len(targets) > 1 and not get_manager().list():
            _connect.disconnect()  # the next local daemon has its own address
    return found


def attach_cluster(
    name: str,
    address: str | None = None,
    take: bool = False,
    progress: Progress | None = None,
    live: bool = False,
    bind: Callable[[BackgroundCell, str | None], None] | None = None,
) -> DetachedCluster:
    """Re-bind detached cluster ``name``'s workers with their state in this kernel (see the module docstring).

    Raises
    ------
    ClusterError
        No such cluster; another live kernel holds it (named; ``take=True`` takes it over); it is stopping.
    """
    say = progress or (lambda msg: None)
    ray = _ray()
    on_cloud = None
    if address is None:
        local = {r["name"]: r for r in records()}
        if name in local:
            address = str(local[name]["address"])
        elif (found := _detached_cloud.find(name, say)) is not None:
            address, on_cloud = found
        else:
            known = ", ".join(sorted(local)) or "none"
            raise ClusterError(
                f"no detached cluster {name!r} on this machine (local ones: {known}; nor a cloud cluster of that "
                f"name in %gpu_cluster list); for one elsewhere give --address HOST:PORT"
            )
    _connect_to(address, say)
    try:
        keeper = ray.get_actor(KEEPER_NAME, namespace=namespace_of(name))
    except ValueError:
        there = ", ".join(n for n, _, _ in _keepers(address)) or "none"
        raise ClusterError(f"no detached cluster {name!r} on the Ray at {address} (there: {there})") from None
    job_id = ray.get_runtime_context().get_job_id()
    reply = ray.get(keeper.hold.remote(job_id, _who(on_cloud and on_cloud.state), take), timeout=30)
    if "held_by" in reply:
        raise ClusterError(
            f"cluster {name!r} is held by {_holder_text(reply['held_by'])}: stop using it there first, or take it "
            f"over with %gpu_cluster attach {name} --take (that kernel then lets go of it)"
        )
    if "error" in reply:
        raise ClusterError(f"cluster {name!r}: {reply['error']}")
    info, rec = reply["info"], reply["group"]
    if rec is None:
        raise ClusterError(f"cluster {name!r} has no worker group recorded (its start did not finish)")
    c = DetachedCluster(name, address=address)
    c.keeper, c._job_id = keeper, job_id
    c.daemon_pid, c._cloud = info.get("daemon_pid"), on_cloud
    c.connection = _connect.recorded_connection()
    c.group = WorkerGroup(
        int(rec["size"]), placement=RayPlacement(c.namespace), log=c.log, timeouts=c.timeouts
    )
    c.group.adopt(group_record(rec, rec.get("pg")))
    c.settings = _with_policies(c.settings, info)
    c.state, c.started_at = "running", float(rec.get("started_at") or time.time())
    c.touch()
    if (
        on_cloud is not None
    ):  # the cost meter prices its nodes (the budget's rate) as the launching kernel did
        on_cloud.launched(c, say)
    get_manager().add(c)
    c._start_beat()
    say(
        f"attached to cluster {name!r}: {c.world_size} worker(s), up {fmt_duration(time.time() - info['created'])},"
        f" ${info.get('spent_usd', 0.0):.2f} so far; the workers kept their variables"
    )
    cell = reply.get("cell")
    if cell:
        c.following = _follow(c, cell, say, live, bind)
    return c


def _with_policies(settings: Any, info: dict[str, Any]) -> Any:
    from dataclasses import replace

    policies = replace(
        settings.policies, idle_stop=info.get("idle_stop_minutes"), budget=info.get("budget_usd")
    )
    return replace(settings, policies=policies)


def _follow(
    c: DetachedCluster,
    cell: dict[str, Any],
    say: Progress,
    live: bool,
    bind: Callable[[BackgroundCell, str | None], None] | None,
) -> BackgroundCell | None:
    """The cell the workers ran for the gone kernel, as a background cell of this one (``%gpu_result``)."""
    assert c.group is not None
    states = _ray().get([w.actor.cell_state.remote() for w in c.group.workers], timeout=30)
    if not any(s is not None and s.get("label") == cell["label"] for s in states):
        return None
    running = any(s is not None and s.get("ended") is None for s in states)

    def done(bg: BackgroundCell) -> None:
        c._cell_ended()
        if bind is not None:  # a magic's -o NAME, as if the cell had been started in this kernel
            bind(bg, cell.get("out"))

    bg = run_following(c, cell["label"], name=str(cell.get("name") or "1"), live=live, on_done=done)
    if not running:  # its replies wait: collected now, or the next cell would be refused as queued behind it
        bg.wait(30)
    say(
        f"cell {bg.name} {'is still running' if running else 'ended while no kernel was attached'}: "
        f"%gpu_result {bg.name} shows its output since and its value"
    )
    return bg


Cluster.variants["detach"] = DetachedCluster
