"""A save and a restore leave no reference cycles behind: a restored state's memory goes back as soon as its user
drops it, and a snapshot's buffers as soon as its save is done, not whenever Python's cyclic collector next runs.

Before, ``unflatten`` rebuilt the state with a closure that called itself (a function <-> cell cycle holding every
restored tensor), and a group of small tensors and its members pointed at each other (a cycle holding the group's
snapshot buffer). Each restore left such garbage, the collector that freed it ran in the middle of a later restore
or training step (1.8-2.7 ms each on the benchmark's 40 MB state), and until it ran the memory stayed taken."""

from __future__ import annotations

import gc
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer
from gpu_notebook.checkpoint.reader import read


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def cyclic_garbage(fn: Callable[[], Any]) -> list[Any]:
    """The objects ``fn`` (its result dropped) left in reference cycles: what only the collector would free."""
    with collector_off():
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            fn()
            gc.collect()
            found = list(gc.garbage)
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
    return found


def ours(objs: list[Any]) -> list[Any]:
    """The garbage that is ours, or holds tensor or array memory (torch's own ``Optimizer.load_state_dict`` leaves
    a small closure cycle of its own, which holds neither)."""
    return [
        o
        for o in objs
        if isinstance(o, (torch.Tensor, np.ndarray))
        or type(o).__module__.startswith("gpu_notebook")
        or (isinstance(o, types.FunctionType) and (o.__module__ or "").startswith("gpu_notebook"))
    ]


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])  # small biases: a group
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return {"model": model, "optim": opt, "step": 1, "extra": [torch.arange(10), {"k": torch.ones(3)}]}


def _tensors(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


@pytest.mark.timeout(120)
def test_save_and_restore_leave_no_cycles_and_a_dropped_restore_frees_its_tensors(tmp_path: Path) -> None:
    state = _state()
    ck = Checkpointer(tmp_path / "ck", progress=False)
    ck.save(state, 1).result()
    ck.save(state, 2).result()  # a delta
    shard = ck.show().tensors
    assert any("group" in str(t) for t in shard.values())  # the small tensors were saved as a group

    assert ours(cyclic_garbage(lambda: ck.save(state, 3).result())) == []
    assert ours(cyclic_garbage(lambda: ck.restore())) == []
    assert ours(cyclic_garbage(lambda: ck.restore(into=state))) == []
    fresh = Checkpointer(tmp_path / "ck", progress=False)  # a new process's first restore
    assert ours(cyclic_garbage(lambda: fresh.restore())) == []
    assert ours(cyclic_garbage(lambda: read(str(tmp_path / "ck")))) == []  # the one-file reader

    # what a user sees: with the collector off (as it is between its runs), dropping a restored state frees it
    with collector_off():
        got = ck.restore()
        refs = [weakref.ref(t) for t in _tensors(got)]
        assert len(refs) >= 6 * 2 * 3  # weights and biases, with their two AdamW moments
        del got
        alive = [r for r in refs if r() is not None]
        assert alive == [], f"{len(alive)} restored tensors outlived their state"
    fresh.close()
    ck.close()
