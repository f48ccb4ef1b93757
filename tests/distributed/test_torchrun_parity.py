"""Each rank's environment in a ``%%distributed`` cell is torchrun's: the real ``torchrun --nproc_per_node 2``
on this machine (CPU, gloo) against a cell on the shared 2-worker cluster.

The same variable names, and the same values rank by rank, except where a launch picks its own: the rendezvous
address, port and run id (consistent across ranks and well-formed). What one side sets and the other does not
is the documented allow-lists, :data:`TORCHRUN_ONLY` and :data:`NOT_TORCHRUN` (see docs/distributed.md,
"Each rank's environment"). accelerate's ``PartialState`` reads the environment the same way under both.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys

import pytest

from gpu_notebook.distributed._process_group import NOT_TORCHRUN, TORCHRUN_ONLY

pytestmark = pytest.mark.timeout(240)

# What a rank reports, the same code under torchrun and in the cell: the torchrun-related variables, and what
# accelerate's PartialState (the Hugging Face Trainer's device choice) makes of them.
REPORT = """
import os
import torch.distributed as dist

def _report():
    names = {"RANK", "WORLD_SIZE", "NODE_RANK", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"}
    prefixes = ("LOCAL_", "GROUP_", "ROLE_", "MASTER_", "TORCHELASTIC_", "TORCH_NCCL_", "ACCELERATE_")
    env = {k: v for k, v in os.environ.items() if k in names or k.startswith(prefixes)}
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # as the HF Trainer's use_cpu on a CPU machine
    acc = [state.process_index, state.local_process_index, state.num_processes, str(state.distributed_type),
           str(state.device)]
    PartialState._reset_state()
    return {"env": env, "torchelastic": dist.is_torchelastic_launched(), "accelerate": acc}
"""

SCRIPT = (
    REPORT
    + """
import json, sys
report = _report()
with open(f"{sys.argv[1]}/rank{os.environ['RANK']}.json", "w") as f:
    json.dump(report, f)
if dist.is_initialized():
    dist.destroy_process_group()
"""
)

VARYING = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # each launch's own


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def torchrun_reports(tmp_path_factory):
    """What each rank of a real ``torchrun --nproc_per_node 2`` reports (run once)."""
    out = tmp_path_factory.mktemp("torchrun")
    script = out / "report.py"
    script.write_text(SCRIPT)
    # the launcher's environment is this process's (OMP_NUM_THREADS included, as the Ray workers inherit it),
    # without what a launcher sets
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env = {k: v for k, v in env.items() if not k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_", "LOCAL_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        + ["--master_port", str(_free_port()), str(script), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def cell_reports(ip, cluster):
    """What each rank of a ``%%distributed`` cell on the shared 2-worker cluster reports."""
    from gpu_notebook import get_manager

    get_manager().use(cluster.name)
    if cluster.world_size != 2:
        cluster.scale(2)
    res = ip.run_cell("%%distributed -o _parity\n" + REPORT + "\n_report()\n")
    assert res.success, res.error_in_exec
    return list(ip.user_ns.pop("_parity"))


def test_the_same_variables_as_torchrun(torchrun_reports, cell_reports):
    for rank, (theirs, ours) in enumerate(zip(torchrun_reports, cell_reports, strict=True)):
        t, o = set(theirs["env"]), set(ours["env"])
        assert set(TORCHRUN_ONLY) <= t and not set(TORCHRUN_ONLY) & o, rank  # the allow-lists are still true
        assert not set(NOT_TORCHRUN) & t, rank
        assert t - set(TORCHRUN_ONLY) == o - set(NOT_TORCHRUN), rank
        # a CPU rank: accelerate chooses its device itself, as under torchrun
        assert "NODE_RANK" in o and "ACCELERATE_TORCH_DEVICE" not in o, rank


def test_the_same_values_rank_by_rank(torchrun_reports, cell_reports):
    for theirs, ours in zip(torchrun_reports, cell_reports, strict=True):
        t, o = theirs["env"], ours["env"]
        shared = (set(t) & set(o)) - set(VARYING)
        assert {k: o[k] for k in shared} == {k: t[k] for k in shared}
        assert o["NODE_RANK"] == o["GROUP_RANK"]
    assert [r["env"]["RANK"] for r in cell_reports] == ["0", "1"]


def test_addresses_ports_and_run_ids_agree_across_ranks_and_are_well_formed(torchrun_reports, cell_reports):
    for reports in (torchrun_reports, cell_reports):
        for name in VARYING:
            assert len({r["env"][name] for r in reports}) == 1, name
        env = reports[0]["env"]
        ipaddress.ip_address(env["MASTER_ADDR"])
        assert 0 < int(env["MASTER_PORT"]) < 2**16
        assert env["TORCHELASTIC_RUN_ID"].strip()


def test_frameworks_see_the_same_launch(torchrun_reports, cell_reports):
    for theirs, ours in zip(torchrun_reports, cell_reports, strict=True):
        assert ours["torchelastic"] is theirs["torchelastic"] is True  # Lightning's TorchElasticEnvironment
        assert ours["accelerate"] == theirs["accelerate"]
    assert [r["accelerate"][:3] for r in cell_reports] == [[0, 0, 2], [1, 1, 2]]
