"""The offline fakes used by the cloud tests: the recording process runner and the loopback moto server."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpu_notebook.testing.cloud import MotoEC2, RecordingProcessRunner, free_port


def test_recorder_records_answers_probes_and_fails_on_demand():
    rec = RecordingProcessRunner(responses={"whoami": b"ray"}, fail_on=r"ray start")
    assert rec.check_call(["ssh", "h", "uptime"]) == 0
    assert rec.check_output(["ssh", "h", "command -v docker || echo 'NoExist'"]) == b"/usr/bin/docker"
    assert rec.check_output(["ssh", "h", "whoami"]) == b"ray"
    assert rec.check_output(["ssh", "h", "something else"]) == b""
    with pytest.raises(subprocess.CalledProcessError):
        rec.check_call(["ssh", "h", "ray start --head"])
    assert rec.commands == [
        "ssh h uptime",
        "ssh h command -v docker || echo 'NoExist'",
        "ssh h whoami",
        "ssh h something else",
        "ssh h ray start --head",
    ]
    assert rec.matching(r"who") == ["ssh h whoami"]
    assert rec.DEVNULL == subprocess.DEVNULL


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_moto_server_sets_and_restores_the_environment(monkeypatch):
    pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "real-looking-id")
    monkeypatch.setenv("AWS_PROFILE", "prod")
    with MotoEC2("eu-west-1") as m:
        assert os.environ["AWS_ACCESS_KEY_ID"] == "testing" and "AWS_PROFILE" not in os.environ
        assert os.environ["AWS_ENDPOINT_URL"] == m.endpoint and m.endpoint.startswith("http://127.0.0.1:")
        assert m.client().describe_regions()["Regions"]
    assert os.environ["AWS_ACCESS_KEY_ID"] == "real-looking-id" and os.environ["AWS_PROFILE"] == "prod"
    assert "AWS_ENDPOINT_URL" not in os.environ


def test_the_library_never_imports_the_fakes():
    """gpu_notebook.testing sits above the library: importing every library module loads none of it."""
    import sys

    code = (
        "import importlib, pathlib, sys, gpu_notebook\n"
        "root = pathlib.Path(gpu_notebook.__file__).parent\n"
        "for path in sorted(root.rglob('*.py')):\n"
        "    parts = path.relative_to(root.parent).with_suffix('').parts\n"
        "    if parts[1:2] in (('testing',), ('magics',), ('widgets',)) or parts[-1] == '__main__':\n"
        "        continue\n"
        "    name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        pass\n"
        "print(sorted(n for n in sys.modules if n.startswith('gpu_notebook.testing')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
