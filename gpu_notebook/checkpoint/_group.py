"""The process group as a checkpointer sees it: this process's rank and the world size, a session token the
ranks share (their shards meet under one checkpoint id), and the one collective every agreement uses."""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
import uuid
from typing import Any

from ._errors import CheckpointError, StoreError
from .format.manifest import SHARD_PREFIX
from .stores.local import LocalStore

__all__ = ["rank_world", "session_token", "join_session", "agree_min", "agree_save"]


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int, bool]:
    """Rank and world size: explicit, else torch.distributed (if initialised), else env, else 0/1; and whether
    a torch.distributed process group is up."""
    dist_ok = False
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            dist_ok = dist.is_available() and dist.is_initialized()
        except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - torch without distributed
            dist_ok = False
    if rank is None:
        if dist_ok:
            import torch.distributed as dist

            rank = dist.get_rank()
        else:
            rank = int(os.environ.get("RANK", "0"))
    if world_size is None:
        if dist_ok:
            import torch.distributed as dist

            world_size = dist.get_world_size()
        else:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return int(rank), int(world_size), dist_ok


def session_token(world_size: int, dist_ok: bool) -> str:
    """Eight hex digits naming this run's checkpoints; the same on every rank (broadcast from rank 0 through the
    process group, else derived from the rendezvous environment)."""
    tok = uuid.uuid4().hex[:8]
    if world_size > 1 and dist_ok:
        import torch.distributed as dist

        box = [tok]
        dist.broadcast_object_list(box, src=0)
        tok = box[0]
    elif world_size > 1:
        # (torchrun's restart count: a run restarted after a crash names its saves otherwise)
        env = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
        seed = ":".join(os.environ.get(k, "") for k in env)
        tok = hashlib.sha256(seed.encode()).hexdigest()[:8]
    return tok


def join_session(world_size: int, dist_ok: bool, rank: int, store: Any, writable: bool) -> str:
    """The session token (see :func:`session_token`); in a job with a process group that saves to a local folder,
    first a check that every rank sees the same folder (:func:`check_shared`)."""
    token = session_token(world_size, dist_ok)
    if world_size > 1 and dist_ok and isinstance(store, LocalStore):
        check_shared(store, token, rank, writable)
    return token


def check_shared(store: Any, token: str, rank: int, writable: bool) -> None:
    """Every rank of the job sees what rank 0 writes into ``store`` (a local folder): else :class:`CheckpointError`
    on every rank, at once. The ranks of a save meet in the store (their parts, the commit), so on several
    machines a folder that is not shared between them would fail every save, after ``commit_timeout_s``.

    Rank 0 writes a probe (under ``shards/``, where gc clears what a crash leaves); after one all-reduce (its
    write happens before the others look) the other ranks look for it; a second all-reduce tells every rank
    whether all saw it. Nothing is checked where rank 0 may not write (``read_only``)."""
    key = f"{SHARD_PREFIX}probe-{token}.json"
    wrote = 0
    if rank == 0 and writable:
        try:
            store.put(key, b"{}", create_only=True)
            wrote = 1
        except StoreError:  # (the first save says what is wrong with the store)
            wrote = 0
    got = agree_min_all([-wrote])
    if got is None or got[0] == 0:
        return
    seen = 1 if rank == 0 else int(store.exists(key))
    all_seen = agree_min(seen)
    if rank == 0:
        try:
            store.delete(key)
        except StoreError:
            pass
    if all_seen == 0:
        raise CheckpointError(
            f"the checkpoint folder {store.url} is not shared between the ranks: a rank does not see what rank 0 "
            "writes there (each machine has a folder of its own). The ranks of a save meet in the store: use "
            "s3://bucket/prefix, or a shared file system mounted at the same path on every machine"
        )


def agree_min(value: int) -> int | None:
    """The smallest ``value`` over the ranks of the process group (a collective: every rank must call it),
    or None when there is no process group."""
    got = agree_min_all([value])
    return None if got is None else got[0]


def agree_save(seq: int, token: str, base: bool = False) -> tuple[int, str, bool]:
    """What the ranks of a save that several write agree on when it starts (one collective, on the training
    thread): the counter in its id (the largest of the ranks', so that no rank reuses an id), a nonce
    naming this save (16 hex digits; the smallest of the ranks' random draws), and whether it is a full base
    (where any rank's ``base`` says so). Without a process group: ``seq``, the session ``token`` (the ranks
    cannot draw a nonce together; the token, from the rendezvous environment, is the same on every rank and
    tells runs apart as far as that environment does) and ``base``."""
    got = agree_min_all([-int(seq), secrets.randbits(62), 0 if base else 1])
    if got is None:
        return int(seq), token, bool(base)
    return -got[0], f"{got[1]:016x}", got[2] == 0


def agree_min_all(values: list[int]) -> list[int] | None:
    """The element-wise smallest ``values`` over the ranks (one all-reduce), or None without a process group."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        import torch

        dev = torch.device("cpu")
        if dist.get_backend() == "nccl":
            dev = torch.device("cuda", torch.cuda.current_device())
        t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return [int(v) for v in t.tolist()]
    except ImportError:
        return None
