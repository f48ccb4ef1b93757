"""``--backend nccl`` on a machine without GPUs says that NCCL needs a GPU per rank and what to use instead,
before any worker starts (it ended in a raw Ray traceback from inside CUDA: ``_cuda_setDevice``)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from gpu_notebook import get_manager
from gpu_notebook.cluster import ClusterError

pytestmark = pytest.mark.timeout(60)


def test_nccl_on_a_cluster_without_gpus_says_why_and_what_to_use(ip, ray_session, capsys):
    capsys.readouterr()
    res = ip.run_cell("%gpu_cluster start --name nccl-cpu --workers 2 --cpus-per-worker 0.5 --backend nccl")
    err = res.error_in_exec
    assert isinstance(err, ClusterError)
    text = "\n".join(err._render_traceback_())
    out = capsys.readouterr()
    shown = text + out.out + out.err
    assert "--backend nccl needs a GPU of its own for every rank" in shown
    assert "this cluster has no GPUs" in shown and "--backend gloo" in shown
    assert "Traceback" not in shown and "_cuda_setDevice" not in shown and "RayTaskError" not in shown
    assert get_manager().get("nccl-cpu", None) is None


def test_nccl_with_no_gpus_per_worker_is_a_usage_error(ip):
    res = ip.run_cell("%gpu_cluster start --name nccl-0 --gpus-per-worker 0 --backend nccl")
    assert isinstance(res.error_in_exec, UsageError)
    assert "--backend nccl needs a GPU of its own for every rank" in str(res.error_in_exec)
    assert get_manager().get("nccl-0", None) is None
