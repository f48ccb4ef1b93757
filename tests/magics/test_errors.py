"""How the magics show failures: our errors and usage mistakes as one line, a bug with its traceback."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook.errors import GpuNotebookError
from gpu_notebook.magics._common import BadArguments, missing_extra


def _run(ip, cell: str):
    with capture_output() as cap:
        res = ip.run_cell(cell)
    return res, cap


def _catalog_raising(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    import gpu_notebook.magics._cost

    def get_catalog():
        raise exc

    monkeypatch.setattr(gpu_notebook.magics._cost, "get_catalog", get_catalog)


def test_our_error_is_one_line_and_the_cell_does_not_fail(ip, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_notebook.catalog import CatalogError

    _catalog_raising(monkeypatch, CatalogError("the price list is unreadable"))
    res, cap = _run(ip, "%gpu_cost catalog --cloud aws")
    assert res.error_in_exec is None
    assert cap.stderr == "Error: the price list is unreadable\n" and cap.stdout == ""


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
    assert res.error_in_exec is None
    assert cap.stderr == "Error: No module named 'boto3': pip install 'gpu_notebook[aws]'\n"


def test_usage_errors_print_the_usage(ip) -> None:
    res, cap = _run(ip, "%gpu_cluster start --workers 0")  # Cluster's own check, before anything starts
    assert res.error_in_exec is None
    assert (
        cap.stderr.startswith("UsageError: --workers must be at least 1\n")
        and "%gpu_cluster [--name" in cap.stderr
    )
    assert cap.stderr.rstrip().endswith("Try %gpu_cluster? for help.")


def test_bad_arguments_is_a_usage_error_and_ours_are_rooted() -> None:
    assert issubclass(BadArguments, UsageError)
    from gpu_notebook.magics._common import MagicError

    assert issubclass(MagicError, GpuNotebookError)


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
