"""The torch.distributed process group of a worker group: the backend, the torchrun environment, join and leave.

The driver side chooses the backend (:func:`explain_backend`: NCCL only when every rank has a GPU of its own
that CUDA can use). The rank side, run in each worker process, makes the rank's own GPU its current device
(:func:`select_devices`), sets the torchrun environment variables (:func:`torchrun_env`, the one place they are
built; the doctor's local group uses it too), then initialises ``torch.distributed`` once (:func:`join`). User code written for torchrun then runs unchanged: its own
``init_process_group`` returns quietly on the initialised group and its ``destroy_process_group()`` is ignored
(:func:`patch_torch_distributed`), because the group belongs to the worker, not to the cell.

A cell may run on some ranks only (``--ranks 0``). A collective there on a group with ranks outside the cell
(the default group, say) would wait for them forever: the collectives of ``torch.distributed`` check that
first, while such a cell runs (:func:`cell_ranks`), and raise :class:`CollectiveOutsideCellError` at once. One
issued from C++ (DDP's all-reduce in ``backward()``) passes no check: the rank says it waits, see
:mod:`._outside_wait`.

Nothing here imports torch at module level: the driver (the notebook) may have no torch at all.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_notebook._display import format_ranks, rank_label
from gpu_notebook.distributed._outside_wait import OutsideWaitWatch
from gpu_notebook.distributed._ranks import RankPlan
from gpu_notebook.errors import GpuNotebookError

__all__ = [
    "COLLECTIVES",
    "CollectiveOutsideCellError",
    "NOT_TORCHRUN",
    "RANK_VARIABLES",
    "USER_KEEPS",
    "TORCHRUN_ONLY",
    "RankDevices",
    "cell_ranks",
    "choose_backend",
    "collective_seq",
    "explain_backend",
    "join",
    "leave",
    "nccl_needs_gpus",
    "patch_torch_distributed",
    "select_devices",
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
        return "gloo", f"{rank_label(no_gpu)} {'has' if len(no_gpu) == 1 else 'have'} no GPU"
    no_cuda = [p.rank for p, ok in zip(plans, cuda, strict=True) if not ok]
    if no_cuda:
        return "gloo", (
            f"CUDA does not work in {rank_label(no_cuda)} although Ray gave them GPUs "
            f"(a CPU-only PyTorch build, or no CUDA driver)"
        )
    holders: dict[tuple[str, str], list[int]] = {}
    for p in plans:
        for g in p.gpu_ids:
            holders.setdefault((p.node_id, g), []).append(p.rank)
    for (node_id, gpu), ranks in holders.items():
        if len(ranks) > 1:
            ip = next(p.node_ip for p in plans if p.node_id == node_id)
            return "gloo", f"{rank_label(ranks)} share GPU {gpu} on node {ip}; NCCL needs one GPU per rank"
    return "nccl", ""


def choose_backend(plans: Iterable[RankPlan], cuda_available: bool | Sequence[bool]) -> str:
    """NCCL when every rank has a GPU of its own that CUDA can use, else gloo; see :func:`explain_backend`."""
    return explain_backend(plans, cuda_available)[0]


def nccl_needs_gpus(why: str) -> str:
    """Why ``backend="nccl"`` cannot start here, and what to use instead."""
    return (
        f"--backend nccl needs a GPU of its own for every rank, one that CUDA can use, and here {why}. "
        f"Use --backend gloo (or auto, which picks gloo here) on this cluster, or start one with GPUs "
        f"(--gpus-per-worker 1)"
    )


# ---- the torchrun environment ----------------------------------------------------------------------------------
#: What torchrun sets that a rank does not get: the agent's own business, nothing in the worker reads it.
#: ``TORCHELASTIC_ERROR_FILE`` is where ``@record`` writes a failure for the agent to report (without it,
#: ``@record`` writes nothing and the traceback comes back with the cell); ``TORCHELASTIC_SIGNALS_TO_HANDLE`` is
#: the signals the agent forwards to its workers.
TORCHRUN_ONLY = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE")
#: What a rank may get that torchrun does not set: ``NODE_RANK`` (Ray Train's and Lightning's name for
#: ``GROUP_RANK``) and, on a rank with a CUDA device, ``ACCELERATE_TORCH_DEVICE``: the device accelerate (and so
#: the Hugging Face Trainer) then uses, the rank's current device, as Ray Train sets it. Without it accelerate
#: picks ``cuda:LOCAL_RANK % device_count()``, wrong with several GPUs per rank or ranks sharing a GPU; a CPU
#: rank goes without, so accelerate picks its device as under torchrun.
NOT_TORCHRUN = ("NODE_RANK", "ACCELERATE_TORCH_DEVICE")


def torchrun_env(
    *,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    node_rank: int = 0,
    nodes: int = 1,
    run_id: str = "none",
    agent_store: bool = False,
    device: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment variables torchrun gives a rank, so code written for torchrun finds what it reads.

    As torchrun's local agent sets them (one role, ``default``; no restarts), plus ``NODE_RANK`` and,
    given ``device``, ``ACCELERATE_TORCH_DEVICE`` (see :data:`NOT_TORCHRUN`). ``TORCHELASTIC_RUN_ID`` is what
    torch's ``is_torchelastic_launched()`` checks, so Lightning takes its "launched by torchrun" path.

    Parameters
    ----------
    rank, world_size, master_addr, master_port
        The rank, the number of ranks, and where rank 0's store listens.
    local_rank, local_world_size
        Default to ``rank`` and ``world_size``: every rank on one node.
    node_rank, nodes
        The node's index and the number of nodes (torchrun's ``GROUP_RANK`` and ``GROUP_WORLD_SIZE``).
    run_id
        ``TORCHELASTIC_RUN_ID``: torchrun's rendezvous id (``none`` unless given), the same on every rank.
    agent_store
        ``TORCHELASTIC_USE_AGENT_STORE``: True when a store already listens on ``master_port`` (torchrun's
        agent's; a worker group's rank 0's), so a later ``env://`` rendezvous connects to it instead of
        starting one. Only once that store runs: ``init_process_group(init_method="tcp://...")`` reads it too.
    device
        The rank's current CUDA device (``"cuda:1"``), for ``ACCELERATE_TORCH_DEVICE``; None for a CPU rank.
    environ
        The environment the rank starts from (default ``os.environ``): as under torchrun, an
        ``OMP_NUM_THREADS`` or ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` set there is kept, and ``OMP_NUM_THREADS``
        becomes 1 when unset and a node has several ranks.

    Examples
    --------
    >>> env = torchrun_env(rank=1, world_size=2, master_addr="127.0.0.1", master_port=29500, environ={})
    >>> env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["MASTER_PORT"]
    ('1', '1', '2', '0', '29500')
    >>> env["TORCHELASTIC_RUN_ID"], env["ROLE_NAME"], env["GROUP_WORLD_SIZE"], env["OMP_NUM_THREADS"]
    ('none', 'default', '1', '1')
    """
    environ = os.environ if environ is None else environ
    local_world = world_size if local_world_size is None else local_world_size
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(node_rank),  # torchrun's name for the node's rank
        "GROUP_WORLD_SIZE": str(nodes),
        "NODE_RANK": str(node_rank),
        "ROLE_RANK": str(rank),  # one role: the role's ranks are the ranks
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id,
        # nothing is re-run by itself: a group rebuilt after a failure is a fresh launch, whose cells the user
        # runs again (as torchrun launched again), so its count starts at 0 as well
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": str(bool(agent_store)),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if "OMP_NUM_THREADS" not in environ and local_world > 1:  # torchrun's rule, against oversubscription
        env["OMP_NUM_THREADS"] = "1"
    if device is not None:
        env["ACCELERATE_TORCH_DEVICE"] = device
    return env


#: What a rank's environment may keep from the user's (``--env``, the node's): torchrun keeps these too.
USER_KEEPS = ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
#: Every variable gpu_notebook sets on a rank itself, whatever the user gives: what :func:`torchrun_env` sets
#: (but :data:`USER_KEEPS`) and the GPU visibility. ``--env`` refuses them (a value would be overwritten).
RANK_VARIABLES = frozenset(
    set(torchrun_env(rank=0, world_size=1, master_addr="", master_port=0, device="cuda:0", environ={}))
    - set(USER_KEEPS)
    | {"CUDA_VISIBLE_DEVICES"}
)


# ---- collectives in a cell on some ranks (rank side) --------------------------------------------------------
#: The ``torch.distributed`` functions every rank of their group must call (point-to-point ones need not).
COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
)

#: What DistributedDataParallel calls on its group when it is built (private, the group their first argument).
GROUP_FIRST = ("_broadcast_coalesced", "_verify_params_across_processes")

# the ranks running the current cell, when they are not all of the group's (None: every rank runs it)
_CELL_RANKS: frozenset[int] | None = None
# the group's timeout for a collective, as join() set it (said when a rank waits for ranks outside its cell)
_COLLECTIVE_TIMEOUT_S = 1800.0


class CollectiveOutsideCellError(GpuNotebookError, RuntimeError):
    """A collective needs ranks that are not running this cell: it would wait for them forever."""


class cell_ranks:  # noqa: N801 - used as a context manager, named like one
    """While a cell runs on ``ranks`` only (None: on every rank), collectives check their group first."""

    def __init__(self, ranks: Sequence[int] | None) -> None:
        self.ranks = None if ranks is None else frozenset(ranks)
        self._watch: OutsideWaitWatch | None = None

    def __enter__(self) -> None:
        global _CELL_RANKS
        _CELL_RANKS = self.ranks
        if self.ranks is not None:  # a collective from C++ passes no check: watch for one waiting
            self._watch = _watch_outside_wait(self.ranks)

    def __exit__(self, *exc: object) -> None:
        global _CELL_RANKS
        _CELL_RANKS = None
        if self._watch is not None:
            self._watch.stop()
            self._watch = None


def _watch_outside_wait(ranks: frozenset[int]) -> OutsideWaitWatch | None:
    """Start an :class:`OutsideWaitWatch` on this thread when the default group has ranks outside ``ranks``."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        missing = sorted(set(range(dist.get_world_size())) - ranks)
        rank = dist.get_rank()
    except Exception:  # noqa: BLE001 - no group to tell: nothing to watch
        return None
    if not missing:
        return None

    def write(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    return OutsideWaitWatch(
        collective_seq, threading.get_ident(), rank, sorted(ranks), missing, _COLLECTIVE_TIMEOUT_S, write
    ).start()


def _check_group(name: str, group: Any, ranks: frozenset[int]) -> None:
    """Raise when ``group`` (None: the default group) has ranks outside ``ranks``."""
    import torch.distributed as dist

    default = group is None or group is dist.GroupMember.WORLD
    try:
        members = range(dist.get_world_size()) if default else dist.get_process_group_ranks(group)
    except Exception:  # noqa: BLE001 - not a group torch can tell the ranks of: the call itself decides
        return
    missing = sorted(set(members) - ranks)
    if not missing:
        return
    which = "the default group" if default else f"a group of ranks {format_ranks(sorted(members))}"
    raise CollectiveOutsideCellError(
        f"dist.{name.lstrip('_')} on {which} needs {rank_label(missing)}, which "
        f"{'is' if len(missing) == 1 else 'are'} not running this cell (it runs on "
        f"{rank_label(sorted(ranks))}): it would wait for {'it' if len(missing) == 1 else 'them'} forever. "
        f"Run the cell on every rank of the group, or use a group of this cell's ranks "
        f"(dist.new_group([...]), created in a cell on every rank)"
    )


def _guard_collective(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` checking first, in a cell on some ranks only, that its group has no rank outside the cell."""
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        ranks = _CELL_RANKS
        if ranks is not None:
            group = kwargs.get("group")
            if name in GROUP_FIRST:
                group = args[0] if args else kwargs.get("process_group")
            elif "group" not in kwargs and signature is not None:
                try:
                    group = signature.bind_partial(*args, **kwargs).arguments.get("group")
                except TypeError:  # the call itself raises the user's mistake
                    group = None
            _check_group(name, group, ranks)
        return fn(*args, **kwargs)

    guarded._gpu_notebook_guard = True  # type: ignore[attr-defined]
    return guarded


# ---- joining and leaving (rank side) ---------------------------------------------------------------------------
def patch_torch_distributed() -> None:
    """Make torchrun-style code run unchanged on an already initialised group.

    ``init_process_group`` on an initialised default group returns quietly (it would raise otherwise), and
    ``destroy_process_group()`` of the default group is ignored: the group belongs to the worker, not the cell.
    The :data:`COLLECTIVES` check their group in a cell on some ranks only (see :func:`cell_ranks`).
    """
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_gpu_notebook", False):
        return
    for name in COLLECTIVES + GROUP_FIRST:
        fn = getattr(dist, name, None)
        if callable(fn) and not getattr(fn, "_gpu_notebook_guard", False):
            setattr(dist, name, _guard_collective(name, fn))
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


@dataclass(frozen=True)
class RankDevices:
    """The devices a rank uses, as :func:`select_devices` chose them."""

    device: Any  # the rank's current torch.device: its first own GPU when CUDA works, else the CPU
    devices: tuple[Any, ...]  # all its own devices (as Ray Train's get_devices()); (cpu,) without CUDA
    cuda_index: int | None  # its first own GPU's CUDA index, used or (CUDA not working) that it would use


def select_devices(
    backend: str, cuda_visible_devices: str | None, device_indices: Sequence[int]
) -> RankDevices:
    """Set this process's ``CUDA_VISIBLE_DEVICES`` and make the rank's first own GPU its current device.

    Any rank that holds a GPU gets it as its current device, gloo and fractional-GPU ranks too, when CUDA
    works in the process (NCCL ranks always: NCCL needs it). Without working CUDA (a CPU-only PyTorch build,
    logical GPUs from Ray) the device is the CPU, CUDA is not initialised, and ``cuda_index`` tells which GPU
    the rank would use.

    Args:
        backend: ``"gloo"`` or ``"nccl"``.
        cuda_visible_devices: this rank's ``CUDA_VISIBLE_DEVICES`` (None: leave it as it is). Set before CUDA
            is initialised in this process: CUDA reads it once.
        device_indices: the rank's own GPUs as device indices within the visible ones, current first
            (:attr:`~gpu_notebook.distributed.RankPlan.device_indices`); empty for a rank without a GPU.
    """
    if cuda_visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    import torch

    cpu = torch.device("cpu")
    if not device_indices:
        return RankDevices(cpu, (cpu,), None)
    first = int(device_indices[0])
    if backend != "nccl" and not torch.cuda.is_available():
        return RankDevices(cpu, (cpu,), first)
    torch.cuda.set_device(first)
    return RankDevices(
        torch.device("cuda", first), tuple(torch.device("cuda", int(i)) for i in device_indices), first
    )


def import_torch_soon() -> None:
    """Import torch in a background thread: a new rank worker does it while the driver ranks the workers, and
    :func:`select_devices` then finds it imported (or waits for this import: Python's import lock)."""
    threading.Thread(target=_import_torch, name="gpu_notebook-import-torch", daemon=True).start()


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - only a head start: select_devices imports it again and raises what is wrong
        pass


def join(plan_env: dict[str, str], backend: str, timeout_s: float) -> str:
    """Set this process's torchrun environment and initialise torch.distributed (once).

    Rank 0 starts the group's store on ``MASTER_ADDR:MASTER_PORT`` and every rank joins it, as under torchrun,
    where the agent's store listens there (so ``TORCHELASTIC_USE_AGENT_STORE=True`` holds for later
    rendezvous). The store is made here rather than by a ``tcp://`` rendezvous, which would read that variable.

    Args:
        plan_env: what :func:`torchrun_env` built for this rank.
        backend: ``"gloo"`` or ``"nccl"``.
        timeout_s: torch.distributed's timeout for a collective.

    Returns:
        The backend torch.distributed reports.
    """
    global _COLLECTIVE_TIMEOUT_S
    os.environ.update(plan_env)
    import torch.distributed as dist

    patch_torch_distributed()
    _COLLECTIVE_TIMEOUT_S = timeout_s
    if not dist.is_initialized():
        rank, world_size = int(plan_env["RANK"]), int(plan_env["WORLD_SIZE"])
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            plan_env["MASTER_ADDR"],
            int(plan_env["MASTER_PORT"]),
            world_size,
            is_master=rank == 0,
            timeout=timeout,
            multi_tenant=True,
        )
        dist.init_process_group.__wrapped__(  # type: ignore[attr-defined]
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    return str(dist.get_backend())


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
