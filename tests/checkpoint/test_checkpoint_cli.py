"""``python -m gpu_notebook.checkpoint ls|show|verify|export`` on a local folder, through a subprocess as a
terminal or CI runs it: what it prints, and exit codes a script can test. Pure: no Ray."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from _s3server import serving
from safetensors.torch import load_file

from gpu_notebook import checkpoint
from gpu_notebook.checkpoint._cli import _clean


def cli(*args: str | pathlib.Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpu_notebook.checkpoint", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, list[str], torch.nn.Module]:
    root = tmp_path_factory.mktemp("cli") / "store"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    ck = checkpoint.Checkpointer(root, preemption=None, current=False)
    for step in (1, 2):
        ck.save({"model": net, "step": step}, step=step)
        ck.wait()
        with torch.no_grad():
            net[0].weight.add_(1.0)
    ids = [c.id for c in ck.list()]
    ck.close()
    return root, ids, net


def test_ls_show_export_and_verify(
    store: tuple[pathlib.Path, list[str], torch.nn.Module], tmp_path: pathlib.Path
) -> None:
    root, ids, _net = store
    r = cli("ls", root)
    assert r.returncode == 0, r.stderr
    head, *rows = r.stdout.splitlines()
    assert head.split()[:4] == ["id", "step", "branch", "time"]
    assert [row.split()[:3] for row in rows] == [[ids[0], "1", "live"], [ids[1], "2", "live"]]
    r = cli("ls", root, "--json")
    assert [json.loads(line)["step"] for line in r.stdout.splitlines()] == [1, 2]

    r = cli("show", root, ids[0])
    assert r.returncode == 0 and "model/0.weight" in r.stdout and "float32" in r.stdout

    r = cli("export", root, ids[0], tmp_path / "m.safetensors", "--select", "model")
    assert r.returncode == 0, r.stderr
    got = load_file(tmp_path / "m.safetensors")
    assert set(got) == {"0.weight", "0.bias", "1.weight", "1.bias"}

    r = cli("verify", root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 2 checkpoint(s) intact" in r.stdout and "verify [2/2]" in r.stderr


def test_verify_finds_damage_and_exits_1(
    store: tuple[pathlib.Path, list[str], torch.nn.Module], tmp_path: pathlib.Path
) -> None:
    root, ids, _net = store
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    for obj in (copy / "objects").rglob("*"):
        if obj.is_file():
            data = bytearray(obj.read_bytes())
            data[len(data) // 2] ^= 0xFF
            obj.write_bytes(bytes(data))
    r = cli("verify", copy, ids[1])
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{ids[1]}  DAMAGED" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("ls",),  # no URL
        ("frobnicate", "x"),  # no such command
        ("show", "{root}", "c9999999999"),  # no such checkpoint
        ("ls", "{tmp}/nowhere"),  # no such store
        ("export", "{root}", "latest", "{tmp}/m.bin"),  # no format
        ("export", "{root}", "latest", "{tmp}/m.pt", "--select", "model.nope"),  # no such key
    ],
)
def test_usage_errors_exit_2(
    store: tuple[pathlib.Path, list[str], torch.nn.Module], tmp_path: pathlib.Path, args: tuple[str, ...]
) -> None:
    root, _ids, _net = store
    r = cli(*(a.format(root=root, tmp=tmp_path) for a in args))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() and "Traceback" not in r.stderr


def test_help_and_no_credentials_in_output() -> None:
    r = cli("--help")
    assert r.returncode == 0 and "ls" in r.stdout and "exit codes" in r.stdout
    assert (
        _clean("endpoint http://minio:s3cr3t@host:9000/b failed") == "endpoint http://***@host:9000/b failed"
    )
    url = "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA123&X-Amz-Signature=abcd"
    assert "AKIA123" not in _clean(url) and "abcd" not in _clean(url)


def test_ls_and_verify_an_s3_store_with_endpoint_url() -> None:
    pytest.importorskip("moto")
    with serving() as s3:
        s3.client().create_bucket(Bucket="cli")
        url = "s3://cli/runs/exp1"
        ck = checkpoint.Checkpointer(url, endpoint_url=s3.endpoint, preemption=None, current=False)
        ck.save({"model": torch.nn.Linear(4, 2), "step": 3}, step=3)
        ck.wait()
        cid = ck.list()[0].id
        ck.close()
        r = cli("ls", url, "--endpoint-url", s3.endpoint)
        assert r.returncode == 0, r.stderr
        assert cid in r.stdout
        r = cli("verify", url, "--endpoint-url", s3.endpoint)
        assert r.returncode == 0 and "1 of 1 checkpoint(s) intact" in r.stdout, r.stdout + r.stderr
        assert "AWS_SECRET" not in r.stdout + r.stderr


def test_diff_and_gc(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    ck = checkpoint.Checkpointer(root, preemption=None, current=False)
    for step in (1, 2, 3, 4):
        ck.save({"model": net, "step": step}, step=step)
        ck.wait()
        with torch.no_grad():
            net[1].weight.add_(1.0)
    ids = [c.id for c in ck.list()]
    ck.close()
    r = cli("diff", root, ids[0], ids[1])
    assert r.returncode == 0, r.stderr
    assert "model/1.weight" in r.stdout and "model/0.weight" not in r.stdout.split("unchanged")[0], r.stdout
    assert "step" in r.stdout  # the plain value that changed
    r = cli("gc", root, "--keep", "2", "--grace", "0", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "gc (dry run, nothing deleted): would keep 2 checkpoint(s), would delete 2" in r.stdout, r.stdout
    assert f"would delete {ids[0]}" in r.stdout and "deleted 2" not in r.stdout, r.stdout
    assert len(checkpoint.Checkpointer(root, read_only=True, current=False, preemption=None).list()) == 4
    r = cli("gc", root, "--keep", "2", "--grace", "0")
    assert r.returncode == 0, r.stderr
    assert f"deleted {ids[0]}" in r.stdout and f"deleted {ids[1]}" in r.stdout, r.stdout
    left = checkpoint.Checkpointer(root, read_only=True, current=False, preemption=None)
    assert [c.id for c in left.list()] == ids[2:]
    assert left.restore(ids[3])["step"] == 4  # what is kept restores
    r = cli("verify", root)
    assert r.returncode == 0 and "2 of 2 checkpoint(s) intact" in r.stdout, r.stdout + r.stderr
    for bad in (["--keep", "0"], ["--keep", "x"], ["--grace", "nan"], ["--grace", "-1"]):
        r = cli("gc", root, *bad)
        assert r.returncode == 2 and "expected" in r.stderr, (bad, r.stderr)
    r = cli("diff", root, "nope")
    assert r.returncode == 2 and "error:" in r.stderr, r.stderr
