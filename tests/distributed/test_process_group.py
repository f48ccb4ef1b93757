"""The torchrun environment: one builder for the worker group's ranks and the doctor's local group."""

from __future__ import annotations

from gpu_notebook.distributed import torchrun_env


def test_the_torchrun_variables_of_a_rank():
    env = torchrun_env(
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=29500,
    )
    assert env == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }


def test_one_node_is_the_default():
    env = torchrun_env(rank=1, world_size=2, master_addr="127.0.0.1", master_port=1234)
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == ("1", "2", "0")
