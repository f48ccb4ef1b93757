"""Cloud cluster state files: location, round trip, permissions, no credentials, listing after a restart."""

from __future__ import annotations

import json

import pytest

from gpu_notebook.cloud import ClusterState, clusters_dir, config_dir, delete_state, list_states, load_state


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def test_folder_defaults_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_NOTEBOOK_CONFIG_DIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert clusters_dir() == tmp_path / ".config" / "gpu_notebook" / "clusters"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_dir() == tmp_path / "xdg" / "gpu_notebook"
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path / "mine"))
    assert clusters_dir() == tmp_path / "mine" / "clusters"


def test_round_trip_mode_and_no_secrets(cfg):
    config = {
        "cluster_name": "gnb-a",
        "provider": {
            "type": "aws",
            "region": "us-east-1",
            "aws_credentials": {"aws_secret_access_key": "SECRET"},
        },
    }
    state = ClusterState(
        "gnb-a",
        "aws",
        "us-east-1",
        status="running",
        config=config,
        head_ip="198.51.100.4",
        address="198.51.100.4:6379",
    )
    path = state.save()
    assert path == cfg / "clusters" / "gnb-a.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert "SECRET" not in path.read_text() and "aws_credentials" not in path.read_text()
    assert config["provider"]["aws_credentials"]  # the caller's config is untouched
    back = load_state("gnb-a")
    assert (back.head_ip, back.address, back.status) == ("198.51.100.4", "198.51.100.4:6379", "running")
    assert "gnb-a" in repr(back) and "<table>" in back._repr_html_()


def test_list_is_oldest_first_and_skips_broken_files(cfg):
    ClusterState("gnb-b", "gcp", "us-central1", created_at=200.0).save()
    ClusterState("gnb-c", "aws", "us-east-1", created_at=100.0).save()
    (cfg / "clusters" / "junk.json").write_text("{not json")
    assert [s.name for s in list_states()] == ["gnb-c", "gnb-b"]
    assert delete_state("gnb-c") is True and delete_state("gnb-c") is False
    assert [s.name for s in list_states()] == ["gnb-b"]


def test_unknown_name_lists_the_known_ones(cfg):
    ClusterState("gnb-d", "aws", "us-east-1").save()
    with pytest.raises(KeyError, match="known: gnb-d"):
        load_state("gnb-zzz")


def test_unknown_fields_are_ignored(cfg):
    (cfg / "clusters").mkdir(parents=True)
    (cfg / "clusters" / "gnb-e.json").write_text(
        json.dumps({"name": "gnb-e", "cloud": "aws", "region": None, "from_the_future": 1})
    )
    assert load_state("gnb-e").name == "gnb-e"


def test_ssh_tunnel_is_started_recorded_and_closed(cfg, tmp_path):
    import os
    import time

    from gpu_notebook.cloud import CloudLauncher
    from gpu_notebook.testing.cloud import write_fake_ssh

    log = tmp_path / "ssh_args"
    fake = write_fake_ssh(tmp_path / "fake_ssh", log)
    state = ClusterState(
        "gnb-t",
        "aws",
        "us-east-1",
        head_ip="198.51.100.9",
        config={"auth": {"ssh_user": "ubuntu", "ssh_private_key": "/keys/k.pem"}},
    )
    cmd = CloudLauncher.ssh_tunnel_command(state, 12345)
    assert cmd[:2] == ["ssh", "-N"] and "12345:localhost:10001" in cmd and cmd[-1] == "ubuntu@198.51.100.9"
    assert cmd[cmd.index("-i") + 1] == "/keys/k.pem"
    address = CloudLauncher.open_tunnel(state, ssh=str(fake), timeout_s=20)
    assert address.startswith("ray://127.0.0.1:") and load_state("gnb-t").tunnel_pid == state.tunnel_pid
    assert "-L" in log.read_text() and "ubuntu@198.51.100.9" in log.read_text()
    pid = state.tunnel_pid
    assert CloudLauncher.close_tunnel(state) is True and state.tunnel_pid is None
    for _ in range(100):
        try:
            os.waitpid(pid, os.WNOHANG)
            os.kill(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("tunnel process still alive")


def test_launch_refuses_a_name_that_is_still_running(cfg):
    from gpu_notebook.cloud import CloudLauncher, CloudRequestError, ClusterSpec

    ClusterState("gnb-dup", "aws", "us-east-1", status="running").save()
    with pytest.raises(CloudRequestError, match="already exists .*stop it first"):
        CloudLauncher(check_tools=False).launch(ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-dup"))
    assert load_state("gnb-dup").status == "running"  # untouched
