"""The magics' arguments (issue 17: 6, 9, 11, 16, 19): every value is checked before anything starts, quoted
arguments lose their quotes as in a shell, and a usage error says what was wrong with which option and shows the
usage of the subcommand typed. No cluster is current in these tests (a fresh manager): nothing here starts Ray.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook.cloud import CloudRequestError, ClusterSpec
from gpu_notebook.cluster import Cluster
from gpu_notebook.cost import BudgetPolicy, IdleStopPolicy
from gpu_notebook.magics._common import MagicError, parse, reported


@pytest.fixture
def shell(ip, monkeypatch: pytest.MonkeyPatch, fresh_manager):
    """``ip`` with no cluster current, and ``Cluster.start``/``plan`` recording instead of starting anything."""
    from gpu_notebook.cluster import _cluster

    ip.started = []  # the clusters that got as far as start() or plan()

    def start(self: Any, progress: Any = None) -> None:
        ip.started.append(self)

    def plan(self: Any) -> str:
        ip.started.append(self)
        return "a plan"

    monkeypatch.setattr(_cluster.Cluster, "start", start)
    monkeypatch.setattr(_cluster.Cluster, "plan", plan)
    return ip


def run(ip: Any, cell: str) -> tuple[BaseException | None, str]:
    with capture_output() as cap:
        res = ip.run_cell(cell)
    return res.error_in_exec, cap.stdout + cap.stderr


def magic(ip: Any, name: str, kind: str = "line") -> Any:
    return ip.magics_manager.magics[kind][name]


# ---- 6: nan, inf and 1e308 never start anything ---------------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        "start --budget nan",
        "start --budget inf",
        "start --budget 1e308",
        "start --idle-stop nan",
        "start --idle-stop inf",
        "start --cpus-per-worker nan",
        "start --cpus-per-worker inf",
        "start --gpus-per-worker nan",
        "start --cloud kubernetes --gpu A100:1 --idle-stop nan --dry-run",
    ],
)
def test_not_finite_values_are_refused_before_anything_starts(shell, line: str) -> None:
    exc, shown = run(shell, f"%gpu_cluster {line}")
    assert type(exc) is UsageError, shown
    option = line.split()[1] if "--cloud" not in line else "--idle-stop"
    assert shown.startswith(f"UsageError: {option}: expected ") and "Traceback" not in shown
    assert shell.started == []  # no cluster started (nor a plan rendered with "--minutes nan")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget": math.nan},
        {"budget": math.inf},
        {"idle_stop": math.nan},
        {"idle_stop": -1.0},
        {"cpus_per_worker": math.nan},
        {"gpus_per_worker": math.inf},
    ],
)
def test_the_python_api_refuses_them_too(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        Cluster(**kwargs)  # type: ignore[arg-type]


def test_the_policies_and_the_cloud_spec_refuse_them() -> None:
    with pytest.raises(ValueError, match="--budget"):
        BudgetPolicy(math.inf, meter=None)  # type: ignore[arg-type]  # refused before the meter is used
    with pytest.raises(ValueError, match="--idle-stop"):
        IdleStopPolicy(math.nan)
    with pytest.raises(CloudRequestError, match="--idle-stop"):
        ClusterSpec(cloud="aws", gpu="A100:8", idle_stop_minutes=math.nan)


# ---- 9: cloud dry-run inputs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line,says",
    [
        (
            "start --cloud aws --gpu A100:8 --max-workers 0 --dry-run",
            "--max-workers: expected a whole number",
        ),
        ("start --cloud kubernetes --gpu A100:1 --region us-east-1 --dry-run", "--region does not apply"),
        ("start --cloud kubernetes --gpu A100:1 --namespace Bad_NS --dry-run", "--namespace: expected"),
        ("start --cloud aws --gpu A100:8 --gpus-per-worker 3 --dry-run", "--gpus-per-worker is for local"),
        ("start --cloud aws --gpu A100:8 --workers 100000 --dry-run", "--workers: expected a whole number"),
    ],
)
def test_cloud_inputs_a_cloud_would_ignore_are_refused(shell, line: str, says: str) -> None:
    exc, shown = run(shell, f"%gpu_cluster {line}")
    assert type(exc) is UsageError and shown.startswith(f"UsageError: {says}"), shown
    assert shell.started == []


# ---- 11: --timeout 0 means no limit; a negative one is refused ------------------------------------------------
@pytest.mark.parametrize("name,kind", [("distributed", "cell"), ("gpu_run", "line")])
def test_timeout_zero_is_no_limit_and_negatives_are_refused(shell, name: str, kind: str) -> None:
    script = "" if kind == "cell" else " train.py"
    assert parse(magic(shell, name, kind), f"--timeout 0{script}").timeout is None
    assert parse(magic(shell, name, kind), f"--timeout 2.5{script}").timeout == 2.5
    for bad in ("-5", "nan", "inf"):
        cell = (
            f"%%distributed --timeout {bad}\n1\n" if kind == "cell" else f"%gpu_run --timeout {bad}{script}"
        )
        exc, shown = run(shell, cell)
        assert type(exc) is UsageError and shown.startswith("UsageError: --timeout: expected"), shown


# ---- 16: quoted arguments lose their quotes, as in a shell ----------------------------------------------------
def test_quoted_arguments_lose_their_quotes(shell) -> None:
    assert parse(magic(shell, "gpu_monitor"), 'csv --path "a b.csv"').path == "a b.csv"
    assert parse(magic(shell, "gpu_pull"), "'v'").name == "v"
    args = parse(magic(shell, "gpu_cluster"), "start --cloud kubernetes --namespace 'x'")
    assert args.namespace == "x"
    # %gpu_checkpoint parses its line the same way (its options move to the typed parsers later)
    args = parse(magic(shell, "gpu_checkpoint"), 'use "runs/my store" --store "s 3"')
    assert args.ids == ["runs/my store"] and args.store == "s 3"


def test_a_quoted_path_with_a_space_is_written_there(shell, tmp_path, monkeypatch) -> None:
    pytest.importorskip("psutil")
    monkeypatch.chdir(tmp_path)
    try:
        exc, shown = run(shell, '%gpu_monitor csv --local --path "a b.csv"')
        assert exc is None, shown
    finally:
        run(shell, "%gpu_monitor stop --local")
    assert (tmp_path / "a b.csv").exists() and not (tmp_path / '"a b.csv"').exists()
    assert "wrote a b.csv" in shown


def test_a_hash_that_begins_a_word_starts_a_comment_as_in_a_shell(shell) -> None:
    """The docs' own lines end in ``# comments``: they were passed to the magic as arguments (``list  # x`` failed;
    ``prometheus --port 9400  # --host 0.0.0.0 ...`` bound every interface)."""
    args = parse(magic(shell, "gpu_monitor"), "prometheus --port 9400  # --host 0.0.0.0 to share it")
    assert args.port == 9400 and args.host != "0.0.0.0"
    exc, shown = run(shell, "%gpu_cluster list  # which clusters run?")
    assert exc is None, shown
    # a '#' inside a word or inside quotes is text, as in a shell
    args = parse(magic(shell, "gpu_checkpoint"), 'use s3://bucket/run#3 --store "#1 store"')
    assert args.ids == ["s3://bucket/run#3"] and args.store == "#1 store"


def test_an_unclosed_quote_is_a_usage_error(shell) -> None:
    exc, shown = run(shell, '%gpu_cluster start --name "abc')
    assert type(exc) is UsageError and "No closing quotation" in shown and "Traceback" not in shown


# ---- 19: usage messages ------------------------------------------------------------------------------------------
def test_a_usage_error_shows_the_usage_of_the_subcommand_typed(shell) -> None:
    exc, shown = run(shell, "%gpu_cluster status --budget 5")
    assert type(exc) is UsageError and shown.startswith("UsageError: --budget does not apply to status")
    assert "usage: %gpu_cluster status [NAME] [--name NAME]\n" in shown
    assert "--workers" not in shown and "--max-bytes" not in shown
    exc, shown = run(shell, "%gpu_cost stop --budget 5")  # was ignored: "No live cost view."
    assert type(exc) is UsageError and "--budget does not apply to stop" in shown
    assert "usage: %gpu_cost stop\n" in shown


def test_the_magic_alone_asks_for_a_command(shell) -> None:
    exc, shown = run(shell, "%gpu_cluster")
    assert type(exc) is UsageError and "required: command, args" not in shown
    assert shown.startswith("UsageError: %gpu_cluster needs a command") and "start, status, stop" in shown


def test_a_bad_size_names_the_option_and_the_value(shell) -> None:
    exc, shown = run(shell, "%%distributed --max-result -1\n1\n")
    assert type(exc) is UsageError and "_result_size" not in shown
    assert shown.startswith("UsageError: --max-result: not a size: '-1' (use e.g. 65536, 64K")
    exc, shown = run(shell, "%gpu_cluster bench allreduce --max-bytes 4")
    assert type(exc) is UsageError and "min_bytes" not in shown
    assert shown.startswith("UsageError: --max-bytes: expected a size of at least 8 bytes")


def test_a_rank_selection_keeps_its_quotes(shell) -> None:
    shell.user_ns["lr"] = 0.1
    exc, shown = run(shell, "%gpu_push lr --ranks abc")
    # refused before a cluster is needed, its closing quote kept
    assert type(exc) is UsageError and shown.startswith("UsageError: --ranks: bad rank selection 'abc': use")
    exc, shown = run(shell, "%gpu_push lr --targets abc")  # the alias is named as the usage spells it
    assert type(exc) is UsageError and shown.startswith("UsageError: --ranks: bad rank selection 'abc': use")
    # our messages keep their quotes; only a KeyError's own quoting goes
    with pytest.raises(MagicError) as info, reported(magic(shell, "gpu_push"), strip_quotes=True):
        raise MagicError("bad rank selection 'abc'")
    assert info.value._render_traceback_() == ["MagicError: bad rank selection 'abc'"]


# ---- one name, one meaning across the magics ----------------------------------------------------------------
@pytest.mark.parametrize(
    "name,kind,prefix",
    [("distributed", "cell", ""), ("gpu_run", "line", ""), ("gpu_push", "line", "x ")],
)
def test_ranks_are_chosen_with_ranks_or_targets_and_workers_is_refused(shell, name, kind, prefix) -> None:
    func = magic(shell, name, kind)
    script = "train.py" if name == "gpu_run" else ""
    assert parse(func, f"{prefix}--ranks 0,2 {script}").ranks == "0,2"
    assert parse(func, f"{prefix}--targets 0-3 {script}").ranks == "0-3"
    assert parse(func, f"{prefix}{script}").ranks == "all"
    for given in ("--workers 2", "-w 0", "--workers"):
        with pytest.raises(UsageError) as info:
            parse(func, f"{prefix}{given} {script}")
        assert str(info.value).startswith(
            "--workers is the worker count of %gpu_cluster start; to choose ranks use --ranks"
        )
    assert "--workers" not in func.parser.format_help()  # refused, not offered


def test_workers_of_gpu_cluster_start_is_a_count(shell) -> None:
    args = parse(magic(shell, "gpu_cluster"), "start --workers 2")
    assert args.workers == 2
    exc, shown = run(shell, "%gpu_cluster start --name counted --workers 3 --cpus-per-worker 0.25")
    assert exc is None, shown
    assert [c.settings.resources.workers for c in shell.started] == [3]


def test_a_spelling_of_another_magic_is_the_same_option(shell) -> None:
    # --cluster names the cluster in %%distributed and %gpu_run: %gpu_cluster takes it as --name
    assert parse(magic(shell, "gpu_cluster"), "status --cluster big").name == "big"
    # -o/--out stores a value in a notebook variable in %%distributed and %gpu_result: %gpu_pull takes it as --as
    pull = magic(shell, "gpu_pull")
    assert parse(pull, "w -o w0").as_name == parse(pull, "w --out w0").as_name == "w0"
    # --no-block, as --no-stream is spelt
    assert parse(magic(shell, "distributed", "cell"), "--no-block").noblock is True


def test_a_syntax_error_in_a_cell_shows_the_cell_not_ast_py(shell) -> None:
    exc, shown = run(shell, "%%distributed\nx = 1\ny = (\n")
    assert exc is not None and "ast.py" not in shown and "Traceback" not in shown
    assert "SyntaxError: '(' was never closed" in shown and "line 3" in shown and "y = (" in shown
    assert "no cluster" not in shown  # found before a cluster is needed


def test_a_quoted_namespace_is_rendered_without_its_quotes(ip, fresh_manager) -> None:
    with capture_output() as cap:
        res = ip.run_cell("%gpu_cluster start --cloud kubernetes --gpu A100:1 --namespace 'x' --dry-run")
    assert res.error_in_exec is None, cap.stderr
    plan = "".join(o.data.get("text/plain", "") for o in cap.outputs) + cap.stdout
    assert "\n  namespace: x\n" in plan and "'x'" not in plan and "in x (dry run" in plan
