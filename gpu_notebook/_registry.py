"""Kernel-wide state: which clusters exist and which one is current, and what hangs off each cluster.

One process (a notebook kernel) holds one Ray connection, a few clusters and, per cluster, at most one shared
monitor, cost meter and policy watcher. That state lives here, at the bottom of the package, so the feature
packages can find it without importing each other: ``cost`` and ``monitor`` ask :func:`current_cluster` instead
of importing ``cluster``, and ``cost`` finds a cluster's monitor in :data:`monitors` instead of reading the
monitor package's internals.

The rest of what a kernel keeps lives here too, each as one typed field with a comment: its background cells,
its price catalog, the last cluster whose cost policies saw it stop, the cloud launcher's event listeners and the
teacher's workshops. Process plumbing that is no kernel state (a cached libc handle, a flag saying a signal
handler or a patch is installed, the state of a rank's own process) stays in the module that needs it.

Invariants:

* Every per-cluster map holds its cluster weakly (a cluster nobody references goes away with its entries)
  and its values strongly (a shared monitor stays alive as long as its cluster does).
* At interpreter exit, clusters are stopped (their workers, a local Ray we started, cloud nodes) before
  Ray's own exit hook runs, and every object registered with :func:`stop_at_exit` is told to stop.

This module imports nothing of ours: it is the bottom layer every package may ask.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from gpu_notebook.errors import GpuNotebookError

__all__ = [
    "LOCAL",
    "ClusterManager",
    "Items",
    "NoClusterError",
    "PerCluster",
    "RegisteredCluster",
    "Slot",
    "UnknownClusterError",
    "active_checkpointer",
    "background_cells",
    "before_kernel_shutdown",
    "catalog",
    "cost_meters",
    "current_cluster",
    "get_manager",
    "launcher_hooked",
    "launcher_listeners",
    "monitors",
    "panel_publisher",
    "policy_watchers",
    "ray_connection",
    "set_active_checkpointer",
    "stop_at_exit",
    "stopped_cost",
    "workshops",
]

_MISSING = object()


class NoClusterError(GpuNotebookError, LookupError):
    """No cluster is running, and the call needs one (the message says how to start one)."""


class UnknownClusterError(GpuNotebookError, KeyError):
    """No cluster has that name (the message lists the clusters there are)."""

    def __str__(self) -> str:  # KeyError's own str() quotes the message
        return str(self.args[0]) if self.args else ""


class RegisteredCluster(Protocol):
    """What the manager needs of a cluster: a name, its Ray connection, and a way to stop it."""

    name: str
    connection: Any

    def stop(self, reason: str = ...) -> str: ...


C = TypeVar("C", bound=RegisteredCluster)
T = TypeVar("T")


class ClusterManager(Generic[C]):
    """Maps names to clusters and knows the current one (what magics act on)."""

    def __init__(self) -> None:
        self._clusters: dict[str, C] = {}
        self._current: str | None = None
        self._lock = threading.RLock()
        #: ``fn(event, cluster)`` for each cluster added ("added") or removed ("removed"): the JupyterLab
        #: panel's publisher listens here, so the cluster layer need not know it exists
        self.listeners: builtins.list[Callable[[str, C], None]] = []

    def __repr__(self) -> str:
        return f"<ClusterManager {len(self._clusters)} cluster(s), current={self._current!r}>"

    @property
    def current(self) -> C | None:
        with self._lock:
            return self._clusters.get(self._current) if self._current else None

    def require_current(self, instead: str = "") -> C:
        """The current cluster; without one, :class:`NoClusterError` (``instead``: what else the caller can do)."""
        c = self.current
        if c is None:
            raise NoClusterError(
                "no cluster is running: start one with %gpu_cluster start (or Cluster(...).start())" + instead
            )
        return c

    def add(self, cluster: C) -> None:
        # Run our exit hook before Ray's own (registered by ray.init, later than ours): atexit is LIFO.
        atexit.unregister(self.stop_all)
        atexit.register(self.stop_all, "kernel exit")
        _hook_kernel_shutdown(self)
        with self._lock:
            self._clusters[cluster.name] = cluster
            self._current = cluster.name
        self._tell("added", cluster)

    def remove(self, cluster: C) -> None:
        with self._lock:
            if self._clusters.get(cluster.name) is cluster:
                del self._clusters[cluster.name]
            if self._current == cluster.name:
                self._current = next(reversed(self._clusters), None) if self._clusters else None
        self._tell("removed", cluster)

    def _tell(self, event: str, cluster: C) -> None:
        for fn in list(self.listeners):
            try:
                fn(event, cluster)
            except Exception as exc:  # noqa: BLE001 - a view must never fail a start or a stop
                print(f"gpu_notebook: {event} listener failed: {exc}", file=sys.stderr)

    def get(self, name: str, default: Any = _MISSING) -> Any:
        with self._lock:
            if name in self._clusters:
                return self._clusters[name]
        if default is _MISSING:
            raise UnknownClusterError(
                f"no cluster named {name!r}; clusters: {', '.join(self._clusters) or 'none'}"
            )
        return default

    def list(self) -> builtins.list[C]:
        with self._lock:
            return list(self._clusters.values())

    def use(self, name: str) -> C:
        with self._lock:
            cluster: C = self.get(name)
            self._current = name
            return cluster

    def unique_name(self, base: str) -> str:
        with self._lock:
            if base not in self._clusters:
                return base
            i = 2
            while f"{base}-{i}" in self._clusters:
                i += 1
            return f"{base}-{i}"

    def others_on_connection(self, cluster: C) -> bool:
        """Whether another running cluster shares this cluster's Ray connection."""
        with self._lock:
            return any(
                c is not cluster and c.connection is cluster.connection for c in self._clusters.values()
            )

    def kernel_shutdown(self) -> builtins.list[str]:
        """Stop every cluster as at kernel exit, when the Jupyter kernel is asked to shut down or restart.

        ipykernel answers that request by signalling each child process of the kernel, SIGTERM and then SIGKILL,
        and retrying for up to 4.4 s while any is left. A local Ray's processes (its GCS, raylet and workers) are
        such children, some outlive the SIGTERMs, and the dead ones stay unreaped zombies that still count. So
        the kernel is still alive when jupyter_client sends it SIGTERM (2.5 s) and SIGKILL (5 s). It dies
        killed before any ``atexit`` hook (this manager's :meth:`stop_all` among them) runs, and Ray's crash
        report lands in the server's log. Stopped first (a local Ray's processes all get their SIGTERM together
        and are reaped: see :data:`before_kernel_shutdown`), the clusters leave no children, and the kernel exits
        at once.
        """

        def stop(c: C) -> str:
            own = getattr(c, "kernel_shutdown", None)
            return str(own()) if callable(own) else c.stop("kernel exit")

        return self._stop_each(stop)

    def stop_all(self, reason: str = "kernel exit") -> builtins.list[str]:
        return self._stop_each(lambda c: c.stop(reason))

    def _stop_each(self, stop: Callable[[C], str]) -> builtins.list[str]:
        out = []
        for c in self.list():
            try:
                out.append(stop(c))
            except Exception as exc:  # noqa: BLE001 - one cluster failing to stop must not keep the others running
                out.append(f"cluster {c.name!r}: stop failed: {exc}")
        return out


_MANAGER: ClusterManager[Any] | None = None
_HOOKED_KERNELS: weakref.WeakSet[Any] = weakref.WeakSet()


def _hook_kernel_shutdown(manager: ClusterManager[Any]) -> None:
    """In a Jupyter kernel (ipykernel), run :meth:`ClusterManager.kernel_shutdown` when the kernel is asked to
    shut down or restart, before ipykernel ends its child processes. ``Kernel.do_shutdown`` is ipykernel's
    documented place for that; it is wrapped on the kernel instance, once. Outside a kernel, nothing."""
    ipython = sys.modules.get("IPython")  # not imported: not in a kernel
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    original = getattr(kernel, "do_shutdown", None)
    if kernel is None or original is None or kernel in _HOOKED_KERNELS:
        return

    def do_shutdown(restart: bool, *args: Any, **kwargs: Any) -> Any:
        for prepare in before_kernel_shutdown.items():
            try:
                prepare()
            except Exception:  # noqa: BLE001 - the kernel must shut down whatever a preparation does
                pass
        try:
            manager.kernel_shutdown()
        except Exception:  # noqa: BLE001 - the kernel must shut down whatever our clusters do
            pass
        # a Ray this kernel started itself (``ray.init()`` before ``%gpu_cluster start``, which then used it) is
        # not ours to stop, but its processes are the kernel's children all the same: shut it down as Ray's own
        # exit hook would, before ipykernel signals them
        ray = sys.modules.get("ray")
        try:
            if ray is not None and ray.is_initialized():
                ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
        # The process ends now: what the collector would free at exit needs no freeing. Left alone, IPython's
        # exit hook and the interpreter's finalization walk the whole heap (torch, Ray: about 1 s on a 2-core
        # machine, longer under load) while jupyter_client's SIGTERM comes 2.5 s after the request.
        gc.freeze()
        return original(restart, *args, **kwargs)

    kernel.do_shutdown = do_shutdown
    _HOOKED_KERNELS.add(kernel)


def get_manager() -> ClusterManager[Any]:
    """The kernel's cluster manager (created on first use; stops our clusters at exit)."""
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = ClusterManager()
        atexit.register(_MANAGER.stop_all, "kernel exit")
    return _MANAGER


def current_cluster() -> Any:
    """The current cluster (what ``%gpu_cluster use`` picked, else the last one started), or None."""
    return get_manager().current


class _Local:
    """The key of what belongs to this machine rather than to a cluster (``Monitor.local()``)."""

    def __repr__(self) -> str:
        return "LOCAL"


#: The key for "this machine, no cluster" in a :class:`PerCluster` map.
LOCAL: Any = _Local()


class PerCluster(Generic[T]):
    """At most one ``T`` per cluster (or per :data:`LOCAL`); the cluster is held weakly, the value strongly."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()  # the items themselves: held only for a read or a write of them
        self._create = threading.RLock()

    def __repr__(self) -> str:
        return f"<PerCluster {self.what}: {len(self._items)}>"

    @property
    def lock(self) -> threading.RLock:
        """Held while a caller checks for a value and creates one, so two threads do not both create it. It is
        not the lock of :meth:`get`: a reader does not wait while a value is being made (a monitor's start takes
        seconds on a cloud cluster, and the panel's feed reads the running one every second)."""
        return self._create

    def get(self, cluster: Any) -> T | None:
        with self._lock:
            return self._items.get(cluster)

    def set(self, cluster: Any, value: T) -> T | None:
        """Make ``value`` the one of ``cluster``; returns the one it replaces (None if none)."""
        with self._lock:
            old = self._items.get(cluster)
            self._items[cluster] = value
            return old

    def pop(self, cluster: Any) -> T | None:
        with self._lock:
            return self._items.pop(cluster, None)

    def discard(self, cluster: Any, value: T) -> None:
        """Forget ``value`` if it is still the one of ``cluster`` (a newer one stays)."""
        with self._lock:
            if self._items.get(cluster) is value:
                del self._items[cluster]


#: The shared, started monitor of each cluster (and of :data:`LOCAL`): what ``monitor_for`` hands out.
monitors: PerCluster[Any] = PerCluster("monitors")
#: The cost meter of each cluster: what ``cost_meter_for`` hands out.
cost_meters: PerCluster[Any] = PerCluster("cost meters")
#: The budget / idle-stop watcher of each cluster: what ``attach_policies`` started.
policy_watchers: PerCluster[Any] = PerCluster("policy watchers")


class Slot(Generic[T]):
    """One value of a kind (or None), behind a lock."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._value: T | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"<Slot {self.what}: {'set' if self._value is not None else 'empty'}>"

    @property
    def lock(self) -> threading.RLock:
        """Held while a caller checks for a value and creates one, so two threads do not both create it."""
        return self._lock

    def get(self) -> T | None:
        with self._lock:
            return self._value

    def set(self, value: T | None) -> T | None:
        """Make ``value`` the one (None empties the slot); returns the one it replaces."""
        with self._lock:
            old, self._value = self._value, value
            return old


class Items(Generic[T]):
    """Items of a kind in the order they were added, oldest first, behind a lock."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: builtins.list[T] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Items {self.what}: {len(self._items)}>"

    def add(self, item: T, keep: int | None = None) -> None:
        """Append ``item``; with ``keep``, drop the oldest items beyond that many."""
        with self._lock:
            self._items.append(item)
            if keep is not None:
                del self._items[: max(0, len(self._items) - keep)]

    def remove(self, item: T) -> None:
        """Remove ``item`` (a :class:`ValueError` when it is not there, as ``list.remove``)."""
        with self._lock:
            self._items.remove(item)

    def remove_if(self, drop: Callable[[T], bool]) -> None:
        with self._lock:
            self._items[:] = [i for i in self._items if not drop(i)]

    def items(self) -> builtins.list[T]:
        """A copy, oldest first: safe to iterate while others add."""
        with self._lock:
            return list(self._items)

    def latest(self) -> T | None:
        with self._lock:
            return self._items[-1] if self._items else None


#: The kernel's Ray connection (``cluster._connect``): the Ray it started or borrowed, shared by its clusters.
ray_connection: Slot[Any] = Slot("Ray connection")
#: Every background cell of this kernel (``%%distributed --noblock``, ``Cluster.run(block=False)``), oldest
#: first: what ``%gpu_result NAME`` finds and what is cancelled at exit (the distributed package caps it).
background_cells: Items[Any] = Items("background cells")
#: (name, cost meter, reason) of the last cluster with cost policies that stopped: ``%gpu_cost status`` shows
#: its final figures once no cluster runs.
stopped_cost: Slot[tuple[str, Any, str]] = Slot("last stopped cluster's cost")
#: The kernel's price catalog (the shipped prices, a saved refresh merged in, the user's overrides on it): what
#: ``get_catalog`` hands out.
catalog: Slot[Any] = Slot("price catalog")
#: Who hears the cloud launcher's events now (one per ``launcher_events`` block in progress).
launcher_listeners: Items[Callable[[str, dict[str, Any]], None]] = Items("launcher listeners")
#: True once our dispatcher is registered with Ray's launcher event system (global, and it only grows: once per
#: process, whichever clusters come and go).
launcher_hooked: Slot[bool] = Slot("launcher event hook")
#: The JupyterLab panel's publisher of this kernel (``gpu_notebook.panel``), once a cluster started here.
panel_publisher: Slot[Any] = Slot("JupyterLab panel publisher")
#: What runs first when Jupyter asks the kernel to shut down or restart, before its clusters stop (in the order
#: added): the cluster package adds how a local Ray's processes end together, without the kernel waiting for each.
before_kernel_shutdown: Items[Callable[[], None]] = Items("preparations for a kernel shutdown")
#: The workshops this kernel's teacher started or connected to, the current one last: what
#: ``%gpu_cluster students`` shows without ``--workshop`` (a workshop, not a cluster: it is in no manager).
workshops: Items[Any] = Items("workshops")

#: On a rank of a detached cluster: the guard's notice that the cluster stops soon (``{"why", "deadline"}``), set
#: by the worker's control thread; a Checkpointer saves at its next ``maybe_save`` as on a spot notice.
stop_notice: Slot[dict[str, Any]] = Slot("guard's stop notice")

_active_checkpointer: weakref.ref[Any] | None = None


def set_active_checkpointer(checkpointer: Any) -> None:
    """Record the most recently created (or used) Checkpointer of this process (held weakly); None forgets it."""
    global _active_checkpointer
    _active_checkpointer = None if checkpointer is None else weakref.ref(checkpointer)


def active_checkpointer() -> Any:
    """The Checkpointer a budget stop waits for and names (the last one recorded), or None."""
    return _active_checkpointer() if _active_checkpointer is not None else None


_AT_EXIT: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()
_AT_EXIT_LOCK = threading.Lock()
_AT_EXIT_HOOKED = False


def stop_at_exit(obj: Any, stop: Callable[[Any], None]) -> None:
    """Call ``stop(obj)`` at interpreter exit if ``obj`` is still alive then (it is held weakly).

    ``stop`` should only signal (set an event): threads are daemons, and exit must not wait on a network.
    """
    global _AT_EXIT_HOOKED
    with _AT_EXIT_LOCK:
        _AT_EXIT[obj] = stop
        if not _AT_EXIT_HOOKED:
            # registered with the first object, not at import: atexit runs the later hooks first, so these
            # signals come before the exit hooks of whatever (Ray) was set up before that object existed
            atexit.register(_stop_registered)
            _AT_EXIT_HOOKED = True


def _stop_registered() -> None:
    with _AT_EXIT_LOCK:
        items = list(_AT_EXIT.items())
    for obj, stop in items:
        try:
            stop(obj)
        except Exception:  # noqa: BLE001 - at exit, one object failing to stop must not skip the others
            pass
