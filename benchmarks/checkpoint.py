"""Checkpoint benchmark: bytes written per checkpoint, save and restore time, side by side.

A small byte-level GPT (about 3 M parameters, AdamW) trains on CPU on CPython's own standard library
sources (no download). For each workload the *same* training state is checkpointed by

* ``torch.save`` (the normaliser), ``torch.save`` + zstd (level 3), safetensors (tensors) + JSON,
  ``torch.distributed.checkpoint`` (single process, FileSystemWriter),
* ours, full (a fresh store: what the first checkpoint of a run costs),
* ours, delta: the steady state of a run. The store holds a base checkpoint and a first delta (two and one
  intervals earlier); the measured save is the next delta. Its save speed is reported together with the
  first delta's, which also searches each chunk's encoding (later saves reuse the choice).

Save times are the best of 3 runs for every method (ours: twin Checkpointers that saved the same states into
their own stores).
Restore times are the best of 5 interleaved runs: ``torch.load`` of the ``torch.save`` file from the local disk
against ours from the local store (the delta, i.e. its whole chain, and the full checkpoint), each from a fresh
``Checkpointer``; the same again (best of 3) from a cold page cache (every file dropped from the cache first with
``posix_fadvise``, as on a restarted machine; Linux only); and, from S3 (a moto server on loopback, in a
child process), ``torch.load`` of the file plus downloading it with boto3 (the faster of one ``get_object`` and
the managed ``download_fileobj``, whose parallel ranged GETs are what a big file on AWS wants but cost moto a
whole-object read each) against ours from a copy of the store on the same server.

Workloads: (a) full training in fp32 and in pure bf16 (parameters and AdamW state in bf16), checkpoints
every 10 and every 100 steps (after a short warm-up at a higher learning rate, as in fine-tuning);
(b) fine-tuning with most layers frozen; (c) full fine-tuning of the warmed-up model with a small learning rate.

Run: ``python benchmarks/checkpoint.py`` (about 3 minutes on 2 cores); ``--quick`` for a smoke run,
``--no-s3`` without the S3 restore, ``--no-sweep`` without the last table: the bytes and restore time that
``max_restore_ratio`` trades (one run per dtype saved by Checkpointers that differ only in it).
Numbers are wall-clock on whatever machine runs it; rerun before quoting them.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_notebook.checkpoint import Checkpointer  # noqa: E402

CTX = 128
REPEAT = 3  # restore timings: best of this many runs
REPEAT_LOCAL = 5  # ... for the (fast) local restores of torch.save's file and of ours
#: our saves: the best of this many identical runs (twin Checkpointers that saved the same states, each into its
#: own store; a single timing on a shared machine is too easily disturbed), the first twin's checkpoint restored
SAVE_TWINS = 3
SEQ, BATCH = 64, 4  # training sequences: small, so that the whole benchmark runs in a few minutes on 2 cores


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, d: int = 256, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Embedding(CTX, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        mask = torch.triu(torch.full((t, t), float("-inf"), dtype=x.dtype), 1)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def corpus(limit: int = 4_000_000) -> torch.Tensor:
    root = Path(sysconfig.get_paths()["stdlib"])
    buf = bytearray()
    for p in sorted(root.glob("*.py")):
        buf += p.read_bytes()
        if len(buf) > limit:
            break
    return torch.frombuffer(bytearray(buf), dtype=torch.uint8).long()


def train(
    model: nn.Module, opt: torch.optim.Optimizer, data: torch.Tensor, steps: int, g: torch.Generator
) -> float:
    loss = torch.tensor(0.0)
    for _ in range(steps):
        ix = torch.randint(0, data.numel() - SEQ - 1, (BATCH,), generator=g)
        x = torch.stack([data[i : i + SEQ] for i in ix])
        y = torch.stack([data[i + 1 : i + SEQ + 1] for i in ix])
        logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


# ------------------------------------------------------------------------------------------- baselines
def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _flat_tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(_flat_tensors(v, f"{prefix}{k}."))
    elif isinstance(state, list | tuple):
        for i, v in enumerate(state):
            out.update(_flat_tensors(v, f"{prefix}{i}."))
    elif isinstance(state, torch.Tensor):
        out[prefix[:-1]] = state.detach().clone().contiguous()
    return out


def bench_baselines(sd: dict[str, Any], work: Path) -> dict[str, dict[str, float]]:
    import safetensors.torch
    import torch.distributed.checkpoint as dcp
    import zstandard

    res: dict[str, dict[str, float]] = {}
    f = work / "ts.pt"
    ts = _best(lambda: torch.save(sd, f), SAVE_TWINS)  # (each rewrites the file)
    res["torch.save"] = {
        "bytes": f.stat().st_size,
        "save_s": ts,
        "restore_s": math.nan,  # measured in measure(), interleaved with ours
    }

    def save_zstd() -> None:
        b = io.BytesIO()
        torch.save(sd, b)
        (work / "ts.pt.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(b.getvalue()))

    ts = _best(save_zstd, SAVE_TWINS)
    comp = (work / "ts.pt.zst").read_bytes()
    t0 = time.perf_counter()
    raw = zstandard.ZstdDecompressor().decompress((work / "ts.pt.zst").read_bytes())
    torch.load(io.BytesIO(raw), weights_only=True)
    res["torch.save+zstd3"] = {"bytes": len(comp), "save_s": ts, "restore_s": time.perf_counter() - t0}

    flat = _flat_tensors(sd)
    ts = _best(lambda: safetensors.torch.save_file(flat, str(work / "st.safetensors")), SAVE_TWINS)
    t0 = time.perf_counter()
    safetensors.torch.load_file(str(work / "st.safetensors"))
    res["safetensors"] = {
        "bytes": (work / "st.safetensors").stat().st_size,
        "save_s": ts,
        "restore_s": time.perf_counter() - t0,
    }

    d = work / "dcp"
    ts = math.inf
    for j in range(SAVE_TWINS):  # each into its own folder
        t0 = time.perf_counter()
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(d if j == 0 else work / f"dcp-{j}")))
        ts = min(ts, time.perf_counter() - t0)
    target = _clone_struct(sd)
    t0 = time.perf_counter()
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(d)))
    res["torch.distributed.checkpoint"] = {
        "bytes": _dir_bytes(d),
        "save_s": ts,
        "restore_s": time.perf_counter() - t0,
    }
    return res


def _clone_struct(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clone_struct(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone_struct(v) for v in x]
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    return x


def ours(ck: Checkpointer, state: dict[str, Any], step: int) -> dict[str, float]:
    t0 = time.perf_counter()
    h = ck.save(state, step)
    stall = time.perf_counter() - t0
    info = h.result()
    total = time.perf_counter() - t0
    assert info is not None
    got = ck.restore(info.id)
    # lossless check against the live state
    for k, v in state["model"].state_dict().items():
        assert torch.equal(got["model"][k].view(torch.uint8), v.detach().contiguous().view(torch.uint8)), k
    return {
        "bytes": info.new_bytes,
        "save_s": total,
        "stall_s": stall,
        "restore_s": math.nan,  # measured in measure(), interleaved with torch.load
        "raw": info.raw_bytes,
        "id": info.id,  # type: ignore[dict-item]
    }


def evict(files: list[Path]) -> None:
    """Drop files from the page cache (written back first: only clean pages can be dropped)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _best(fn: Any, n: int = REPEAT) -> float:
    """Best wall time of ``n`` runs (the machine is shared: the minimum is the least disturbed run)."""
    best = math.inf
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------------------------------- S3 restore
class S3Bench:
    """A moto S3 server on loopback (in a child process, so that it does not share our GIL)."""

    def __init__(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "checkpoint"))
        from _s3server import S3Server, fake_credentials

        for k, v in fake_credentials().items():
            os.environ.setdefault(k, v)
        self.srv = S3Server(subprocess=True).start()
        self.client = self.srv.client()
        self.bucket = "bench"
        self.client.create_bucket(Bucket=self.bucket)
        self.n = 0

    def close(self) -> None:
        self.srv.stop()

    def restore(
        self, ts_file: Path, targets: dict[str, tuple[Path, str]], ref: dict[str, Any]
    ) -> dict[str, float]:
        """Restore time from S3: ``torch.load`` of the file plus its download, against ours for each target
        (label -> (local store folder, checkpoint id)); all interleaved, best of ``REPEAT``."""
        self.n += 1
        key = f"ts/{self.n}.pt"
        self.client.upload_file(str(ts_file), self.bucket, key)
        cks = {}
        for label, (ck_dir, ckpt_id) in targets.items():
            prefix = f"ours/{self.n}-{len(cks)}"
            for f in ck_dir.rglob("*"):
                if f.is_file():
                    self.client.upload_file(
                        str(f), self.bucket, f"{prefix}/{f.relative_to(ck_dir).as_posix()}"
                    )
            cks[label] = (
                Checkpointer(f"s3://{self.bucket}/{prefix}", endpoint_url=self.srv.endpoint),
                ckpt_id,
            )

        def baseline_managed() -> None:  # boto3's managed transfer: parallel ranged GETs of 8 MB parts
            buf = io.BytesIO()
            self.client.download_fileobj(self.bucket, key, buf)
            buf.seek(0)
            torch.load(buf, weights_only=True)

        def baseline_get() -> None:  # one GET: faster on moto, which reads the whole object for every range
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            torch.load(io.BytesIO(body), weights_only=True)

        def mine(ck: Checkpointer, ckpt_id: str) -> None:
            got = ck.restore(ckpt_id)
            assert torch.equal(got["model"][ref["k"]].view(torch.uint8), ref["v"].view(torch.uint8))

        best = {"torch.load+download": math.inf, **{label: math.inf for label in cks}}
        for _ in range(REPEAT):  # interleaved
            # the baseline is the faster way to download the file (both measured, interleaved)
            best["torch.load+download"] = min(
                best["torch.load+download"], _best(baseline_managed, 1), _best(baseline_get, 1)
            )
            for label, (ck, ckpt_id) in cks.items():
                best[label] = min(best[label], _best(lambda: mine(ck, ckpt_id), 1))  # noqa: B023
        for ck, _ in cks.values():
            ck.close()
        return best


# ------------------------------------------------------------------------------------------- workloads
def run(quick: bool, s3: S3Bench | None) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = corpus()
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="gnb-ckpt-bench-"))
    warm, long_iv = (5, 20) if quick else (30, 100)

    def interval_run(
        label: str, model: nn.Module, opt: torch.optim.Optimizer, step: int, interval: int, n_params: int
    ) -> None:
        """Base checkpoint, a first delta one interval later, then the measured (steady-state) delta."""
        cks = [Checkpointer(work / f"ck-{len(rows)}-{j}", full_every=10) for j in range(SAVE_TWINS)]
        state = {"model": model, "optim": opt, "step": step}
        for ck in cks:
            ck.save(state, step).result()
        train(model, opt, data, interval, g)
        state["step"] = step + interval
        first_s = math.inf
        for ck in cks:
            t0 = time.perf_counter()
            first = ck.save(state, step + interval).result()
            first_s = min(first_s, time.perf_counter() - t0)
            assert first is not None
        train(model, opt, data, interval, g)
        state["step"] = step + 2 * interval
        rows.extend(measure(label, state, cks, work, n_params, s3, first.raw_bytes / first_s / 1e6))
        for ck in cks:
            ck.close()

    try:
        pretrained: dict[str, torch.Tensor] | None = None
        pretrained_opt: dict[str, Any] | None = None
        for dtype in (torch.float32, torch.bfloat16):
            name = "fp32" if dtype == torch.float32 else "bf16"
            for interval in (10, long_iv):
                torch.manual_seed(0)
                model = TinyGPT()
                if dtype == torch.bfloat16:
                    model = model.to(torch.bfloat16)
                n_params = sum(p.numel() for p in model.parameters())
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
                train(model, opt, data, warm, g)  # warm-up ("pre-training")
                for pg in opt.param_groups:
                    pg["lr"] = 1e-4  # then fine-tuning-like learning rate
                interval_run(f"(a) {name}, every {interval} steps", model, opt, warm, interval, n_params)
                if dtype == torch.float32 and interval == long_iv:  # the "pretrained" model of (b) and (c)
                    pretrained = {k: v.clone() for k, v in model.state_dict().items()}
                    pretrained_opt = copy.deepcopy(opt.state_dict())
        # (b) fine-tuning with most layers frozen
        assert pretrained is not None
        model = TinyGPT()
        model.load_state_dict(pretrained)
        for p in model.parameters():
            p.requires_grad_(False)
        last: Any = model.blocks[-1]
        trainable: list[torch.Tensor] = [last.attn.out_proj.weight, model.ln.weight, model.ln.bias]
        for t in trainable:
            t.requires_grad_(True)
        frac = sum(t.numel() for t in trainable) / sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(trainable, lr=1e-4)
        train(model, opt, data, 3, g)
        interval_run(
            f"(b) frozen ({100 * frac:.1f}% trainable), every 10 steps",
            model,
            opt,
            3,
            10,
            sum(p.numel() for p in model.parameters()),
        )
        # (c) full fine-tuning of the warmed-up model with a small learning rate: with a fresh AdamW (its moments
        # still growing fast) and continuing the run's own AdamW
        for label, opt_state in (("fresh AdamW", None), ("AdamW continued", pretrained_opt)):
            model = TinyGPT()
            model.load_state_dict(pretrained)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
            if opt_state is not None:
                opt.load_state_dict(opt_state)
                for pg in opt.param_groups:
                    pg["lr"] = 1e-5
            train(model, opt, data, 10, g)
            n_params = sum(p.numel() for p in model.parameters())
            interval_run(f"(c) fp32 at lr 1e-5, {label}, every 10 steps", model, opt, 10, 10, n_params)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def policy_sweep(quick: bool) -> list[dict[str, Any]]:
    """The trade-off between bytes and restore speed that ``max_restore_ratio`` sets: one training run per dtype
    (checkpoint every 10 steps), each state saved by Checkpointers that differ only in it; for each, the bytes of
    every checkpoint after the first (a full base for all) and the local restore time of every checkpoint (best
    of 3), against ``torch.save``'s file of the same state and ``torch.load`` of it (page cache)."""
    g = torch.Generator().manual_seed(1)
    data = corpus()
    ratios = (1.2, 2.0, 3.0)
    n_saves = 5 if quick else 10
    out: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="gnb-ckpt-sweep-"))
    try:
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            model = TinyGPT() if dtype == torch.float32 else TinyGPT().to(torch.bfloat16)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
            train(model, opt, data, 5 if quick else 30, g)
            for pg in opt.param_groups:
                pg["lr"] = 1e-4
            cks = {
                r: Checkpointer(work / f"{dtype}-{r}", max_restore_ratio=r, progress=False) for r in ratios
            }
            ids: dict[float, list[str]] = {r: [] for r in ratios}
            new: dict[float, list[int]] = {r: [] for r in ratios}
            ts_bytes, ts_load = [], []
            state = {"model": model, "optim": opt, "step": 0}
            for i in range(n_saves):
                if i:
                    train(model, opt, data, 10, g)
                state["step"] = 10 * i
                for r, ck in cks.items():
                    info = ck.save(state, 10 * i).result()
                    assert info is not None
                    ids[r].append(info.id)
                    new[r].append(info.new_bytes)
                f = work / f"ts-{dtype}-{i}.pt"
                torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
                ts_bytes.append(f.stat().st_size)
                ts_load.append(_best(lambda: torch.load(f, weights_only=True), REPEAT))  # noqa: B023
            for r, ck in cks.items():
                rd = Checkpointer(Path(ck.store.root), progress=False)  # type: ignore[attr-defined]
                rel = [_best(lambda: rd.restore(c), REPEAT) / t for c, t in zip(ids[r], ts_load, strict=True)]  # noqa: B023
                rd.close()
                out.append(
                    {
                        "dtype": "fp32" if dtype == torch.float32 else "bf16",
                        "max_restore_ratio": r,
                        "bytes": sum(new[r][1:]) / sum(ts_bytes[1:]),
                        "bases": sum(1 for c in ck.list() if c.is_base) - 1,
                        "saves": n_saves - 1,
                        "restore_mean": sum(rel) / len(rel),
                        "restore_worst": max(rel),
                    }
                )
                ck.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def sweep_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| state | max_restore_ratio | bytes per checkpoint (saves 2 to n) | full bases among them | "
        "local restore time / torch.load: mean, worst |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['dtype']}, every 10 steps | {r['max_restore_ratio']:g} | {r['bytes']:.3f} | "
            f"{r['bases']} of {r['saves']} | {r['restore_mean']:.2f}x, {r['restore_worst']:.2f}x |"
        )
    return "\n".join(out)


def measure(
    label: str,
    state: dict[str, Any],
    cks_delta: list[Checkpointer],
    work: Path,
    n_params: int,
    s3: S3Bench | None,
    first_mb_s: float,
) -> list[dict[str, Any]]:
    sd = {"model": state["model"].state_dict(), "optim": state["optim"].state_dict(), "step": state["step"]}
    tag = abs(hash(label))
    bdir = work / f"base-{tag}"
    bdir.mkdir()
    res = bench_baselines(sd, bdir)
    ck_delta = cks_delta[0]
    ck_full = Checkpointer(work / f"full-{tag}")
    full = ours(ck_full, state, state["step"])
    delta = ours(ck_delta, state, state["step"])
    for j in range(1, len(cks_delta)):  # the same saves again (twins): the best time
        twin_full = Checkpointer(work / f"full-{tag}-{j}")
        for mine, ck in ((full, twin_full), (delta, cks_delta[j])):
            again = ours(ck, state, state["step"])
            mine["save_s"] = min(mine["save_s"], again["save_s"])
            mine["stall_s"] = min(mine["stall_s"], again["stall_s"])
        twin_full.close()
    res["ours, full"] = full
    res["ours, delta"] = delta
    delta["first_mb_s"] = first_mb_s
    if s3 is not None:
        k0, v0 = next(iter(state["model"].state_dict().items()))
        ref = {"k": k0, "v": v0.detach().contiguous()}
        targets = {
            "delta": (Path(ck_delta.store.root), str(delta["id"])),  # type: ignore[attr-defined]
            "full": (Path(ck_full.store.root), str(full["id"])),  # type: ignore[attr-defined]
        }
        got = s3.restore(bdir / "ts.pt", targets, ref)
        res["torch.save"]["s3_restore_s"] = got["torch.load+download"]
        delta["s3_restore_s"] = got["delta"]
        full["s3_restore_s"] = got["full"]
    # local restores again, interleaved and from fresh Checkpointers (as a new process would): on a shared
    # machine alternating runs see the same disturbances
    ts_file = bdir / "ts.pt"
    readers = {
        "ours, delta": (Checkpointer(Path(ck_delta.store.root), progress=False), str(delta["id"])),  # type: ignore[attr-defined]
        "ours, full": (Checkpointer(Path(ck_full.store.root), progress=False), str(full["id"])),  # type: ignore[attr-defined]
    }
    best = {"torch.save": math.inf, **{k: math.inf for k in readers}}
    for _ in range(REPEAT_LOCAL):
        best["torch.save"] = min(best["torch.save"], _best(lambda: torch.load(ts_file, weights_only=True), 1))
        for k, (rd, cid) in readers.items():
            best[k] = min(best[k], _best(lambda: rd.restore(cid), 1))  # noqa: B023
    for k, v in best.items():
        res[k]["restore_s"] = v
    # the same from a cold page cache (what a restarted machine reads from its disk): every file of the run is
    # dropped from the cache before each restore
    if hasattr(os, "posix_fadvise"):
        files = {
            "torch.save": [ts_file],
            **{
                k: [f for f in Path(rd.store.root).rglob("*") if f.is_file()]
                for k, (rd, _) in readers.items()
            },  # type: ignore[attr-defined]
        }
        cold = {k: math.inf for k in files}
        for _ in range(REPEAT):
            evict(files["torch.save"])
            cold["torch.save"] = min(
                cold["torch.save"], _best(lambda: torch.load(ts_file, weights_only=True), 1)
            )
            for k, (rd, cid) in readers.items():
                evict(files[k])
                fresh = Checkpointer(Path(rd.store.root), progress=False)  # type: ignore[attr-defined]
                cold[k] = min(cold[k], _best(lambda: fresh.restore(cid), 1))  # noqa: B023
                fresh.close()
        for k, v in cold.items():
            res[k]["cold_restore_s"] = v
    for rd, _ in readers.values():
        rd.close()
    shutil.rmtree(bdir, ignore_errors=True)
    ref_bytes = res["torch.save"]["bytes"]
    rows = []
    for method, r in res.items():
        rows.append(
            {
                "workload": label,
                "params": n_params,
                "method": method,
                "bytes": int(r["bytes"]),
                "ratio": r["bytes"] / ref_bytes,
                "save_s": r["save_s"],
                "mb_s": (full["raw"] / r["save_s"] / 1e6) if r["save_s"] > 0 else math.inf,
                "stall_s": r.get("stall_s"),
                "restore_s": r["restore_s"],
                "cold_restore_s": r.get("cold_restore_s"),
                "s3_restore_s": r.get("s3_restore_s"),
                "first_mb_s": r.get("first_mb_s"),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Every method of every workload."""
    head = (
        "| workload | method | bytes written | ratio to torch.save | save s | save MB/s of state | "
        "training stall s | restore s (local) | restore s (local, cold cache) | restore s (S3) |"
    )
    out = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        stall = f"{r['stall_s']:.3f}" if r["stall_s"] is not None else ""
        s3 = f"{r['s3_restore_s']:.3f}" if r.get("s3_restore_s") is not None else ""
        cold = f"{r['cold_restore_s']:.3f}" if r.get("cold_restore_s") is not None else ""
        out.append(
            f"| {r['workload']} | {r['method']} | {r['bytes'] / 1e6:.2f} MB | {r['ratio']:.3f} | {r['save_s']:.3f} | "
            f"{r['mb_s']:.0f} | {stall} | {r['restore_s']:.3f} | {cold} | {s3} |"
        )
    return "\n".join(out)


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per workload: bytes as a ratio to torch.save, our save speed and stall, restore times."""
    head = (
        "| workload | torch.save+zstd | safetensors | torch.distributed.checkpoint | ours, full | ours, delta | "
        "our save MB/s | training stall | restore, local: torch.load / ours delta / ours full | "
        "restore, local, cold cache: same | restore, S3: torch.load + download / ours delta / ours full |"
    )
    out = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["method"]] = r
    for wl, m in by.items():
        d, ts, f = m["ours, delta"], m["torch.save"], m["ours, full"]
        s3 = (
            f"{ts['s3_restore_s']:.3f} / {d['s3_restore_s']:.3f} / {f['s3_restore_s']:.3f} s"
            if d.get("s3_restore_s") is not None and ts.get("s3_restore_s") is not None
            else "-"
        )
        cold = (
            f"{ts['cold_restore_s']:.3f} / {d['cold_restore_s']:.3f} / {f['cold_restore_s']:.3f} s"
            if d.get("cold_restore_s") is not None and ts.get("cold_restore_s") is not None
            else "-"
        )
        out.append(
            f"| {wl} | {m['torch.save+zstd3']['ratio']:.3f} | {m['safetensors']['ratio']:.3f} | "
            f"{m['torch.distributed.checkpoint']['ratio']:.3f} | {m['ours, full']['ratio']:.3f} | "
            f"{d['ratio']:.3f} | {d['mb_s']:.0f} ({d['first_mb_s']:.0f} first) | {1e3 * d['stall_s']:.0f} ms | "
            f"{ts['restore_s']:.3f} / {d['restore_s']:.3f} / {f['restore_s']:.3f} s | {cold} | {s3} |"
        )
    return "\n".join(out)


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer training steps (smoke run)")
    ap.add_argument(
        "--no-s3", action="store_true", help="skip the restore from S3 (a moto server on loopback)"
    )
    ap.add_argument("--no-sweep", action="store_true", help="skip the max_restore_ratio sweep")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()
    t0 = time.time()
    s3 = None if args.no_s3 else S3Bench()
    try:
        rows = run(args.quick, s3)
    finally:
        if s3 is not None:
            s3.close()
    print(table(rows))
    print()
    print(summary(rows))
    sweep = [] if args.no_sweep else policy_sweep(args.quick)
    if sweep:
        print()
        print(sweep_table(sweep))
    print(f"\n{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, {time.time() - t0:.0f} s total")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "sweep": sweep}, indent=1))


if __name__ == "__main__":
    main()
