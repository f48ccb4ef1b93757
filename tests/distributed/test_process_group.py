"""The torchrun environment: one builder for the worker group's ranks and the doctor's local group."""

from __future__ import annotations

import os
import subprocess
import sys

from gpu_notebook.distributed import torchrun_env
from gpu_notebook.distributed._process_group import select_devices


def test_the_torchrun_variables_of_a_rank():
    env = torchrun_env(
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        node_rank=1,
        nodes=2,
        master_addr="10.0.0.1",
        master_port=29500,
        run_id="job1",
        agent_store=True,
        device="cuda:1",
        environ={},
    )
    assert env == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "ROLE_RANK": "3",
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "job1",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_TORCH_DEVICE": "cuda:1",
    }


def test_one_node_is_the_default():
    env = torchrun_env(rank=1, world_size=2, master_addr="127.0.0.1", master_port=1234, environ={})
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == ("1", "2", "0")
    assert (env["GROUP_WORLD_SIZE"], env["TORCHELASTIC_RUN_ID"]) == ("1", "none")
    # no store runs yet for the caller's own tcp:// rendezvous, which reads this (the doctor's local group)
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert "ACCELERATE_TORCH_DEVICE" not in env


def test_what_the_environment_sets_is_kept_as_torchrun_keeps_it():
    env = torchrun_env(
        rank=0,
        world_size=2,
        master_addr="h",
        master_port=1,
        environ={"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"},
    )
    assert "OMP_NUM_THREADS" not in env  # the rank keeps its own 8
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    # one rank per node: torchrun leaves OMP_NUM_THREADS unset
    alone = torchrun_env(
        rank=0, world_size=2, local_rank=0, local_world_size=1, master_addr="h", master_port=1, environ={}
    )
    assert "OMP_NUM_THREADS" not in alone


def test_torch_sees_a_torchrun_launch():
    """torch's is_torchelastic_launched() is what Lightning's TorchElasticEnvironment.detect() asks."""
    env = torchrun_env(rank=0, world_size=2, master_addr="127.0.0.1", master_port=1, run_id="g", environ={})
    code = "import torch.distributed as dist; print(dist.is_torchelastic_launched())"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    for extra, expected in (({}, "False"), (env, "True")):
        out = subprocess.run(
            [sys.executable, "-c", code], env={**clean, **extra}, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == [expected]


def test_a_rank_without_gpu_uses_the_cpu_and_a_gpu_rank_says_which_gpu_it_would_use():
    """On a CPU-only torch (or logical Ray GPUs) the device is the CPU, CUDA is never initialised."""
    import torch

    assert not torch.cuda.is_available()  # this machine: a CPU build
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        none = select_devices("gloo", None, ())
        assert (str(none.device), none.cuda_index) == ("cpu", None)
        held = select_devices("gloo", "4,5,6,7", (2, 3))
        assert (str(held.device), held.cuda_index) == ("cpu", 2)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
        assert not torch.cuda.is_initialized()
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
