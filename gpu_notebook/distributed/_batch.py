"""Batched calls into every rank: draining their output and asking whether they are alive.

Each is one round of Ray calls for all ranks at once: the calls are all sent, then one ``ray.wait`` waits for
all of them together and one ``ray.get`` fetches every answer that came, so a poll at 8 ranks costs about one
round trip, not 8 in turn. A rank whose call failed (its worker died) is retried alone only to tell which one
it was; the caller handles the death.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Any

from gpu_notebook.distributed._output import Streamer

__all__ = ["alive", "answers", "drain", "gone", "kill"]


def _ray() -> Any:
    import ray

    return ray


def answers(refs: Sequence[Any], timeout: float) -> list[tuple[bool, Any]]:
    """``(True, value)`` for each ref that answered within ``timeout``, ``(False, None)`` for the others (no
    answer in time, or its call failed), in order: one wait for all of them and one get of those that came."""
    ray = _ray()
    if not refs:
        return []
    try:
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    except Exception:  # noqa: BLE001 - Ray itself is going away (the cluster is being stopped)
        return [(False, None)] * len(refs)
    came = set(ready)
    got = [ref for ref in refs if ref in came]
    try:
        values = dict(zip(got, ray.get(got), strict=True))
    except Exception:  # noqa: BLE001 - one of them failed (a dead worker): take the others one by one
        values = {}
        for ref in got:
            try:
                values[ref] = ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - this one's worker died: the caller finds out from its call
                continue
    return [(True, values[ref]) if ref in values else (False, None) for ref in refs]


def drain(
    workers: Sequence[Any],
    ranks: Sequence[int],
    dead: Collection[int],
    streamer: Streamer,
    timeout: float = 5.0,
) -> int:
    """Fetch what ``ranks`` (of ``workers``, not known ``dead``) printed since the last drain into
    ``streamer``, in one batched call; returns how many characters came."""
    live = [r for r in ranks if r not in dead and r < len(workers)]
    try:
        refs = [workers[r].actor.drain_output.remote() for r in live]
    except Exception:  # noqa: BLE001 - Ray itself is going away (the cluster is being stopped)
        return 0
    got = 0
    for rank, (ok, text) in zip(live, answers(refs, timeout), strict=True):
        if ok and text:
            got += len(text)
            streamer.feed(rank, text)
    streamer.tick()  # displays held for the same one from other ranks (see _rich)
    return got


def gone(workers: Sequence[Any], ranks: Collection[int]) -> list[int]:
    """Those of ``ranks`` whose worker process ran on this node and exists no more, in order.

    Ray learns that a worker died when its connection to the raylet closes. A process the rank forked keeps
    that connection open (a DataLoader worker of an interrupted cell, still inside ``__getitem__``): Ray then
    waits for the child, and the cell with it. The pid settles it here; on other nodes Ray's word stands.
    """
    here = _this_node()
    out = []
    for rank in sorted(ranks):
        meta = workers[rank].meta if rank < len(workers) else {}
        pid = meta.get("pid")
        if here and meta.get("node_id") == here and isinstance(pid, int) and not _pid_exists(pid):
            out.append(rank)
    return out


def _this_node() -> str | None:
    """This process's Ray node (None through Ray Client, whose driver is on another machine than its node)."""
    ray = _ray()
    try:
        if ray.util.client.ray.is_connected():
            return None
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - not connected, or Ray going away: no local answer
        return None


def _pid_exists(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (dead, not yet reaped by the raylet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:  # Linux: "pid (comm) state ...", the state after the last ")"
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS), or it went just now
        return True


def alive(workers: Sequence[Any], dead: Collection[int], timeout: float) -> list[bool]:
    """Whether each rank's process answers a ping within ``timeout`` (one batched call; known dead: False)."""
    ranks = [r for r in range(len(workers)) if r not in dead]
    try:
        refs = [workers[r].actor.ping.remote() for r in ranks]
    except Exception:  # noqa: BLE001 - Ray itself is going away: nobody answers
        return [False] * len(workers)
    ok = {r: came for r, (came, _) in zip(ranks, answers(refs, timeout), strict=True)}
    return [ok.get(r, False) for r in range(len(workers))]


def kill(actors: Sequence[Any]) -> None:
    """End the actors' processes now (no restart)."""
    ray = _ray()
    for a in actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead, or Ray is shutting down: nothing left to end
            pass
