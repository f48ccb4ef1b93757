"""How the magics fail: every failure fails the cell (so Run All, nbclient and papermill stop there); our errors
and usage mistakes are shown in one short message, a bug keeps its traceback."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook.errors import GpuNotebookError
from gpu_notebook.magics._common import MissingExtra, missing_extra


def _run(ip, cell: str):
    with capture_output() as cap:
        res = ip.run_cell(cell)
    return res, cap


def _catalog_raising(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    import gpu_notebook.magics._cost

    def get_catalog():
        raise exc

    monkeypatch.setattr(gpu_notebook.magics._cost, "get_catalog", get_catalog)


def test_our_error_fails_the_cell_in_one_line(ip, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_notebook.catalog import CatalogError

    _catalog_raising(monkeypatch, CatalogError("the price list is unreadable"))
    res, cap = _run(ip, "%gpu_cost catalog --cloud aws")
    assert isinstance(res.error_in_exec, CatalogError)
    # IPython shows what _render_traceback_ gives instead of the traceback: no frames of ours
    assert res.error_in_exec._render_traceback_() == ["CatalogError: the price list is unreadable"]
    assert cap.stdout + cap.stderr == "CatalogError: the price list is unreadable\n"


def test_a_bug_keeps_its_traceback(ip, monkeypatch: pytest.MonkeyPatch) -> None:
    # a builtin error that is not ours is a bug: it is not shown as if it were an expected failure
    _catalog_raising(monkeypatch, RuntimeError("a bug in the catalog"))
    res, _ = _run(ip, "%gpu_cost catalog --cloud aws")
    assert isinstance(res.error_in_exec, RuntimeError) and str(res.error_in_exec) == "a bug in the catalog"


def test_an_import_error_of_our_own_module_is_a_bug_too(ip, monkeypatch: pytest.MonkeyPatch) -> None:
    _catalog_raising(
        monkeypatch, ModuleNotFoundError("No module named 'gpu_notebook.x'", name="gpu_notebook.x")
    )
    res, _ = _run(ip, "%gpu_cost catalog --cloud aws")
    assert isinstance(res.error_in_exec, ModuleNotFoundError)


def test_a_missing_optional_package_names_its_extra(ip, monkeypatch: pytest.MonkeyPatch) -> None:
    _catalog_raising(monkeypatch, ModuleNotFoundError("No module named 'boto3'", name="boto3"))
    res, cap = _run(ip, "%gpu_cost catalog --cloud aws")
    assert isinstance(res.error_in_exec, MissingExtra) and isinstance(res.error_in_exec, ImportError)
    assert (
        cap.stdout + cap.stderr == "MissingExtra: No module named 'boto3': pip install 'gpu_notebook[aws]'\n"
    )


def test_usage_errors_fail_the_cell_with_the_usage(ip) -> None:
    res, cap = _run(
        ip, "%gpu_cluster start --workers 0"
    )  # the option's type refuses it, before anything starts
    # exactly UsageError: IPython prints that class as one message, and a subclass with a traceback
    assert type(res.error_in_exec) is UsageError
    assert (
        cap.stderr.startswith(
            "UsageError: --workers: expected a whole number of workers, at least 1 and at most 1024, not '0'\n"
        )
        and "usage: %gpu_cluster start [--name" in cap.stderr
    )
    assert cap.stderr.rstrip().endswith("Try %gpu_cluster? for help.")


@pytest.mark.parametrize(
    "cell,etype,says",
    [
        ("%gpu_cluster scale not-a-number", UsageError, "scale takes one argument"),
        ("%gpu_cluster bench", UsageError, "bench takes one argument"),
        ("%gpu_cluster no-such-command", UsageError, "invalid choice"),
        ("%gpu_cluster use no-such-cluster", GpuNotebookError, "no-such-cluster"),
        ("%gpu_push not_defined_here", GpuNotebookError, "not defined in the notebook: not_defined_here"),
        ("%gpu_checkpoint diff only-one", UsageError, "diff takes two checkpoint ids"),
        (
            "%gpu_checkpoint restore --store /nonexistent-gnb-store",
            GpuNotebookError,
            "no checkpoint store at",
        ),
    ],
)
def test_failing_magics_fail_the_cell(ip, cell: str, etype: type[BaseException], says: str) -> None:
    res, cap = _run(ip, cell)
    assert isinstance(res.error_in_exec, etype), res.error_in_exec
    shown = cap.stdout + cap.stderr
    assert says in shown and "Traceback" not in shown and "gpu_notebook/" not in shown


def test_ours_are_rooted() -> None:
    from gpu_notebook.magics._common import MagicError

    assert issubclass(MagicError, GpuNotebookError) and issubclass(MissingExtra, GpuNotebookError)


@pytest.mark.parametrize(
    "exc,expect",
    [
        (
            ModuleNotFoundError("No module named 'torch'", name="torch"),
            "No module named 'torch': pip install 'gpu_notebook[torch]'",
        ),
        (
            ModuleNotFoundError("No module named 'plotly.io'", name="plotly.io"),
            "No module named 'plotly.io': pip install 'gpu_notebook[widgets]'",
        ),
        # raised by the library on purpose: its message already says what to install
        (ImportError("S3 stores need boto3: pip install boto3"), "S3 stores need boto3: pip install boto3"),
        (ModuleNotFoundError("No module named 'gpu_notebook.x'", name="gpu_notebook.x"), None),
    ],
)
def test_missing_extra(exc: ImportError, expect: str | None) -> None:
    assert missing_extra(exc) == expect


def test_an_error_with_its_own_display_fails_the_cell(ip, monkeypatch: pytest.MonkeyPatch) -> None:
    # as DistributedError (the per-rank report of a failed %%distributed cell): IPython shows its display
    class Rendered(GpuNotebookError):
        def _render_traceback_(self) -> list[str]:
            return ["--- rank 1: it failed"]

    _catalog_raising(monkeypatch, Rendered("it failed"))
    res, _ = _run(ip, "%gpu_cost catalog --cloud aws")
    assert isinstance(res.error_in_exec, Rendered)


def test_the_doctor_without_a_cluster_says_it_can_check_this_machine_alone(
    ip, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doctor is often the first magic run on a new machine: without a cluster it points to ``--local``,
    and ``--local`` runs."""
    from gpu_notebook import _registry

    monkeypatch.setattr(_registry, "_MANAGER", _registry.ClusterManager())  # no cluster in this kernel
    res, cap = _run(ip, "%gpu_cluster doctor")
    assert isinstance(res.error_in_exec, _registry.NoClusterError)
    assert "%gpu_cluster start" in str(res.error_in_exec)
    assert str(res.error_in_exec).endswith("%gpu_cluster doctor --local")
    res, cap = _run(ip, "%gpu_cluster status")  # other commands: the plain message
    assert isinstance(res.error_in_exec, _registry.NoClusterError) and "--local" not in str(res.error_in_exec)
    res, cap = _run(ip, "%gpu_cluster doctor --local")
    assert res.error_in_exec is None
    shown = cap.outputs[0].data["text/plain"]  # the report, displayed
    assert "gpu_notebook doctor" in shown, shown
