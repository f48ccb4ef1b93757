"""Batched calls into every rank: draining their output and asking whether they are alive.

Each is one round of Ray calls for all ranks at once: the calls are all sent, then one ``ray.wait`` waits for
all of them together and one ``ray.get`` fetches every answer that came, so a poll at 8 ranks costs about one
round trip, not 8 in turn. A rank whose call failed (its worker died) is retried alone only to tell which one
it was; the caller handles the death.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from gpu_notebook.distributed._output import Streamer

__all__ = ["alive", "answers", "drain", "kill"]


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
