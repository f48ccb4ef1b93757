"""``--cloud kubernetes``: the KubeRay manifest applied, watched and deleted through a Kubernetes API fake."""

from __future__ import annotations

import pytest

from gpu_notebook.cloud import (
    CloudLauncher,
    ClusterSpec,
    CredentialsError,
    LaunchError,
    _kube,
    list_states,
    load_state,
)
from gpu_notebook.cloud._credentials import check_kubernetes
from gpu_notebook.testing.cloud import FakeApiException, FakeKube


@pytest.fixture
def cfg_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path / "cfg"))
    kube = tmp_path / "kubeconfig"
    kube.write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv("KUBECONFIG", str(kube))
    return tmp_path


def _spec(**kw):
    return ClusterSpec(
        **{
            **dict(
                cloud="kubernetes",
                gpu="A100:8",
                workers=2,
                name="gnb-kube",
                namespace="ml",
                image="img:1",
                pip_packages=["torch==2.13.0"],
            ),
            **kw,
        }
    )


# -- the fake itself -------------------------------------------------------------------------------------


def test_fake_kube_behaves_like_kuberay():
    fake = FakeKube(ready_after=1, pods_linger=1)
    body = {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"workerGroupSpecs": [{"replicas": 2}]}}
    fake.create_namespaced_custom_object("ray.io", "v1", "ns", "rayclusters", body)
    with pytest.raises(FakeApiException) as err:
        fake.create_namespaced_custom_object("ray.io", "v1", "ns", "rayclusters", body)
    assert err.value.status == 409
    assert fake.get_namespaced_custom_object("ray.io", "v1", "ns", "rayclusters", "c")["status"] == {}
    assert (
        fake.get_namespaced_custom_object("ray.io", "v1", "ns", "rayclusters", "c")["status"]["state"]
        == "ready"
    )
    assert len(fake.list_namespaced_pod("ns", label_selector="ray.io/cluster=c").items) == 3
    fake.delete_namespaced_custom_object("ray.io", "v1", "ns", "rayclusters", "c")
    assert len(fake.list_namespaced_pod("ns", label_selector="ray.io/cluster=c").items) == 3  # lingering
    assert fake.list_namespaced_pod("ns", label_selector="ray.io/cluster=c").items == []
    with pytest.raises(FakeApiException):
        fake.get_namespaced_custom_object("ray.io", "v1", "ns", "rayclusters", "c")


# -- the kube helpers --------------------------------------------------------------------------------------


def test_apply_creates_then_updates():
    fake = FakeKube()
    from gpu_notebook.cloud import render_kuberay_manifest

    manifest = render_kuberay_manifest(_spec())
    assert _kube.apply_raycluster(manifest, fake) == "created"
    manifest["spec"]["workerGroupSpecs"][0]["replicas"] = 5
    assert _kube.apply_raycluster(manifest, fake) == "updated"
    assert fake.objects[("ml", "gnb-kube")]["spec"]["workerGroupSpecs"][0]["replicas"] == 5
    assert _kube.get_raycluster("nope", "ml", fake) is None
    assert _kube.delete_raycluster("gnb-kube", "ml", fake) is True
    assert _kube.delete_raycluster("gnb-kube", "ml", fake) is False


def test_wait_head_ready_times_out_with_the_state():
    fake = FakeKube(ready_after=10**6)
    from gpu_notebook.cloud import render_kuberay_manifest

    _kube.apply_raycluster(render_kuberay_manifest(_spec()), fake)
    with pytest.raises(TimeoutError, match="not ready"):
        _kube.wait_head_ready("gnb-kube", "ml", fake, timeout_s=0.0, poll_s=0.0)


# -- the launcher flow ---------------------------------------------------------------------------------------


def test_launch_and_teardown_through_the_api(cfg_dir):
    fake = FakeKube(ready_after=2, pods_linger=2)
    launcher = CloudLauncher(kube_clients=(fake, fake), kubectl="/nonexistent/kubectl")
    stages = []
    state = launcher.launch(_spec(), progress=stages.append, poll_s=0.0)
    assert state.status == "running"
    assert state.client_address == "ray://gnb-kube-head-svc.ml.svc.cluster.local:10001"
    assert any("no kubectl here" in s for s in stages)
    assert ("ml", "gnb-kube") in fake.objects
    names = [s.split("] ", 1)[1] for s in stages]
    assert names[:3] == ["checking credentials", "applying RayCluster", "waiting for the head pod"]
    assert "RayCluster state: ready" in names and names[-1] == "ready"
    assert load_state("gnb-kube").cloud == "kubernetes"

    report = launcher.teardown("gnb-kube", poll_s=0.0)
    assert report.clean and fake.calls.count("delete") == 1
    assert report.found_before == [{"kind": "raycluster", "id": "ml/gnb-kube"}]
    assert fake.list_namespaced_pod("ml", label_selector="ray.io/cluster=gnb-kube").items == []
    assert list_states() == []


def test_failed_apply_cleans_up_and_says_why(cfg_dir):
    fake = FakeKube(fail_create=403)
    with pytest.raises(LaunchError, match=r"\(403\) refused") as err:
        CloudLauncher(kube_clients=(fake, fake)).launch(_spec(name="gnb-kfail"), poll_s=0.0)
    assert err.value.teardown is not None and err.value.teardown.clean
    assert list_states() == []


def test_no_kube_config_is_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(CredentialsError, match="no kube config found.*--dry-run"):
        check_kubernetes()


def test_kubernetes_client_is_optional(cfg_dir, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if not installed
    with pytest.raises(CredentialsError, match="pip install kubernetes"):
        check_kubernetes()


def test_port_forward_with_kubectl_and_stop_ends_it(cfg_dir, tmp_path):
    import os
    import time

    from gpu_notebook.testing.cloud import write_fake_ssh

    log = tmp_path / "kubectl_args"
    kubectl = write_fake_ssh(tmp_path / "kubectl", log)
    fake = FakeKube(ready_after=0)
    launcher = CloudLauncher(kube_clients=(fake, fake), kubectl=kubectl)
    state = launcher.launch(_spec(name="gnb-pf"), poll_s=0.0)
    assert state.client_address.startswith("ray://127.0.0.1:")
    port = state.client_address.rsplit(":", 1)[1]
    assert log.read_text().split() == ["port-forward", "-n", "ml", "svc/gnb-pf-head-svc", f"{port}:10001"]
    pid = state.tunnel_pid
    assert launcher.teardown("gnb-pf", poll_s=0.0).clean
    for _ in range(100):
        try:
            os.waitpid(pid, os.WNOHANG)
            os.kill(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("port-forward still running after stop")
