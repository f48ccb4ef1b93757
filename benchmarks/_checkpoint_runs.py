"""The tables of ``benchmarks/checkpoint.py`` that follow whole runs: bytes and restore time over a run of
checkpoints (bases included), host memory during saves, and 10,000 small tensors.

Imported by ``checkpoint.py`` (the model, the training loop and the corpus are passed in: this module has no model
of its own).
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpu_notebook.checkpoint import Checkpointer

#: the ways deltas chain that the runs table compares: (label, Checkpointer options)
POLICIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("chains of one (default)", {}),
    ("chains (delta_against='previous')", {"delta_against": "previous"}),
)


def timed(fn: Callable[[], Any]) -> float:
    """Wall time of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


_time = timed


def host_copy_s(tensors: list[torch.Tensor], n: int) -> list[float]:
    """``n`` plain host copies of the state (``clone()`` of every tensor, each dropped before the next): the least
    a snapshot costs."""
    return [timed(lambda: [t.clone() for t in tensors]) for _ in range(n)]


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def spread(xs: list[float], fmt: str = "{:.3f}", unit: str = "") -> str:
    """``median [min-max]`` of a list of measurements."""
    if not xs:
        return "-"
    return f"{fmt.format(med(xs))}{unit} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def _spread(xs: list[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    return spread(xs, fmt, unit)


def ratios(num: list[float], den: list[float]) -> list[float]:
    """Per interleaved run: ours / the baseline's."""
    return [a / b for a, b in zip(num, den, strict=False) if b > 0]


def _states(
    quick: bool, model_cls: Any, train: Callable[..., float], data: torch.Tensor, g: torch.Generator
) -> list[tuple[str, torch.nn.Module, torch.optim.Optimizer]]:
    """fp32 and bf16 training after a warm-up, and fine-tuning with most layers frozen."""
    out = []
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        model = model_cls().to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        train(model, opt, data, 5 if quick else 30, g)
        for pg in opt.param_groups:
            pg["lr"] = 1e-4
        out.append((name, model, opt))
    torch.manual_seed(0)
    model = model_cls()
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), data, 5 if quick else 30, g)
    for p in model.parameters():
        p.requires_grad_(False)
    last: Any = model.blocks[-1]
    trainable = [last.attn.out_proj.weight, model.ln.weight, model.ln.bias]
    for t in trainable:
        t.requires_grad_(True)
    out.append(("frozen (2% trainable)", model, torch.optim.AdamW(trainable, lr=1e-4)))
    return out


def runs(
    quick: bool, model_cls: Any, train: Callable[..., float], corpus: Callable[[], torch.Tensor], repeat: int
) -> list[dict[str, Any]]:
    """Per state and policy: all bytes written over a run (every checkpoint after the first, bases included) per
    checkpoint, as a ratio to ``torch.save``'s file of the same state; and per checkpoint the local restore time
    as a ratio to ``torch.load`` of that file (``repeat`` interleaved runs each; the median of each checkpoint's
    ratios, then their median and worst over the run)."""
    g = torch.Generator().manual_seed(1)
    data = corpus()
    n_saves = 3 if quick else 12
    out: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="gnb-ckpt-runs-"))
    try:
        for name, model, opt in _states(quick, model_cls, train, data, g):
            cks = {
                label: Checkpointer(work / f"{len(out)}-{i}", progress=False, preemption=None, **kw)
                for i, (label, kw) in enumerate(POLICIES)
            }
            ids: dict[str, list[str]] = {label: [] for label in cks}
            ts_files: list[Path] = []
            state = {"model": model, "optim": opt, "step": 0}
            for i in range(n_saves):
                if i:
                    train(model, opt, data, 10, g)
                state["step"] = 10 * i
                for label, ck in cks.items():
                    info = ck.save(state, 10 * i).result()
                    assert info is not None
                    ids[label].append(info.id)
                f = work / f"ts-{len(out)}-{i}.pt"
                torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
                ts_files.append(f)
            ts_bytes = [f.stat().st_size for f in ts_files]
            readers = {
                label: Checkpointer(ck.store.root, progress=False, preemption=None)
                for label, ck in cks.items()
            }  # type: ignore[attr-defined]
            rel: dict[str, list[float]] = {label: [] for label in cks}
            for i, f in enumerate(ts_files):
                per: dict[str, list[float]] = {label: [] for label in cks}
                for _ in range(repeat):  # interleaved
                    t_load = _time(lambda: torch.load(f, weights_only=True))  # noqa: B023
                    for label, rd in readers.items():
                        per[label].append(_time(lambda: rd.restore(ids[label][i])) / t_load)  # noqa: B023
                for label in cks:
                    rel[label].append(statistics.median(per[label]))
            for label, ck in cks.items():
                lst = ck.list()
                written = sum(c.new_bytes for c in lst[1:])
                out.append(
                    {
                        "state": name,
                        "policy": label,
                        "bytes": written / sum(ts_bytes[1:]),
                        "bases": sum(1 for c in lst[1:] if c.is_base),
                        "saves": n_saves - 1,
                        "restore_median": statistics.median(rel[label]),
                        "restore_worst": max(rel[label]),
                        "restore_all": rel[label],
                    }
                )
                ck.close()
                readers[label].close()
            for f in ts_files:
                f.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def runs_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| state, a checkpoint every 10 steps | deltas | all bytes written per checkpoint (2 to n, bases included)"
        " / torch.save | full bases among them | local restore / torch.load over the run: median, worst |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['state']} | {r['policy']} | {r['bytes']:.3f} | {r['bases']} of {r['saves']} | "
            f"{r['restore_median']:.2f}x, {r['restore_worst']:.2f}x |"
        )
    return "\n".join(out)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def memory(quick: bool, model_cls: Any, repeat: int, width: int = 256, reuse: bool = False) -> dict[str, Any]:
    """Host memory of the saves of one Checkpointer (a base, then deltas): the process's resident set above what
    it was before (after a tiny first save: imports and threads, reported apart), sampled every 2 ms, as a
    multiple of the state's bytes; peak (during the saves) and steady (after each save's job has ended: what stays
    between saves, the deltas' base and any buffers kept). ``width``: the model's width (256: about 40 MB of
    state with AdamW's moments; 512: about 150 MB, where the fixed costs of the encoding threads weigh less).
    ``reuse``: the Checkpointer's ``reuse_buffers`` (it keeps the snapshot's buffers between saves). Also each
    save's training stall, and a plain host copy of the state (``clone()`` of every tensor) at the same point of
    the loop after each save (after the same update of the parameters), in the same process."""
    if not os.path.exists("/proc/self/statm"):
        return {}
    torch.manual_seed(0)
    model = model_cls(d=width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    opt.step()  # the optimizer's state exists
    state = {"model": model, "optim": opt, "step": 0}
    work = Path(tempfile.mkdtemp(prefix="gnb-ckpt-mem-"))
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    try:
        # what any first save costs whatever the state's size (the codec's and stores' imports, the pools'
        # threads): paid by a tiny save in another folder first, and reported apart, so the ratios are what
        # scales with the state
        before_warm = _rss()
        with Checkpointer(work / "warm", progress=False, preemption=None) as warm:
            warm.save({"x": torch.zeros(16)}, 0).result()
            warm.wait()
            warm.restore()
        base = _rss()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        steady: list[float] = []
        stalls: list[float] = []
        copies: list[float] = []
        raw = 0
        tensors = [*model.state_dict().values()] + [
            v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)
        ]
        with Checkpointer(work, progress=False, preemption=None, reuse_buffers=reuse) as ck:
            for i in range(2 + repeat):
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1 + 1e-6)
                t0 = time.perf_counter()
                handle = ck.save(state, i)
                stalls.append(time.perf_counter() - t0)
                info = handle.result()
                assert info is not None
                raw = info.raw_bytes
                ck.wait()  # the handle resolves before the save's job has dropped its snapshot: steady is after
                steady.append((_rss() - base) / raw)
                # the reference: a host copy at the same point of the same loop (after the same update of the
                # parameters, into memory as the heap has it then). Before 2026-12-05 it was the second of two
                # clones in a row, whose source the first had just read: a warmer copy than any save can make
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1 + 1e-6)
                copies.append(host_copy_s(tensors, 1)[0])
        stop.set()
        sampler.join()
        return {
            "peak": (peak[0] - base) / raw,
            "steady": steady[2:],
            "state_mb": raw / 1e6,
            "fixed_mb": (base - before_warm) / 1e6,
            "reuse": reuse,
            "stall_s": stalls[2:],
            "host_copy_s": copies[2:],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def memory_table(rows: list[dict[str, Any]]) -> str:
    """The host-memory table: a row per state size (:func:`memory` results; empty ones: no /proc)."""
    rows = [m for m in rows if m]
    if not rows:
        return "(host memory: no /proc here)"

    def stall(m: dict[str, Any]) -> str:
        if not m.get("stall_s"):
            return ""
        ms = [[1e3 * x for x in m[k]] for k in ("stall_s", "host_copy_s")]
        return " / ".join(_spread(v, "{:.1f}", " ms") for v in ms)

    return "\n".join(
        [
            "| host memory of the saves above the process's before them, / the state's bytes | peak | steady | "
            "training stall per save / host copy |",
            "| --- | ---: | ---: | ---: |",
            *(
                f"| {m['state_mb']:.0f} MB state, a base then deltas"
                f"{', reuse_buffers=True' if m.get('reuse') else ''} (after a first save's fixed "
                f"{m.get('fixed_mb', 0):.0f} MB: imports, threads) | {m['peak']:.2f}x | "
                f"{_spread(m['steady'], unit='x')} | {stall(m)} |"
                for m in rows
            ),
        ]
    )


def small_tensors(quick: bool, repeat: int) -> dict[str, Any]:
    """10,000 tensors of 1 KB: save speed of a full checkpoint (3 fresh Checkpointers) and of a delta, the
    manifest's size after 1 and after 9 deltas (``quick``: 4; chains of one: the same), and the restore time;
    ``torch.save`` and ``torch.load`` of the same state alongside, interleaved with ours."""
    g = torch.Generator().manual_seed(0)
    state = {f"t{i}": torch.randn(256, generator=g) for i in range(10_000)}
    raw = sum(t.nbytes for t in state.values())
    work = Path(tempfile.mkdtemp(prefix="gnb-ckpt-small-"))
    ts_file = work / "torch.pt"
    full_s, delta_s, restore_s, ts_save_s, ts_load_s = [], [], [], [], []
    manifests: dict[int, int] = {}
    try:
        depth = 3 if quick else 9
        for j in range(2 if quick else max(3, repeat)):
            with Checkpointer(work / str(j), progress=False, preemption=None) as ck:
                full_s.append(_time(lambda: ck.save(state, 0).result()))  # noqa: B023
                for step in range(1, depth + 1 if j == 0 else 2):
                    for t in list(state.values())[step::7]:
                        t.add_(1e-3)
                    t0 = time.perf_counter()
                    info = ck.save(state, step).result()
                    delta_s.append(time.perf_counter() - t0)
                    assert info is not None
                    if j == 0 and step in (1, depth):
                        manifests[step] = (work / "0" / "manifests" / f"{info.id}.json").stat().st_size
                got = ck.restore()
                assert all(torch.equal(got[k], v) for k, v in list(state.items())[:50])
                # torch.save of the state just restored, loaded right after, beside our restore
                ts_save_s.append(_time(lambda: torch.save(state, ts_file)))
                ts_load_s.append(_time(lambda: torch.load(ts_file, weights_only=True)))
                restore_s.append(_time(lambda: ck.restore()))  # noqa: B023
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "full_mb_s": [raw / t / 1e6 for t in full_s],
        "delta_mb_s": [raw / t / 1e6 for t in delta_s],
        "manifest_kb": {"1": manifests[1] / 1024, "n": manifests[depth] / 1024, "depth": depth},
        "restore_s": restore_s,
        "torch_save_mb_s": [raw / t / 1e6 for t in ts_save_s],
        "torch_load_s": ts_load_s,
    }


def small_table(r: dict[str, Any]) -> str:
    mk = r["manifest_kb"]
    per_run = ratios(r["restore_s"], r["torch_load_s"])
    return "\n".join(
        [
            f"| 10,000 tensors of 1 KB | save MB/s, full | save MB/s, delta | manifest after 1 / {mk['depth']} deltas "
            "| restore s | restore / torch.load |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            f"| ours | {_spread(r['full_mb_s'], '{:.0f}')} | {_spread(r['delta_mb_s'], '{:.0f}')} | "
            f"{mk['1']:.0f} / {mk['n']:.0f} KB | {_spread(r['restore_s'], '{:.3f}')} | {_spread(per_run, unit='x')} |",
            f"| torch.save / torch.load | {_spread(r['torch_save_mb_s'], '{:.0f}')} | - | - | "
            f"{_spread(r['torch_load_s'], '{:.3f}')} | 1.00x |",
        ]
    )
