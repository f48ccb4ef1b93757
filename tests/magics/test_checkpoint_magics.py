"""``%gpu_checkpoint`` through a real IPython InteractiveShell, against a real local store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook.checkpoint import Checkpointer
from gpu_notebook.errors import GpuNotebookError


def failed(ip: Any, line: str, etype: type[BaseException] = GpuNotebookError) -> str:
    """Run ``%gpu_checkpoint line`` as a cell: it must fail the cell with ``etype``; what IPython showed."""
    with capture_output() as cap:
        res = ip.run_cell(f"%gpu_checkpoint {line}")
    assert isinstance(res.error_in_exec, etype), (line, res.error_in_exec)
    return cap.stdout + cap.stderr


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Checkpointer, list[str]]:
    ck = Checkpointer(tmp_path / "run", full_every=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        ck.save({"model": model, "optim": opt, "step": step, "lr": 0.1 / (step + 1)})
    ck.wait()
    return ck, [c.id for c in ck.list()]


def test_list_show_diff(ip: Any, store: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ck, ids = store
    ip.run_line_magic("gpu_checkpoint", f"use {ck.store.url}")
    assert ck.store.url in capsys.readouterr().out
    ip.run_line_magic("gpu_checkpoint", "list")
    out = capsys.readouterr().out
    assert all(i in out for i in ids) and "delta" in out and "base" in out
    ip.run_line_magic("gpu_checkpoint", f"show {ids[1]}")
    out = capsys.readouterr().out
    assert "model/weight" in out and "step=1" in out
    ip.run_line_magic("gpu_checkpoint", f"diff {ids[0]} {ids[3]}")
    out = capsys.readouterr().out
    assert "model/weight" in out and "step: 0 -> 3" in out and "lr: 0.1 -> 0.025" in out


def test_restore_into_notebook_variables(ip: Any, store: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ck, ids = store
    torch.manual_seed(1)
    m = torch.nn.Linear(8, 4)
    ip.user_ns["net"] = m
    ip.run_line_magic("gpu_checkpoint", f"restore {ids[2]} --store {ck.store.url} --into model=net -o st")
    out = capsys.readouterr().out
    assert f"restored {ids[2]} (step 2)" in out
    assert ip.user_ns["st"]["step"] == 2
    assert torch.equal(m.weight, ip.user_ns["st"]["model"]["weight"])
    ip.run_line_magic("gpu_checkpoint", f"restore --step 1 --store {ck.store.url}")
    assert ip.user_ns["ckpt_state"]["step"] == 1


def test_gc(ip: Any, store: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ck, ids = store
    ip.run_line_magic("gpu_checkpoint", f"gc --keep 1 --grace 0 --dry-run --store {ck.store.url}")
    out = capsys.readouterr().out
    assert "would delete 3 checkpoint(s)" in out and "deleted 3" not in out and len(ck.list()) == 4
    ip.run_line_magic("gpu_checkpoint", f"gc --keep 1 --grace 0 --store {ck.store.url}")
    assert "deleted 3 checkpoint(s)" in capsys.readouterr().out
    assert [c.id for c in ck.list()] == ids[-1:]


def test_bad_arguments_print_usage_not_traceback(
    ip: Any, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ck, ids = store
    err = failed(ip, "explode", UsageError)
    assert "usage" in err.lower() and "Traceback" not in err
    assert "no checkpoint 'no-such-id'" in failed(ip, f"show no-such-id --store {ck.store.url}")
    assert "two checkpoint ids" in failed(ip, f"diff {ids[0]} --store {ck.store.url}", UsageError)
    assert "no variable 'nosuchvar'" in failed(ip, f"restore --into nosuchvar --store {ck.store.url}")


def test_restore_fallback_skips_a_damaged_latest(
    ip: Any, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ck, ids = store
    man = ck.manifest(ids[3])
    objs = {c["obj"] for lf in man["shards"][0]["leaves"].values() for c in lf["chunks"]}
    for o in objs - {
        c["obj"] for lf in ck.manifest(ids[2])["shards"][0]["leaves"].values() for c in lf["chunks"]
    }:
        (Path(ck.store.root) / o).unlink()  # the latest checkpoint's own data is lost
    with pytest.warns(RuntimeWarning, match=f"checkpoint {ids[3]} .*cannot be restored"):
        ip.run_line_magic("gpu_checkpoint", f"restore --fallback --store {ck.store.url} -o st")
    assert f"restored {ids[2]} (step 2)" in capsys.readouterr().out
    assert ip.user_ns["st"]["step"] == 2


def test_wrong_positional_arguments_print_usage(
    ip: Any, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ck, ids = store
    err = failed(ip, f"gc 1 --store {ck.store.url}", UsageError)  # (meant --keep 1)
    assert "gc takes no checkpoint id (how many to keep: --keep N), got 1" in err
    assert "%gpu_checkpoint gc [--store STORE]" in err and "Traceback" not in err  # the usage of gc
    assert [c.id for c in ck.list()] == ids  # nothing was deleted
    assert "list takes no checkpoint id" in failed(ip, f"list {ids[0]} --store {ck.store.url}", UsageError)
    err = failed(ip, f"show {ids[0]} {ids[1]} --store {ck.store.url}", UsageError)
    assert "show takes at most one checkpoint id" in err
    assert "use takes one store" in failed(ip, "use", UsageError)


def test_a_mistyped_store_is_an_error_not_a_new_store(
    ip: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "rnu"
    for line in (f"list --store {typo}", f"restore --store {typo}", f"use {typo}"):
        err = failed(ip, line)
        assert f"no checkpoint store at {typo}" in err and "Traceback" not in err, line
    assert not typo.exists()


def test_store_checkpointers_are_reused_and_never_become_current(
    ip: Any, store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_notebook import checkpoint

    ck, ids = store
    other = Checkpointer(tmp_path / "other")
    other.save({"x": torch.ones(3), "step": 0}, block=True)
    mine = Checkpointer(tmp_path / "mine")  # the training loop's checkpointer
    ip.run_line_magic("gpu_checkpoint", f"list --store {other.store.url}")
    ip.run_line_magic("gpu_checkpoint", f"show --store {other.store.url}")
    assert checkpoint.current() is mine  # a --store look elsewhere does not redirect later commands
    mag = ip.magics_manager.registry["CheckpointMagics"]
    opened = [k for k in mag._opened if k[0] == other.store.url]
    assert len(opened) == 1 and mag._opened[opened[0]].read_only  # one read-only checkpointer, reused
    capsys.readouterr()


def test_gc_through_a_used_store(ip: Any, store: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_notebook import _registry

    ck, ids = store
    _registry.set_active_checkpointer(
        None
    )  # no training checkpointer in this kernel: the magic's store decides
    ip.run_line_magic("gpu_checkpoint", f"use {ck.store.url}")
    assert "(4 checkpoints)" in capsys.readouterr().out
    ip.run_line_magic("gpu_checkpoint", "gc --keep 2 --grace 0")  # `use` is read-only; gc reopens it to write
    assert "deleted 2 checkpoint(s)" in capsys.readouterr().out
    assert [c.id for c in ck.list()] == ids[-2:]
    assert "ambiguous" in failed(ip, "restore c000000000")


def test_restore_into_checks_every_target_before_changing_any(
    ip: Any, store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--into model=a,step=b`` with a wrong ``b`` leaves ``a`` untouched; a tensor or an optimizer where a
    module was saved, a plain value into a tensor, an Adam checkpoint into an SGD optimizer: each is refused,
    naming the key and what the checkpoint holds, and nothing changes."""
    ck, ids = store
    torch.manual_seed(5)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    t, opt = torch.zeros(3), torch.optim.Adam(a.parameters())
    ip.user_ns.update(a=a, b=b, t=t, opt=opt)
    ip.user_ns.pop("ckpt_state", None)
    before = a.weight.detach().clone()
    url = ck.store.url
    for line, expected in [
        ("model=a,step=b", "step: checkpoint a plain value (int 3), target a module (Linear)"),
        ("model=t", "model: checkpoint a module's state (Linear), target a tensor [3] float32"),
        ("model=opt", "model: checkpoint a module's state (Linear), target an optimizer (Adam)"),
        ("model=a,step=t", "step: checkpoint a plain value (int 3), target a tensor [3] float32"),
        ("model=a,optim=opt", "optim: checkpoint an optimizer's state (SGD), target an optimizer (Adam)"),
    ]:
        err = failed(ip, f"restore --store {url} --into {line}")
        assert expected in err and "Traceback" not in err, (line, err)
        assert torch.equal(a.weight, before) and not t.any() and not opt.state, line
    assert "ckpt_state" not in ip.user_ns  # no half-done restore either
    capsys.readouterr()


def test_use_and_store_never_switch_the_current_checkpointer(
    ip: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While a training ``Checkpointer('/A')`` is current, ``restore --store /B`` and ``use /B`` leave it current
    (a budget stop saves with it; a later plain restore loads A); ``use`` only picks what later magics read."""
    from gpu_notebook import checkpoint

    other = Checkpointer(tmp_path / "B", preemption=None, current=False)
    other.save({"x": torch.ones(2), "step": 0}, block=True)
    a = Checkpointer(tmp_path / "A", preemption=None)  # the training loop's
    a.save({"x": torch.zeros(2), "step": 100}, block=True)
    ip.run_line_magic("gpu_checkpoint", f"restore --store {other.store.url} -o st")
    assert ip.user_ns["st"]["step"] == 0 and checkpoint.current() is a
    ip.run_line_magic("gpu_checkpoint", "restore -o st")  # a plain restore: still A's
    assert ip.user_ns["st"]["step"] == 100 and checkpoint.current() is a
    ip.run_line_magic("gpu_checkpoint", f"use {other.store.url}")
    assert checkpoint.current() is a
    assert f"{a.store.url} stays the current Checkpointer" in capsys.readouterr().out
    ip.run_line_magic("gpu_checkpoint", "restore -o st")  # the magics read the store of `use`...
    assert ip.user_ns["st"]["step"] == 0 and checkpoint.current() is a  # ... and A stays current
    a.save({"x": torch.zeros(2), "step": 101}, block=True)  # training goes on: the magics still read B
    ip.run_line_magic("gpu_checkpoint", "restore -o st")
    assert ip.user_ns["st"]["step"] == 0
    c = Checkpointer(tmp_path / "C", preemption=None)  # a Checkpointer made after `use`: the magics follow it
    c.save({"x": torch.zeros(2), "step": 7}, block=True)
    ip.run_line_magic("gpu_checkpoint", "restore -o st")
    assert ip.user_ns["st"]["step"] == 7 and checkpoint.current() is c
    for ck in (other, a, c):
        ck.close()
    capsys.readouterr()


def test_every_option_is_typed_and_checked_before_anything_runs(
    ip: Any, store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gc --grace -5``, ``--keep 0``, ``--step nan``, an option of another subcommand, ``--endpoint-url`` with a
    folder: each is a usage error naming the option, and nothing is deleted; a quoted store with spaces is one
    path; gc of a mistyped ``--store`` makes no new store."""
    ck, ids = store
    url = ck.store.url
    for line, expected in [
        (f"gc --grace -5 --keep 1 --store {url}", "--grace: expected a number of seconds"),
        (f"gc --grace nan --keep 1 --store {url}", "--grace: expected a number of seconds"),
        (f"gc --keep 0 --store {url}", "--keep: expected a whole number of checkpoints"),
        (f"show --step nan --store {url}", "--step: expected a whole number of steps"),
        (f"restore --step -1 --store {url}", "--step: expected a whole number of steps"),
        (f"gc --keep 1 --into x --store {url}", "--into does not apply to gc"),
        (f"list --step 1 --store {url}", "--step does not apply to list"),
        (f"restore -o 1x --store {url}", "--out: expected a Python variable name"),
        (f"restore --into model=1x --store {url}", "--into: expected KEY=VARIABLE"),
        (f"list --store {url} --endpoint-url http://x", "--endpoint-url only applies to an s3:// store"),
        ("show '' ", "show: expected a checkpoint id"),
    ]:
        err = failed(ip, line, UsageError)
        assert expected in err and "Traceback" not in err, (line, err)
    assert [c.id for c in ck.list()] == ids  # nothing was deleted
    spaced = Checkpointer(tmp_path / "my store", preemption=None, current=False)
    spaced.save({"x": torch.ones(1), "step": 0}, block=True)
    ip.run_line_magic("gpu_checkpoint", f'use "{tmp_path}/my store"')
    assert "(1 checkpoints)" in capsys.readouterr().out
    typo = tmp_path / "rnu"
    assert f"no checkpoint store at {typo}" in failed(ip, f"gc --store {typo}")
    assert not typo.exists()
    spaced.close()
