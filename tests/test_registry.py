"""gpu_notebook._registry: the kernel's clusters and what hangs off each one, held so that nothing leaks."""

from __future__ import annotations

import gc
import sys
import types
import weakref

import pytest

from gpu_notebook import _registry


class FakeCluster:
    def __init__(self, name: str) -> None:
        self.name = name
        self.connection = object()
        self.stopped: list[str] = []

    def stop(self, reason: str = "stopped by the user") -> str:
        self.stopped.append(reason)
        return f"cluster {self.name!r} stopped"


def test_the_manager_knows_the_current_cluster_and_falls_back_to_the_last_one() -> None:
    m: _registry.ClusterManager[FakeCluster] = _registry.ClusterManager()
    a, b = FakeCluster("a"), FakeCluster("b")
    m.add(a)
    m.add(b)
    assert m.current is b and m.unique_name("a") == "a-2"
    m.use("a")
    assert m.current is a
    m.remove(a)
    assert m.current is b and m.list() == [b]
    assert m.stop_all("kernel exit") == ["cluster 'b' stopped"] and b.stopped == ["kernel exit"]


def test_per_cluster_entries_go_with_their_cluster() -> None:
    per: _registry.PerCluster[list[int]] = _registry.PerCluster("test")
    c = FakeCluster("c")
    value = [1]
    assert per.set(c, value) is None and per.get(c) is value
    per.discard(c, [1])  # an equal but other value stays
    assert per.get(c) is value
    del c
    gc.collect()
    assert per.get(_registry.LOCAL) is None and "0" in repr(per)


def test_stop_at_exit_signals_live_objects_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # a private table: the real one holds this test session's monitors
    monkeypatch.setattr(_registry, "_AT_EXIT", weakref.WeakKeyDictionary())
    seen: list[object] = []

    class Thing:
        pass

    kept, dropped = Thing(), Thing()
    _registry.stop_at_exit(kept, seen.append)
    _registry.stop_at_exit(dropped, seen.append)
    del dropped
    gc.collect()
    _registry._stop_registered()
    assert seen == [kept]


def test_the_active_checkpointer_is_held_weakly() -> None:
    class Ckpt:
        pass

    ckpt = Ckpt()
    _registry.set_active_checkpointer(ckpt)
    assert _registry.active_checkpointer() is ckpt
    del ckpt
    gc.collect()
    assert not isinstance(_registry.active_checkpointer(), Ckpt)


class FakeKernel:
    """ipykernel's ``IPythonKernel.do_shutdown``, as the shutdown request calls it."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def do_shutdown(self, restart: bool) -> dict[str, object]:
        self.calls.append(restart)
        return {"status": "ok", "restart": restart}


def test_a_kernel_shutdown_request_stops_the_clusters_before_the_kernel_s_own_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clusters stop first (each its own way: a cloud one hands over to its reaper); the kernel's own
    ``do_shutdown`` still runs, with its argument and reply, and is wrapped once however many clusters start."""
    import IPython

    kernel = FakeKernel()
    shell = type("Shell", (), {"kernel": kernel})()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(_registry, "_HOOKED_KERNELS", weakref.WeakSet())
    order: list[str] = []
    # Ray as the hook finds it in sys.modules (never this session's own, which the shared test cluster uses)
    fake_ray = types.SimpleNamespace(
        is_initialized=lambda: True, shutdown=lambda: order.append("ray.shutdown")
    )
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    preparations: _registry.Items[object] = _registry.Items("preparations")
    monkeypatch.setattr(_registry, "before_kernel_shutdown", preparations)

    def failing_preparation() -> None:
        order.append("failing preparation")
        raise OSError("no such process")

    preparations.add(failing_preparation)
    preparations.add(lambda: order.append("prepared"))

    class Handing(FakeCluster):
        def kernel_shutdown(self) -> str:
            order.append(self.name)
            return f"cluster {self.name!r}: its teardown is left to the reaper process"

    class Failing(FakeCluster):
        def stop(self, reason: str = "stopped by the user") -> str:
            order.append(self.name)
            raise RuntimeError("Ray is gone")

    m: _registry.ClusterManager[FakeCluster] = _registry.ClusterManager()
    plain, cloud, broken = FakeCluster("plain"), Handing("cloud"), Failing("broken")
    for c in (broken, plain, cloud):
        m.add(c)
    wrapped = kernel.do_shutdown
    assert "do_shutdown" in vars(kernel)  # wrapped on the instance
    assert wrapped(True) == {"status": "ok", "restart": True}
    assert kernel.calls == [True]  # the kernel's own shutdown ran once, with the restart flag
    # the preparations first (one failing stops no other), then the clusters (a failure stops no other); then a
    # Ray the kernel started itself shuts down too
    assert order == ["failing preparation", "prepared", "broken", "cloud", "ray.shutdown"]
    assert plain.stopped == ["kernel exit"]
    assert cloud.stopped == []  # left to its reaper
    m.add(FakeCluster("later"))
    assert kernel.do_shutdown is wrapped  # wrapped once


def test_outside_a_kernel_nothing_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # plain Python, or a terminal IPython
    monkeypatch.setattr(_registry, "_HOOKED_KERNELS", weakref.WeakSet())
    m: _registry.ClusterManager[FakeCluster] = _registry.ClusterManager()
    m.add(FakeCluster("a"))
    assert len(_registry._HOOKED_KERNELS) == 0


def test_a_slot_holds_one_value_and_says_what_it_replaced() -> None:
    slot: _registry.Slot[str] = _registry.Slot("test")
    assert slot.get() is None and "empty" in repr(slot)
    assert slot.set("a") is None and slot.set("b") == "a" and slot.get() == "b"
    with slot.lock:  # reentrant: a caller that checks and creates under the lock may set inside it
        slot.set(None)
    assert slot.get() is None


def test_items_keep_their_order_and_the_newest_within_a_cap() -> None:
    items: _registry.Items[int] = _registry.Items("test")
    assert items.latest() is None and items.items() == []
    for i in range(5):
        items.add(i, keep=3)
    assert items.items() == [2, 3, 4] and items.latest() == 4
    items.add(5)  # no cap: nothing dropped
    items.remove(3)
    items.remove_if(lambda i: i % 2 == 0)
    assert items.items() == [5] and repr(items) == "<Items test: 1>"
    with pytest.raises(ValueError):
        items.remove(3)  # as list.remove: a listener removed twice is a bug


def test_the_kernel_state_outside_the_manager_lives_in_typed_fields() -> None:
    """What other packages keep for the kernel (background cells, the catalog, ...) is here, not in their globals."""
    from gpu_notebook.catalog import get_catalog
    from gpu_notebook.cluster.workshop import current_workshop
    from gpu_notebook.cluster.workshop._seat import WorkshopError
    from gpu_notebook.cost._watcher import last_stopped

    kept = get_catalog()
    assert kept is _registry.catalog.get() is get_catalog()
    try:
        assert get_catalog(reload=True) is _registry.catalog.get() is not kept
    finally:
        _registry.catalog.set(kept)  # the user overrides other tests set stay
    saved = _registry.stopped_cost.set(("c", object(), "budget"))
    try:
        assert last_stopped() == _registry.stopped_cost.get()
    finally:
        _registry.stopped_cost.set(saved)
    if _registry.workshops.latest() is None:
        with pytest.raises(WorkshopError):
            current_workshop()
    marker = types.SimpleNamespace(name="ws-test")
    _registry.workshops.add(marker)
    try:
        assert current_workshop() is marker
    finally:
        _registry.workshops.remove(marker)


def test_the_cluster_package_prepares_a_local_ray_to_end_at_once_at_a_kernel_shutdown() -> None:
    """Whoever can start a local Ray (cluster._connect) has registered how its processes end together."""
    from gpu_notebook.cluster import _connect, _ray_exit

    assert _connect is not None
    assert _ray_exit.end_ray_processes_together in _registry.before_kernel_shutdown.items()
