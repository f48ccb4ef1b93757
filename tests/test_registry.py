"""gpu_notebook._registry: the kernel's clusters and what hangs off each one, held so that nothing leaks."""

from __future__ import annotations

import gc
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
