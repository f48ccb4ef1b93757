"""Checkpoint benchmark: bytes written per checkpoint, save and restore time, side by side.

A small byte-level GPT (about 3 M parameters, AdamW) trains on CPU on CPython's own standard library
sources (no download). For each workload the *same* training state is checkpointed by

* ``torch.save`` (the normaliser), ``torch.save`` + zstd (level 3), safetensors (tensors) + JSON,
  ``torch.distributed.checkpoint`` (single process, FileSystemWriter),
* ours, full (a fresh store: what the first checkpoint of a run costs),
* ours through DCP: ``dcp.save`` with our ``DCPWriter`` (gpu_notebook.checkpoint.dcp), a writer kept over the
  same saves as the delta Checkpointer, so its measured save is a delta too (bytes; one save and load timed),
* ours, delta: the steady state of a run. The store holds a base checkpoint and a first delta (two and one
  intervals earlier); the measured save is the next delta. Its save speed is reported together with the
  first delta's, which also searches each chunk's encoding (later saves reuse the choice).

Every time is the median of at least 3 runs, shown with its spread ``[min-max]``; runs that are compared are
interleaved (on a shared machine alternating runs see the same disturbances) and the ratios are taken per
interleaved run. Save times: 3 runs for every method (ours: twin Checkpointers that saved the same states into
their own stores). Restore: ``torch.load`` of the ``torch.save`` file from the local disk against ours from the
local store (the delta, i.e. its base and itself, and the full checkpoint), each from a fresh ``Checkpointer``;
the same again from a cold page cache (every file dropped from the cache first with ``posix_fadvise``, as on a
restarted machine; Linux only); and, from S3 (a moto server on loopback, in a child process), ``torch.load`` of
the file plus downloading it with boto3 (the faster of one ``get_object`` and the managed ``download_fileobj``,
whose parallel ranged GETs are what a big file on AWS wants but cost moto a whole-object read each) against ours
from a copy of the store on the same server. Training stall is set against a plain host copy of the same state
(``clone()`` of every tensor, one taken after each of the saves, interleaved with them; in brackets the later
of clones in a row, whose source the one before had just read, into the memory it had just freed), and the CPU
time a save takes from the process (its threads' scheduler counters, ``stats.cpu_s``) is reported per save.

The runs table: one training run per state (fp32, bf16, frozen fine-tuning), a checkpoint every 10 steps, each
saved by Checkpointers that differ only in how deltas chain; ALL bytes written over the run (bases included) per
checkpoint after the first, against ``torch.save``'s file of the same state, and every checkpoint's local restore
time against ``torch.load`` of that file. Then host memory during saves (the process's resident set above what it
was before the Checkpointer, sampled every 2 ms, as a multiple of the state's bytes: peak and steady, i.e. after
the saves, with each save's training stall next to a plain host copy; the 40 MB state also with
``reuse_buffers=True``), and 10,000 tensors of 1 KB (save speed, manifest size at chain depth 1 and 9, restore time,
``torch.save`` and ``torch.load`` of the same state alongside).

Workloads: (a) full training in fp32 and in pure bf16 (parameters and AdamW state in bf16), checkpoints
every 10 and every 100 steps (after a short warm-up at a higher learning rate, as in fine-tuning);
(b) fine-tuning with most layers frozen; (c) full fine-tuning of the warmed-up model with a small learning rate.

Run: ``python benchmarks/checkpoint.py`` (about 4 minutes on 2 cores); ``--quick`` for a smoke run,
``--no-s3`` without the S3 restore, ``--no-sweep`` without the runs, memory and small-tensor tables.
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
import subprocess
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

import _checkpoint_runs as R  # noqa: E402
from _checkpoint_runs import med, ratios, spread  # noqa: E402
from _checkpoint_runs import timed as _time  # noqa: E402

from gpu_notebook.checkpoint import Checkpointer  # noqa: E402

CTX = 128
REPEAT = 3  # restore timings: the median of this many interleaved runs (shown with their spread)
#: our saves: the median of this many identical runs (twin Checkpointers that saved the same states, each into its
#: own store; a single timing on a shared machine is too easily disturbed), the first twin's checkpoint restored
SAVE_TWINS = 3
COLD = True  # also restore from a cold page cache (not in a smoke run)
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
    ts = med([_time(lambda: torch.save(sd, f)) for _ in range(SAVE_TWINS)])  # (each rewrites the file)
    res["torch.save"] = {
        "bytes": f.stat().st_size,
        "save_s": ts,
        "restore_s": math.nan,  # measured in measure(), interleaved with ours
    }

    def save_zstd() -> None:
        b = io.BytesIO()
        torch.save(sd, b)
        (work / "ts.pt.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(b.getvalue()))

    ts = med([_time(save_zstd) for _ in range(SAVE_TWINS)])
    comp = (work / "ts.pt.zst").read_bytes()
    t0 = time.perf_counter()
    raw = zstandard.ZstdDecompressor().decompress((work / "ts.pt.zst").read_bytes())
    torch.load(io.BytesIO(raw), weights_only=True)
    res["torch.save+zstd3"] = {"bytes": len(comp), "save_s": ts, "restore_s": time.perf_counter() - t0}

    flat = _flat_tensors(sd)
    ts = med(
        [
            _time(lambda: safetensors.torch.save_file(flat, str(work / "st.safetensors")))
            for _ in range(SAVE_TWINS)
        ]
    )
    t0 = time.perf_counter()
    safetensors.torch.load_file(str(work / "st.safetensors"))
    res["safetensors"] = {
        "bytes": (work / "st.safetensors").stat().st_size,
        "save_s": ts,
        "restore_s": time.perf_counter() - t0,
    }

    d = work / "dcp"
    dcp_times = []
    for j in range(SAVE_TWINS):  # each into its own folder
        t0 = time.perf_counter()
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(d if j == 0 else work / f"dcp-{j}")))
        dcp_times.append(time.perf_counter() - t0)
    ts = med(dcp_times)
    target = _clone_struct(sd)
    t0 = time.perf_counter()
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(d)))
    res["torch.distributed.checkpoint"] = {
        "bytes": _dir_bytes(d),
        "save_s": ts,
        "restore_s": time.perf_counter() - t0,
    }
    return res


class OursDCP:
    """``dcp.save`` / ``dcp.load`` through our DCPWriter / DCPReader, one writer kept over a run's saves."""

    def __init__(self, root: Path) -> None:
        from gpu_notebook.checkpoint.dcp import DCPWriter

        self.root = root
        self.writer = DCPWriter(root)
        self.save_s = math.nan

    @staticmethod
    def state_dict(state: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": state["model"].state_dict(),
            "optim": state["optim"].state_dict(),
            "step": state["step"],
        }

    def save(self, state: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        dcp.save(self.state_dict(state), storage_writer=self.writer, no_dist=True)
        self.save_s = time.perf_counter() - t0

    def row(
        self, label: str, state: dict[str, Any], n_params: int, rows: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The measured save (a delta against the two before it) as a row like measure()'s."""
        import torch.distributed.checkpoint as dcp

        from gpu_notebook.checkpoint.dcp import DCPReader

        self.save(state)
        target = _clone_struct(self.state_dict(state))
        restore_s = _time(lambda: dcp.load(target, storage_reader=DCPReader(self.root), no_dist=True))
        for k, v in state["model"].state_dict().items():  # lossless
            assert torch.equal(
                target["model"][k].view(torch.uint8), v.detach().contiguous().view(torch.uint8)
            ), k
        ref = next(r for r in rows if r["method"] == "torch.save")
        nbytes = self.writer.last_written_bytes
        return {
            "workload": label,
            "params": n_params,
            "method": "ours through DCP, delta",
            "bytes": nbytes,
            "ratio": nbytes / ref["bytes"],
            "save_s": self.save_s,
            "save_runs": [self.save_s],
            "mb_s": self.writer.last_logical_bytes / self.save_s / 1e6,
            "stall_s": None,
            "cpu_s": None,
            "host_copy_s": None,
            "restore_s": restore_s,
            "restore_runs": [restore_s],
            "cold_restore_runs": None,
            "s3_restore_runs": None,
            "first_mb_s": None,
        }


def _clone_struct(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clone_struct(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone_struct(v) for v in x]
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    return x


def ours(ck: Checkpointer, state: dict[str, Any], step: int) -> dict[str, Any]:
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
        "save_s": [total],
        "stall_s": [stall],
        "cpu_s": [float(info.extra["stats"].get("cpu_s", math.nan))],
        "raw": info.raw_bytes,
        "id": info.id,
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


def host_copy_s(sd: dict[str, Any], n: int = 1) -> list[float]:
    """``n`` plain host copies of the state in a row (``clone()`` of every tensor, each dropped): the least a
    snapshot costs. The stall is set against one at a time, taken between the saves (each after a save and its
    restore, as each save is); until 2026-12-05 against three in a row, the later two of a source the first had
    just read and into the memory it had just freed (still shown, in brackets)."""
    return R.host_copy_s(list(_flat_tensors(sd).values()), n)


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
    ) -> dict[str, list[float]]:
        """Restore times from S3: ``torch.load`` of the file plus its download, against ours for each target
        (label -> (local store folder, checkpoint id)); all interleaved, ``REPEAT`` runs each."""
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

        times: dict[str, list[float]] = {"torch.load+download": [], **{label: [] for label in cks}}
        for _ in range(REPEAT):  # interleaved
            # the baseline is the faster way to download the file (both measured, interleaved)
            times["torch.load+download"].append(min(_time(baseline_managed), _time(baseline_get)))
            for label, (ck, ckpt_id) in cks.items():
                times[label].append(_time(lambda: mine(ck, ckpt_id)))  # noqa: B023
        for ck, _ in cks.values():
            ck.close()
        return times


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
        cks = [
            Checkpointer(work / f"ck-{len(rows)}-{j}", full_every=10, progress=False)
            for j in range(SAVE_TWINS)
        ]
        state = {"model": model, "optim": opt, "step": step}
        dcp_ours = OursDCP(work / f"dcp-ours-{len(rows)}")
        for ck in cks:
            ck.save(state, step).result()
        dcp_ours.save(state)
        train(model, opt, data, interval, g)
        state["step"] = step + interval
        first_s = []
        for ck in cks:
            t0 = time.perf_counter()
            first = ck.save(state, step + interval).result()
            first_s.append(time.perf_counter() - t0)
            assert first is not None
        dcp_ours.save(state)
        train(model, opt, data, interval, g)
        state["step"] = step + 2 * interval
        measured = measure(label, state, cks, work, n_params, s3, first.raw_bytes / med(first_s) / 1e6)
        rows.extend(measured + [dcp_ours.row(label, state, n_params, measured)])
        for ck in cks:
            ck.close()

    try:
        pretrained: dict[str, torch.Tensor] | None = None
        pretrained_opt: dict[str, Any] | None = None
        for dtype in (torch.float32, torch.bfloat16):
            name = "fp32" if dtype == torch.float32 else "bf16"
            intervals = (10,) if quick else (10, long_iv)  # (a smoke run: the long interval is left out)
            for interval in intervals:
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
                if dtype == torch.float32 and interval == intervals[-1]:  # the "pretrained" model of (b), (c)
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
        variants = (("fresh AdamW", None), ("AdamW continued", pretrained_opt))
        for label, opt_state in variants[1:] if quick else variants:
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
    res: dict[str, dict[str, Any]] = bench_baselines(sd, bdir)  # type: ignore[assignment]
    ck_delta = cks_delta[0]
    ck_full = Checkpointer(work / f"full-{tag}", progress=False)
    full = ours(ck_full, state, state["step"])
    # the host copies: one right after each save and its restore (the point of the loop where each save is taken)
    copies = host_copy_s(sd)
    delta = ours(ck_delta, state, state["step"])
    copies += host_copy_s(sd)
    for j in range(1, len(cks_delta)):  # the same saves again (twins), interleaved
        twin_full = Checkpointer(work / f"full-{tag}-{j}", progress=False)
        for mine, ck in ((full, twin_full), (delta, cks_delta[j])):
            again = ours(ck, state, state["step"])
            for k in ("save_s", "stall_s", "cpu_s"):
                mine[k] += again[k]
            copies += host_copy_s(sd)
        twin_full.close()
    res["ours, full"] = full
    res["ours, delta"] = delta
    delta["first_mb_s"] = first_mb_s
    delta["host_copy_s"] = copies
    delta["warm_copy_s"] = host_copy_s(sd, REPEAT)[1:]  # the later of clones in a row
    ts_file = bdir / "ts.pt"
    if s3 is not None:
        k0, v0 = next(iter(state["model"].state_dict().items()))
        ref = {"k": k0, "v": v0.detach().contiguous()}
        targets = {
            "delta": (Path(ck_delta.store.root), str(delta["id"])),  # type: ignore[attr-defined]
            "full": (Path(ck_full.store.root), str(full["id"])),  # type: ignore[attr-defined]
        }
        got = s3.restore(ts_file, targets, ref)
        res["torch.save"]["s3_restore_s"] = got["torch.load+download"]
        delta["s3_restore_s"] = got["delta"]
        full["s3_restore_s"] = got["full"]
    # local restores, interleaved and from fresh Checkpointers (as a new process would)
    readers = {
        "ours, delta": (Checkpointer(Path(ck_delta.store.root), progress=False), str(delta["id"])),  # type: ignore[attr-defined]
        "ours, full": (Checkpointer(Path(ck_full.store.root), progress=False), str(full["id"])),  # type: ignore[attr-defined]
    }
    warm: dict[str, list[float]] = {"torch.save": [], **{k: [] for k in readers}}
    for _ in range(REPEAT):
        warm["torch.save"].append(_time(lambda: torch.load(ts_file, weights_only=True)))
        for k, (rd, cid) in readers.items():
            warm[k].append(_time(lambda: rd.restore(cid)))  # noqa: B023
    for k, v in warm.items():
        res[k]["restore_s"] = v
    # the same from a cold page cache (what a restarted machine reads from its disk): every file of the run is
    # dropped from the cache before each restore
    if hasattr(os, "posix_fadvise") and COLD:
        files = {
            "torch.save": [ts_file],
            **{
                k: [f for f in Path(rd.store.root).rglob("*") if f.is_file()]  # type: ignore[attr-defined]
                for k, (rd, _) in readers.items()
            },
        }
        cold: dict[str, list[float]] = {k: [] for k in files}
        for _ in range(REPEAT):
            evict(files["torch.save"])
            cold["torch.save"].append(_time(lambda: torch.load(ts_file, weights_only=True)))
            for k, (rd, cid) in readers.items():
                evict(files[k])
                fresh = Checkpointer(Path(rd.store.root), progress=False)  # type: ignore[attr-defined]
                cold[k].append(_time(lambda: fresh.restore(cid)))  # noqa: B023
                fresh.close()
        for k, v in cold.items():
            res[k]["cold_restore_s"] = v
    for rd, _ in readers.values():
        rd.close()
    shutil.rmtree(bdir, ignore_errors=True)
    ref_bytes = res["torch.save"]["bytes"]
    rows = []
    for method, r in res.items():
        save_s = med(r["save_s"]) if isinstance(r["save_s"], list) else r["save_s"]
        rows.append(
            {
                "workload": label,
                "params": n_params,
                "method": method,
                "bytes": int(r["bytes"]),
                "ratio": r["bytes"] / ref_bytes,
                "save_s": save_s,
                "save_runs": r["save_s"] if isinstance(r["save_s"], list) else [save_s],
                "mb_s": (full["raw"] / save_s / 1e6) if save_s > 0 else math.inf,
                "stall_s": r.get("stall_s"),
                "cpu_s": r.get("cpu_s"),
                "host_copy_s": r.get("host_copy_s"),
                "warm_copy_s": r.get("warm_copy_s"),
                "restore_s": med(_as_runs(r.get("restore_s"))),
                "restore_runs": _as_runs(r.get("restore_s")),
                "cold_restore_runs": r.get("cold_restore_s"),
                "s3_restore_runs": r.get("s3_restore_s"),
                "first_mb_s": r.get("first_mb_s"),
            }
        )
    return rows


def _as_runs(v: Any) -> list[float]:
    """Measurements as a list (a baseline measured once: one)."""
    if v is None:
        return []
    return list(v) if isinstance(v, list) else [float(v)]


def table(rows: list[dict[str, Any]]) -> str:
    """Every method of every workload (times: median [min-max] of the runs)."""
    head = (
        "| workload | method | bytes written | ratio to torch.save | save s | save MB/s of state | "
        "training stall s | restore s (local) | restore s (local, cold cache) | restore s (S3) |"
    )
    out = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        stall = spread(r["stall_s"]) if r["stall_s"] is not None else ""
        out.append(
            f"| {r['workload']} | {r['method']} | {r['bytes'] / 1e6:.2f} MB | {r['ratio']:.3f} | "
            f"{spread(r['save_runs'])} | {r['mb_s']:.0f} | {stall} | {spread(r['restore_runs'])} | "
            f"{spread(r['cold_restore_runs'] or [])} | {spread(r['s3_restore_runs'] or [])} |"
        )
    return "\n".join(out)


def _x(ours_runs: list[float] | None, base_runs: list[float] | None) -> str:
    """Our time / the baseline's, per interleaved run: median [min-max]."""
    if not ours_runs or not base_runs:
        return "-"
    return spread(ratios(ours_runs, base_runs), "{:.2f}", "x")


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per workload: bytes as a ratio to torch.save, our save speed, stall and CPU time, and our restore
    time as a ratio to torch.load's (per interleaved run: median [min-max])."""
    head = (
        "| workload | torch.save+zstd | safetensors | torch.distributed.checkpoint | ours through DCP, delta | "
        "ours, full | ours, delta | "
        "our save MB/s | training stall / host copy (a clone in a row after another) | CPU s per save | "
        "restore / torch.load, local: delta, full | local, cold cache: delta, full | "
        "S3 (vs download + torch.load): delta, full |"
    )
    out = [
        head,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["method"]] = r
    for wl, m in by.items():
        d, ts, f = m["ours, delta"], m["torch.save"], m["ours, full"]
        stall = f"{1e3 * med(d['stall_s']):.0f} ms / {1e3 * med(d['host_copy_s']):.0f} ms"
        if d.get("warm_copy_s"):
            stall += f" ({1e3 * med(d['warm_copy_s']):.0f} ms)"
        out.append(
            f"| {wl} | {m['torch.save+zstd3']['ratio']:.3f} | {m['safetensors']['ratio']:.3f} | "
            f"{m['torch.distributed.checkpoint']['ratio']:.3f} | {m['ours through DCP, delta']['ratio']:.3f} | "
            f"{f['ratio']:.3f} | "
            f"{d['ratio']:.3f} | {d['mb_s']:.0f} ({d['first_mb_s']:.0f} first) | {stall} | {spread(d['cpu_s'])} | "
            f"{_x(d['restore_runs'], ts['restore_runs'])}, {_x(f['restore_runs'], ts['restore_runs'])} | "
            f"{_x(d['cold_restore_runs'], ts['cold_restore_runs'])}, "
            f"{_x(f['cold_restore_runs'], ts['cold_restore_runs'])} | "
            f"{_x(d['s3_restore_runs'], ts['s3_restore_runs'])}, {_x(f['s3_restore_runs'], ts['s3_restore_runs'])} |"
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
    ap.add_argument("--no-sweep", action="store_true", help="skip the runs, memory and small-tensor tables")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument(
        "--memory-only", action="store_true", help=argparse.SUPPRESS
    )  # (the memory table's child)
    ap.add_argument(
        "--memory-width", type=int, default=256, help=argparse.SUPPRESS
    )  # (... its model's width)
    ap.add_argument("--memory-reuse", action="store_true", help=argparse.SUPPRESS)  # (... reuse_buffers=True)
    args = ap.parse_args()
    global REPEAT, SAVE_TWINS, COLD
    if args.memory_only:  # in a fresh process: nothing freed earlier is there for the saves to reuse
        print(json.dumps(R.memory(args.quick, TinyGPT, REPEAT, args.memory_width, args.memory_reuse)))
        return
    if args.quick:  # a smoke run: fewer runs of everything
        REPEAT, SAVE_TWINS, COLD = 2, 2, False
    t0 = time.time()
    s3 = None if args.no_s3 else S3Bench()
    try:
        rows = run(args.quick, s3)
    finally:
        if s3 is not None:
            s3.close()
    took = {"workloads": time.time() - t0}
    print(table(rows))
    print()
    print(summary(rows))
    sweep: list[dict[str, Any]] = []
    mem: list[dict[str, Any]] = []
    small: dict[str, Any] = {}
    if not args.no_sweep:
        t1 = time.time()
        sweep = R.runs(args.quick, TinyGPT, train, corpus, REPEAT)
        took["runs"] = time.time() - t1
        print()
        print(R.runs_table(sweep))
        child = [sys.executable, __file__, "--memory-only"] + (["--quick"] if args.quick else [])
        t1 = time.time()
        # each size in a fresh process; the larger state (about 150 MB) in a full run only; then the 40 MB state
        # with reuse_buffers=True (the snapshot's buffers kept between saves, for more memory)
        cases = [[str(w)] for w in ((256,) if args.quick else (256, 512))] + [["256", "--memory-reuse"]]
        mem = [
            json.loads(
                subprocess.run(
                    [*child, "--memory-width", *case], capture_output=True, text=True, check=True
                ).stdout
            )
            for case in cases
        ]
        took["memory"] = time.time() - t1
        t1 = time.time()
        print()
        print(R.memory_table(mem))
        small = R.small_tensors(args.quick, REPEAT)
        took["small tensors"] = time.time() - t1
        print()
        print(R.small_table(small))
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in took.items())
    print(
        f"\n{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, {time.time() - t0:.0f} s total ({parts})"
    )
    if args.json:
        doc = {"rows": rows, "sweep": sweep, "memory": mem, "small": small}
        Path(args.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
