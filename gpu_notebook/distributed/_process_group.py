"""The torch.distributed process group of a worker group: the backend, the torchrun environment, join and leave.

The driver side chooses the backend (:func:`explain_backend`: NCCL only when every rank has a GPU of its own
that CUDA can use). The rank side (:func:`join`, run in each worker process) sets the torchrun environment
variables (:func:`torchrun_env`, the one place they are built; the doctor's local group uses it too), then
initialises ``torch.distributed`` once. User code written for torchrun then runs unchanged: its own
``init_process_group`` returns quietly on the initialised group and its ``destroy_process_group()`` is ignored
(:func:`patch_torch_distributed`), because the group belongs to the worker, not to the cell.

Nothing here imports torch at module level: the driver (the notebook) may have no torch at all.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Sequence
from typing import Any

from gpu_notebook.distributed._ranks import RankPlan, format_ranks

__all__ = [
    "choose_backend",
    "collective_seq",
    "explain_backend",
    "join",
    "leave",
    "patch_torch_distributed",
    "torchrun_env",
]


# ---- the backend (driver side) -------------------------------------------------------------------------------
def explain_backend(plans: Iterable[RankPlan], cuda_available: bool | Sequence[bool]) -> tuple[str, str]:
    """The torch.distributed backend for these ranks, and why it is not NCCL.

    NCCL needs every rank to have a GPU of its own that CUDA can use: each rank has Ray GPU ids, CUDA works in
    its process (``cuda_available``), and no two ranks on one node share a GPU id (fractional
    ``gpus_per_worker`` puts several ranks on one GPU; NCCL then fails with "Duplicate GPU detected").

    Parameters
    ----------
    plans
        The ranks, as :func:`~gpu_notebook.distributed.plan_ranks` returns them.
    cuda_available
        Whether CUDA works in each rank's process, in rank order (one bool applies to every rank).

    Returns
    -------
    (backend, reason)
        ``("nccl", "")``, or ``("gloo", reason)`` with a one-line reason for the user.

    Examples
    --------
    >>> from gpu_notebook.distributed import plan_ranks
    >>> plans = plan_ranks([{"node_id": "n", "ip": "x", "gpu_ids": ["0"]}] * 2)
    >>> explain_backend(plans, True)
    ('gloo', 'ranks 0-1 share GPU 0 on node x; NCCL needs one GPU per rank')
    """
    plans = list(plans)
    if not plans:
        return "gloo", "no ranks"
    cuda = [bool(cuda_available)] * len(plans) if isinstance(cuda_available, bool) else list(cuda_available)
    if len(cuda) != len(plans):
        raise ValueError(f"cuda_available has {len(cuda)} entries for {len(plans)} ranks")
    no_gpu = [p.rank for p in plans if not p.gpu_ids]
    if len(no_gpu) == len(plans):
        return "gloo", "the workers have no GPUs"
    if no_gpu:
        return "gloo", f"{_ranks_text(no_gpu)} {'has' if len(no_gpu) == 1 else 'have'} no GPU"
    no_cuda = [p.rank for p, ok in zip(plans, cuda, strict=True) if not ok]
    if no_cuda:
        return "gloo", (
            f"CUDA does not work in {_ranks_text(no_cuda)} although Ray gave them GPUs "
            f"(a CPU-only PyTorch build, or no CUDA driver)"
        )
    holders: dict[tuple[str, str], list[int]] = {}
    for p in plans:
        for g in p.gpu_ids:
            holders.setdefault((p.node_id, g), []).append(p.rank)
    for (node_id, gpu), ranks in holders.items():
        if len(ranks) > 1:
            ip = next(p.node_ip for p in plans if p.node_id == node_id)
            return "gloo", f"{_ranks_text(ranks)} share GPU {gpu} on node {ip}; NCCL needs one GPU per rank"
    return "nccl", ""


def choose_backend(plans: Iterable[RankPlan], cuda_available: bool | Sequence[bool]) -> str:
    """NCCL when every rank has a GPU of its own that CUDA can use, else gloo; see :func:`explain_backend`."""
    return explain_backend(plans, cuda_available)[0]


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


# ---- the torchrun environment ----------------------------------------------------------------------------------
def torchrun_env(
    *,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    node_rank: int = 0,
) -> dict[str, str]:
    """The environment variables torchrun gives a rank, so code written for torchrun finds what it reads.

    ``local_rank`` and ``local_world_size`` default to ``rank`` and ``world_size``: every rank on one node.

    >>> env = torchrun_env(rank=1, world_size=2, master_addr="127.0.0.1", master_port=29500)
    >>> env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["MASTER_PORT"]
    ('1', '1', '2', '0', '29500')
    """
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(world_size if local_world_size is None else local_world_size),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),  # torchrun's name for the node's rank
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


# ---- joining and leaving (rank side) ---------------------------------------------------------------------------
def patch_torch_distributed() -> None:
    """Make torchrun-style code run unchanged on an already initialised group.

    ``init_process_group`` on an initialised default group returns quietly (it would raise otherwise), and
    ``destroy_process_group()`` of the default group is ignored: the group belongs to the worker, not the cell.
    """
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_gpu_notebook", False):
        return
    real_init, real_destroy = dist.init_process_group, dist.destroy_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if dist.is_initialized():
            return None
        return real_init(*args, **kwargs)

    def destroy_process_group(group: Any = None) -> None:
        if group is None or group is dist.GroupMember.WORLD:
            return None
        return real_destroy(group)

    init_process_group._gpu_notebook = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = real_init  # type: ignore[attr-defined]
    destroy_process_group.__wrapped__ = real_destroy  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.destroy_process_group = destroy_process_group
    dist._gpu_notebook_real_destroy = real_destroy  # type: ignore[attr-defined]


def join(
    plan_env: dict[str, str],
    backend: str,
    cuda_visible_devices: str | None,
    device_index: int,
    timeout_s: float,
) -> tuple[Any, str]:
    """Set this process's torchrun environment and initialise torch.distributed (once).

    Args:
        plan_env: what :func:`torchrun_env` built for this rank.
        backend: ``"gloo"`` or ``"nccl"``.
        cuda_visible_devices: this rank's ``CUDA_VISIBLE_DEVICES`` (None: leave it as it is).
        device_index: the CUDA device this rank uses, within the visible ones (NCCL only).
        timeout_s: torch.distributed's timeout for a collective.

    Returns:
        ``(device, backend)``: the rank's ``torch.device`` and the backend torch.distributed reports.
    """
    if cuda_visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    os.environ.update(plan_env)
    import torch
    import torch.distributed as dist

    patch_torch_distributed()
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        torch.cuda.set_device(device_index)
        device = torch.device("cuda", device_index)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group.__wrapped__(  # type: ignore[attr-defined]
            backend,
            init_method=f"tcp://{plan_env['MASTER_ADDR']}:{plan_env['MASTER_PORT']}",
            rank=int(plan_env["RANK"]),
            world_size=int(plan_env["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return device, str(dist.get_backend())


def leave() -> None:
    """Leave the default process group, when this process is in one (best effort: the worker is ending)."""
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            getattr(dist, "_gpu_notebook_real_destroy", dist.destroy_process_group)()
    except Exception:  # noqa: BLE001 - a broken group must not keep the worker from ending
        pass


def collective_seq() -> int | None:
    """The default process group's sequence number: how many collectives this rank has issued on it.

    Ranks in step have equal numbers after a cell (see :func:`gpu_notebook.distributed._recovery.out_of_step`).
    With NCCL only collectives count (point-to-point operations have their own counter); with gloo
    ``send``/``recv`` count too.
    """
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        group: Any = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - an older torch, a destroyed group: no check
        return None
