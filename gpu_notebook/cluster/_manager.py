"""Which clusters exist in this kernel, which one is current, and stopping ours when the kernel exits."""

from __future__ import annotations

import atexit
import builtins
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_notebook.cluster._cluster import Cluster

_MISSING = object()


class ClusterManager:
    """Maps names to clusters and knows the current one (what magics act on)."""

    def __init__(self) -> None:
        self._clusters: dict[str, Cluster] = {}
        self._current: str | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"<ClusterManager {len(self._clusters)} cluster(s), current={self._current!r}>"

    @property
    def current(self) -> Cluster | None:
        with self._lock:
            return self._clusters.get(self._current) if self._current else None

    def require_current(self) -> Cluster:
        c = self.current
        if c is None:
            raise LookupError(
                "no cluster is running: start one with %gpu_cluster start (or Cluster(...).start())"
            )
        return c

    def add(self, cluster: Cluster) -> None:
        # Run our exit hook before Ray's own (registered by ray.init, later than ours): atexit is LIFO.
        atexit.unregister(self.stop_all)
        atexit.register(self.stop_all, "kernel exit")
        with self._lock:
            self._clusters[cluster.name] = cluster
            self._current = cluster.name

    def remove(self, cluster: Cluster) -> None:
        with self._lock:
            if self._clusters.get(cluster.name) is cluster:
                del self._clusters[cluster.name]
            if self._current == cluster.name:
                self._current = next(reversed(self._clusters), None) if self._clusters else None

    def get(self, name: str, default: Any = _MISSING) -> Any:
        with self._lock:
            if name in self._clusters:
                return self._clusters[name]
        if default is _MISSING:
            raise KeyError(f"no cluster named {name!r}; clusters: {', '.join(self._clusters) or 'none'}")
        return default

    def list(self) -> builtins.list[Cluster]:
        with self._lock:
            return list(self._clusters.values())

    def use(self, name: str) -> Cluster:
        with self._lock:
            cluster = self.get(name)
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

    def others_on_connection(self, cluster: Cluster) -> bool:
        """Whether another running cluster shares this cluster's Ray connection."""
        with self._lock:
            return any(
                c is not cluster and c.connection is cluster.connection for c in self._clusters.values()
            )

    def stop_all(self, reason: str = "kernel exit") -> builtins.list[str]:
        out = []
        for c in self.list():
            try:
                out.append(c.stop(reason))
            except Exception as exc:  # noqa: BLE001
                out.append(f"cluster {c.name!r}: stop failed: {exc}")
        return out


_MANAGER: ClusterManager | None = None


def get_manager() -> ClusterManager:
    """The kernel's cluster manager (created on first use; stops our clusters at exit)."""
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = ClusterManager()
        atexit.register(_MANAGER.stop_all, "kernel exit")
    return _MANAGER
