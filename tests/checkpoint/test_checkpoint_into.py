"""``Checkpointer.restore(into=...)`` checks every target before it writes anything: the type of each (a module
where a module was saved, an optimizer of the same class where an optimizer was saved, a tensor where a tensor
was saved), its keys, shapes and dtypes; a mismatch names the key and what was expected, and nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, ShapeMismatchError


def _saved(tmp_path: Path, opt_cls: type[torch.optim.Optimizer] = torch.optim.Adam) -> Checkpointer:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = opt_cls(model.parameters(), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    ck = Checkpointer(tmp_path / "run", preemption=None, current=False)
    ck.save({"model": model, "optim": opt, "step": 7, "w": torch.arange(3.0)}, block=True)
    return ck


def test_an_adam_checkpoint_into_an_sgd_optimizer_is_refused_naming_both(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    m = torch.nn.Linear(4, 2)
    sgd = torch.optim.SGD(m.parameters(), lr=0.5)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ShapeMismatchError) as ei:
        ck.restore(into={"model": m, "optim": sgd})
    msg = str(ei.value)
    assert "optim: checkpoint an optimizer's state (Adam), target an optimizer (SGD)" in msg
    assert sgd.param_groups[0]["lr"] == 0.5 and not sgd.state  # not Adam's lr, no Adam moments
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())  # the model was not loaded
    ck.close()


def test_a_target_of_another_type_is_refused_and_nothing_is_loaded(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    m = torch.nn.Linear(4, 2)
    before = m.weight.detach().clone()
    t = torch.zeros(3)
    opt = torch.optim.Adam(m.parameters())
    other = torch.nn.Linear(4, 2)
    cases = [
        ({"model": m, "step": other}, "step: checkpoint a plain value (int 7), target a module (Linear)"),
        ({"model": t}, "model: checkpoint a module's state (Linear), target a tensor [3] float32"),
        ({"model": opt}, "model: checkpoint a module's state (Linear), target an optimizer (Adam)"),
        ({"optim": m}, "optim: checkpoint an optimizer's state (Adam), target a module (Linear)"),
        ({"step": t}, "step: checkpoint a plain value (int 7), target a tensor [3] float32"),
        ({"w": torch.zeros(3, dtype=torch.int64)}, "w: checkpoint [3] float32, target [3] int64"),
        ({"nosuchkey": t}, "nosuchkey: checkpoint nothing (no such key), target a tensor"),
    ]
    for into, expected in cases:
        with pytest.raises(ShapeMismatchError) as ei:
            ck.restore(into=into)
        assert expected in str(ei.value), (into, str(ei.value))
        assert torch.equal(m.weight, before) and not t.any() and not opt.state
    ck.restore(into={"model": m, "optim": opt, "w": t})  # what matches loads
    assert not torch.equal(m.weight, before) and torch.equal(t, torch.arange(3.0)) and opt.state
    ck.close()
