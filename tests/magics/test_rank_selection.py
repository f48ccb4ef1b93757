"""One name for choosing ranks: ``--ranks`` (or ipyparallel's ``--targets``) in every magic that selects ranks;
``--workers`` is the worker count of ``%gpu_cluster start`` and is refused by the others, naming ``--ranks``
(``%%distributed --workers 2`` ran on rank 2 alone).

Through a real shell with ``%load_ext gpu_notebook``, on the session's shared 2-worker cluster.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook import get_manager

pytestmark = pytest.mark.timeout(240)


def _cell(ip, cell: str):
    with capture_output() as cap:
        res = ip.run_cell(cell)
    return res, cap.stdout + cap.stderr


@pytest.mark.parametrize("flag", ["--ranks", "--targets"])
def test_a_cell_runs_on_the_ranks_chosen(ip, shared, flag) -> None:
    res, shown = _cell(ip, f"%%distributed {flag} 1 -o got\nimport os\nint(os.environ['RANK'])\n")
    assert res.success, shown
    assert ip.user_ns["got"].ranks == [1] and ip.user_ns["got"][1] == 1
    res, shown = _cell(ip, f"%%distributed {flag} 0-1 -o got\nimport os\nint(os.environ['RANK'])\n")
    assert res.success, shown
    assert list(ip.user_ns["got"]) == [0, 1]


@pytest.mark.parametrize("flag", ["--ranks", "--targets"])
def test_a_push_goes_to_the_ranks_chosen(ip, shared, flag) -> None:
    ip.user_ns["only_one"] = 7
    res, shown = _cell(ip, f"%gpu_push only_one {flag} 1")
    assert res.success and "pushed only_one to ranks 1" in shown, shown
    res, shown = _cell(ip, "%%distributed -o has\nglobals().pop('only_one', None)\n")
    assert res.success, shown
    assert list(ip.user_ns["has"]) == [None, 7]


def test_a_script_runs_on_the_ranks_chosen(ip, shared, tmp_path, monkeypatch) -> None:
    (tmp_path / "who.py").write_text("import os\nprint('WHO', os.environ['RANK'])\n")
    monkeypatch.chdir(tmp_path)
    res, shown = _cell(ip, "%gpu_run --targets 0 who.py")
    assert res.success, shown
    assert "[rank 0] WHO 0" in shown and "[rank 1]" not in shown


@pytest.mark.parametrize(
    "cell",
    [
        "%%distributed --workers 1 -o ran\n1\n",
        "%%distributed -w 1 -o ran\n1\n",
        "%%distributed --workers\n1\n",
        "%gpu_run --workers 1 who.py",
        "%gpu_push x --workers 1",
    ],
)
def test_workers_on_a_magic_that_chooses_ranks_is_refused_naming_ranks(ip, shared, cell) -> None:
    ip.user_ns["x"] = 1
    ip.user_ns.pop("ran", None)
    res, shown = _cell(ip, cell)
    exc = res.error_in_exec
    assert type(exc) is UsageError, (exc, shown)  # that exact class: IPython shows it without a traceback
    msg = str(exc)
    assert msg.startswith("--workers is the worker count of %gpu_cluster start; to choose ranks use --ranks")
    assert "--targets" in msg and "usage: " in msg and "Traceback" not in shown
    assert "ran" not in ip.user_ns  # nothing ran


def test_workers_of_gpu_cluster_start_is_still_a_count(ip, shared) -> None:
    res, shown = _cell(ip, "%gpu_cluster start --name counted --workers 2 --cpus-per-worker 0.25")
    assert res.success, shown
    try:
        c = get_manager().get("counted")
        assert c.world_size == 2 and get_manager().current is c
        res, shown = _cell(ip, "%%distributed -o got\nimport os\nint(os.environ['RANK'])\n")
        assert res.success and list(ip.user_ns["got"]) == [0, 1], shown
    finally:
        get_manager().get("counted").stop()
        get_manager().use(shared.name)


def test_push_and_pull_reach_the_cluster_named_by_cluster(ip, shared) -> None:
    """``--cluster NAME`` in %gpu_push and %gpu_pull, as in %%distributed and %gpu_run: not the current one."""
    res, shown = _cell(ip, "%gpu_cluster start --name other --workers 1 --cpus-per-worker 0.25")
    assert res.success, shown
    try:
        assert get_manager().current is get_manager().get("other")
        ip.user_ns["sent_to_shared"] = 41
        res, shown = _cell(ip, f"%gpu_push sent_to_shared --cluster {shared.name} --ranks 1")
        assert res.success, shown
        res, shown = _cell(ip, f"%gpu_pull sent_to_shared --cluster {shared.name} --rank 1 --as back")
        assert res.success and ip.user_ns["back"] == 41, shown
        res, shown = _cell(ip, "%gpu_pull sent_to_shared")  # the current cluster never got it
        assert not res.success and "sent_to_shared" in str(res.error_in_exec), shown
        res, shown = _cell(ip, "%gpu_push sent_to_shared --cluster no-such-cluster")
        assert not res.success and "no-such-cluster" in str(res.error_in_exec), shown
    finally:
        get_manager().get("other").stop()
        get_manager().use(shared.name)
