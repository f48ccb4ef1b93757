"""What the workers start with: ``%gpu_cluster start --working-dir --pip --env --env-file``, and
``%gpu_cluster env``; a secret given for the workers is never shown anywhere."""

from __future__ import annotations

import os

import pytest

from gpu_notebook.cluster import WorkerSetup, worker_setup
from gpu_notebook.cluster._runtime_env import WorkerSetupError, parse_env_file, prepare_for_workers
from gpu_notebook.distributed._settings import MASK, is_secret_name, rank_settings

SECRET = "s3cr3t-VALUE-4f9a1c"  # never typed into a cell: it comes from the kernel's environment


# ---- pure: parsing and checking ---------------------------------------------------------------------------
def test_an_env_file_takes_comments_blank_lines_export_and_quotes(tmp_path):
    f = tmp_path / ".env"
    f.write_text(
        "# the workers' settings\n\nNCCL_DEBUG=INFO\nexport NCCL_SOCKET_IFNAME=eth0\n"
        'QUOTED="a b # not a comment"\nSINGLE=\'x\\ny\'\nESCAPED="line\\none"\nPLAIN=v # a comment\nEMPTY=\n'
    )
    assert parse_env_file(str(f)) == {
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0",
        "QUOTED": "a b # not a comment",
        "SINGLE": "x\\ny",
        "ESCAPED": "line\none",
        "PLAIN": "v",
        "EMPTY": "",
    }


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (SECRET, "line 3: expected KEY=VALUE"),
        (f"1BAD={SECRET}", "line 3: '1BAD' is not a valid variable name"),
        (f'TOKEN="{SECRET}', "line 3: the value's \" quote is not closed"),
        (f"RANK={SECRET}", "line 3: RANK is set on every rank by gpu_notebook"),
    ],
)
def test_a_bad_env_file_line_is_named_by_its_number_never_its_value(tmp_path, line, why):
    f = tmp_path / "bad.env"
    f.write_text(f"# comment\nOK=1\n{line}\n")
    with pytest.raises(WorkerSetupError) as info:
        parse_env_file(str(f))
    assert f"--env-file {f} {why}" in str(info.value)
    assert SECRET not in str(info.value)


def test_every_variable_a_rank_gets_from_us_is_refused_and_the_ones_torchrun_keeps_are_not():
    """``--env`` refuses what the worker group sets on every rank (it would overwrite the value silently), derived
    from the rank environment itself, so a variable added there is refused too."""
    from gpu_notebook.distributed._process_group import USER_KEEPS, torchrun_env

    ours = set(
        torchrun_env(rank=1, world_size=2, master_addr="h", master_port=1, device="cuda:0", environ={})
    )
    for name in sorted(ours - set(USER_KEEPS)) + ["CUDA_VISIBLE_DEVICES"]:
        with pytest.raises(WorkerSetupError, match=f"{name} is set on every rank by gpu_notebook"):
            worker_setup(env=[f"{name}=x"])
    assert {"TORCHELASTIC_RUN_ID", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT"} <= ours  # (refused above)
    kept = worker_setup(env=[f"{name}=4" for name in USER_KEEPS])  # as torchrun keeps them from the user
    assert dict(kept.env) == dict.fromkeys(USER_KEEPS, "4")
    # ... and the rank environment leaves them as given instead of setting its own
    env = torchrun_env(rank=0, world_size=2, master_addr="h", master_port=1, environ=dict(kept.env))
    assert "OMP_NUM_THREADS" not in env and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "4"


def test_env_key_alone_takes_the_kernels_value_and_nothing_shows_it(tmp_path):
    envf = tmp_path / ".env"
    envf.write_text("FROM_FILE=1\nOVERRIDDEN=file\n")
    setup = worker_setup(
        working_dir=str(tmp_path),
        pip=["requests==2.32.3"],
        env=["MY_TOKEN", "OVERRIDDEN=cli", "NCCL_DEBUG=INFO"],
        env_files=[str(envf)],
        environ={"MY_TOKEN": SECRET},
    )
    assert dict(setup.env) == {
        "FROM_FILE": "1",
        "OVERRIDDEN": "cli",
        "MY_TOKEN": SECRET,
        "NCCL_DEBUG": "INFO",
    }
    assert setup.runtime_env() == {"working_dir": str(tmp_path), "pip": ["requests==2.32.3"]}
    for text in (repr(setup), str(setup), setup.describe(), repr({"worker_setup": setup})):
        assert SECRET not in text and "MY_TOKEN" in text
    with pytest.raises(WorkerSetupError, match="--env MISSING: not set in the kernel's environment"):
        worker_setup(env=["MISSING"], environ={})
    with pytest.raises(WorkerSetupError, match="'A-B' is not a valid variable name"):
        worker_setup(env=["A-B=1"])
    with pytest.raises(WorkerSetupError, match="no such directory"):
        worker_setup(working_dir=str(tmp_path / "nope"))


def test_secret_values_are_masked_on_the_rank(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("PLAIN_GIVEN", SECRET)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    got = rank_settings(["PLAIN_GIVEN", "HF_TOKEN"])
    assert got["NCCL_DEBUG"] == "INFO" and got["OMP_NUM_THREADS"] == "3"
    assert got["PLAIN_GIVEN"] == MASK and got["HF_TOKEN"] == MASK
    assert {"cwd", "python", "torch"} <= set(got)
    assert is_secret_name("AWS_SECRET_ACCESS_KEY") and is_secret_name("db_password")
    assert not is_secret_name("NCCL_SOCKET_IFNAME")


def test_the_ray_runtime_env_of_a_setup_without_files_needs_no_upload():
    lines: list[str] = []
    setup = WorkerSetup(pip=("./wheels/mypkg-0.1-py3-none-any.whl",), env={"A_KEY": SECRET})
    runtime_env, env = prepare_for_workers(setup, {"env_vars": {"X": "1"}}, lines.append)
    assert runtime_env == {"env_vars": {"X": "1"}, "pip": ["./wheels/mypkg-0.1-py3-none-any.whl"]}
    assert env == {"A_KEY": SECRET}  # the values go to the actors' arguments, not to Ray's runtime_env
    assert SECRET not in " ".join(lines) and "A_KEY" in " ".join(lines)


# ---- real workers on the session's Ray -------------------------------------------------------------------
@pytest.fixture()
def env_cluster(ray_session, ip, tmp_path, monkeypatch, capsys):
    """A 2-worker cluster started with a working dir, a secret from the kernel's environment and an env file."""
    from gpu_notebook import get_manager

    wd = tmp_path / "project"
    (wd / "tools").mkdir(parents=True)
    (wd / "tools" / "__init__.py").write_text("")
    (wd / "tools" / "where.py").write_text(
        "import os, sys\nprint('WHERE', os.getcwd(), sys.argv[1:], os.environ['PLAIN'], flush=True)\n"
    )
    (wd / "train.py").write_text("import os\nprint('TRAIN', os.path.exists('tools/where.py'), flush=True)\n")
    envf = tmp_path / "workers.env"
    envf.write_text("# for NCCL\nNCCL_DEBUG=INFO\nNCCL_SOCKET_IFNAME=lo\n")
    monkeypatch.setenv("GNB_TEST_TOKEN", SECRET)
    before = get_manager().current
    ip.run_line_magic(
        "gpu_cluster",
        f"start --name renv --workers 2 --cpus-per-worker 0.25 --working-dir {wd} --env GNB_TEST_TOKEN "
        f"--env PLAIN=visible --env-file {envf}",
    )
    cluster = get_manager().get("renv")
    yield cluster, wd, capsys.readouterr()
    cluster.stop()
    if before is not None and before.running:
        get_manager().use(before.name)


def test_workers_get_the_working_dir_and_variables_and_no_output_shows_the_secret(
    env_cluster, ip, capsys, monkeypatch
):
    cluster, wd, start = env_cluster
    assert SECRET not in start.out + start.err
    assert "GNB_TEST_TOKEN" in start.out  # the start names what the workers get
    res = ip.run_cell(
        "%%distributed --cluster renv -o got\nimport os\n"
        f"(os.environ['GNB_TEST_TOKEN'] == {SECRET!r}, os.environ['NCCL_DEBUG'], os.environ['PLAIN'],\n"
        " os.path.isfile('tools/where.py'))\n"
    )
    assert res.success, res.error_in_exec
    assert (
        list(ip.user_ns["got"]) == [(True, "INFO", "visible", True)] * 2
    )  # the cwd is the working dir's copy
    capsys.readouterr()
    ip.run_line_magic("gpu_cluster", "env renv")
    env_out = capsys.readouterr()
    assert SECRET not in env_out.out + env_out.err
    for name in ("GNB_TEST_TOKEN", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "RANK", "WORLD_SIZE", "cwd", "torch"):
        assert name in env_out.out
    assert MASK in env_out.out
    ip.run_line_magic("gpu_cluster", "status renv")
    ip.run_line_magic("gpu_cluster", "logs renv")
    ip.run_line_magic("gpu_cluster", "list")
    rest = capsys.readouterr()
    assert SECRET not in rest.out + rest.err
    assert SECRET not in repr(cluster) and SECRET not in repr(cluster.options)
    # Ray's own logs and state never saw it: the value travelled as the actors' argument, not their runtime_env
    import ray

    session = ray._private.worker._global_node.get_session_dir_path()
    for root, _, files in os.walk(os.path.join(session, "logs")):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                assert SECRET.encode() not in f.read(), name


def test_gpu_run_uses_the_working_dir_copy(env_cluster, ip, capsys, monkeypatch):
    cluster, wd, _ = env_cluster
    monkeypatch.chdir(wd)
    ip.run_line_magic("gpu_run", "--cluster renv train.py")
    assert "[rank 1] TRAIN True" in capsys.readouterr().out
    ip.run_line_magic("gpu_run", "--cluster renv -m tools.where --x 1")
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("[rank 0] WHERE"))
    assert "['--x', '1'] visible" in line
    assert str(wd) not in line  # the rank runs in Ray's copy of the working dir, not the notebook's folder


def test_a_bad_env_file_fails_the_start_naming_the_line(ip, ray_session, tmp_path):
    f = tmp_path / "bad.env"
    f.write_text(f"OK=1\n{SECRET}\n")
    res = ip.run_cell(f"%gpu_cluster start --name never --workers 1 --env-file {f}\n")
    assert res.error_in_exec is not None
    text = "\n".join(res.error_in_exec._render_traceback_())
    assert "line 2: expected KEY=VALUE" in text and SECRET not in text
