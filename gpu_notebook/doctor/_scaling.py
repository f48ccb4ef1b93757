"""Scaling benchmark: train the same small model with DDP on 1, 2, ... N workers and compare throughput.

Weak scaling: every worker keeps the same per-worker batch, so ideal throughput grows linearly with the
worker count. ``speedup(k) = throughput(k) / throughput(1)`` and ``efficiency(k) = speedup(k) / k``. The
reference point from practice: 8 A100s trained 7.8x faster than one, 97.5 % efficiency.

Each worker count ``k`` trains on ranks ``0..k-1`` in a sub-group made with ``dist.new_group`` (every rank
takes part in creating it; the others wait at a barrier). On CPU (gloo) every rank is limited to one
intra-op thread during the benchmark, so one worker cannot borrow the others' cores; the setting is
restored afterwards. Every collective (DDP's gradient all-reduce included) runs in a group made with
``collective_timeout`` seconds: a stuck or dead rank makes the others raise ``TimeoutError`` after that long.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_notebook.doctor._bench import COLLECTIVE_TIMEOUT, bench_group, collective_failed, free_group

if TYPE_CHECKING:  # pragma: no cover
    from plotly.graph_objects import Figure

    from gpu_notebook.doctor._shapes import RankCaller, ScalingRow, WorkersTiming

__all__ = ["REFERENCE", "scaling_sizes", "scaling_train", "ScalingResult", "bench_scaling", "scaling_rows"]

#: (workers, speedup) reported for a tuned all-reduce on 8 A100s.
REFERENCE = (8, 7.8)


def scaling_sizes(world_size: int) -> list[int]:
    """Worker counts to try: every count up to 8, then powers of two and the full size."""
    if world_size <= 8:
        return list(range(1, world_size + 1))
    sizes = [1]
    while sizes[-1] * 2 < world_size:
        sizes.append(sizes[-1] * 2)
    return sizes + [world_size]


def scaling_train(
    sizes: list[int],
    steps: int = 30,
    warmup_steps: int = 5,
    batch: int | None = None,
    hidden: int | None = None,
    layers: int = 4,
    seed: int = 0,
    collective_timeout: float = COLLECTIVE_TIMEOUT,
) -> list[WorkersTiming]:
    """Run in every rank: for each worker count, DDP-train an MLP on synthetic data and time ``steps`` steps.

    Returns this rank's timings for the counts it took part in: ``{"workers", "elapsed", "samples"}``.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    on_gpu = "nccl" in str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    hidden = hidden or (4096 if on_gpu else 256)
    batch = batch or (256 if on_gpu else 64)
    threads = torch.get_num_threads()
    if not on_gpu:
        torch.set_num_threads(1)
    out: list[WorkersTiming] = []
    what = "creating the benchmark's process group"
    try:
        everyone = bench_group(list(range(dist.get_world_size())), collective_timeout)
        for k in sizes:
            what = f"training on {k} worker(s)"
            group = bench_group(list(range(k)), collective_timeout)
            if rank < k:
                elapsed = _train_timed(
                    group, device, hidden, batch, layers, (seed, seed + rank), steps, warmup_steps
                )
                out.append({"workers": k, "elapsed": elapsed, "samples": batch * steps, "steps": steps})
            dist.barrier(group=everyone)
            free_group(group)
        free_group(everyone)
    # re-raised: as a TimeoutError naming the stuck rank when the collective timed out, else unchanged
    except Exception as exc:  # noqa: BLE001
        timed_out = collective_failed(exc, rank, what, collective_timeout)
        if timed_out is not None:
            raise timed_out from exc
        raise
    finally:
        torch.set_num_threads(threads)
    return out


def _train_timed(
    group: Any,
    device: Any,
    hidden: int,
    batch: int,
    layers: int,
    seeds: tuple[int, int],
    steps: int,
    warmup_steps: int,
) -> float:
    """DDP-train a fresh MLP on one synthetic batch in ``group``; seconds for ``steps`` steps after warm-up.

    ``seeds`` is ``(model seed, data seed)``: every rank builds the same model from the first, and its own
    batch from the second.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    on_gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    torch.manual_seed(seeds[0])
    mods: list[Any] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 10)).to(device)
    ddp = DDP(model, process_group=group, device_ids=[device.index] if on_gpu else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator(device="cpu").manual_seed(seeds[1])
    x = torch.randn(batch, hidden, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(warmup_steps):
        _train_step(ddp, opt, loss_fn, x, y)
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(steps):
        _train_step(ddp, opt, loss_fn, x, y)
    sync()
    return time.perf_counter() - t0


def _train_step(model: Any, opt: Any, loss_fn: Any, x: Any, y: Any) -> None:
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()


def scaling_rows(per_rank: list[list[WorkersTiming]]) -> list[ScalingRow]:
    """Combine per-rank timings: throughput = samples of all members / slowest member's time."""
    by_k: dict[int, list[WorkersTiming]] = {}
    for rank_rows in per_rank:
        for r in rank_rows:
            by_k.setdefault(int(r["workers"]), []).append(r)
    rows: list[ScalingRow] = []
    base = None
    for k in sorted(by_k):
        members = by_k[k]
        elapsed = max(r["elapsed"] for r in members)
        throughput = sum(r["samples"] for r in members) / elapsed if elapsed > 0 else 0.0
        if base is None and k == 1:
            base = throughput
        speedup = throughput / base if base else float("nan")
        rows.append(
            {
                "workers": k,
                "throughput": throughput,
                "speedup": speedup,
                "efficiency": speedup / k if base else float("nan"),
                "step_ms": elapsed / max(1, int(members[0].get("steps", 1))) * 1000,
            }
        )
    return rows


@dataclass
class ScalingResult:
    """Throughput of the same model on 1..N workers, with speedup and efficiency against one worker."""

    backend: str
    rows: list[ScalingRow]
    steps: int
    reference: tuple[int, float] = field(default=REFERENCE)

    @property
    def reference_efficiency(self) -> float:
        """0.975 for the 8 x A100 reference."""
        return self.reference[1] / self.reference[0]

    def table(self) -> str:
        """Plain-text table."""
        lines = [
            f"# scaling ({self.backend}, {self.steps} steps per size, same per-worker batch)",
            f"# {'workers':>7} {'samples/s':>12} {'speedup':>8} {'efficiency':>10}",
        ]
        for r in self.rows:
            lines.append(
                f"  {r['workers']:>7} {r['throughput']:>12.1f} {r['speedup']:>7.2f}x {r['efficiency'] * 100:>9.1f}%"
            )
        k, s = self.reference
        lines.append(f"# reference: {k} x A100 at {s}x = {self.reference_efficiency * 100:.1f}% efficiency")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        last = self.rows[-1] if self.rows else None
        tail = f"{last['workers']} workers at {last['efficiency'] * 100:.1f}%" if last else "no rows"
        return f"<ScalingResult {self.backend}: {tail}>"

    def figure(self) -> Figure:
        """Plotly figure: measured speedup against the ideal line and the 8 x A100 reference point."""
        import plotly.graph_objects as go

        ks = [r["workers"] for r in self.rows]
        fig = go.Figure()
        fig.add_trace(
            go.Scatter(x=ks, y=[r["speedup"] for r in self.rows], name="measured", mode="lines+markers")
        )
        fig.add_trace(go.Scatter(x=ks, y=ks, name="ideal", mode="lines", line={"dash": "dot"}))
        fig.add_trace(
            go.Scatter(
                x=[self.reference[0]], y=[self.reference[1]], name="8 x A100 reference", mode="markers"
            )
        )
        fig.update_layout(
            title=f"scaling ({self.backend})",
            xaxis={"title": "workers"},
            yaxis={"title": "speedup vs 1 worker"},
            height=340,
        )
        return fig

    def _repr_html_(self) -> str:
        cell = "padding:1px 8px;text-align:right;border-bottom:1px solid #eee"
        body = "".join(
            f"<tr><td style='{cell}'>{r['workers']}</td><td style='{cell}'>{r['throughput']:.1f}</td>"
            f"<td style='{cell}'>{r['speedup']:.2f}x</td><td style='{cell}'>{r['efficiency'] * 100:.1f}%</td></tr>"
            for r in self.rows
        )
        k, s = self.reference
        return (
            f"<div class='gnb-scaling'><b>scaling</b> ({html.escape(self.backend)}, {self.steps} steps)"
            f"<table style='border-collapse:collapse;font-size:90%'><thead><tr>"
            f"<th style='{cell}'>workers</th><th style='{cell}'>samples/s</th><th style='{cell}'>speedup</th>"
            f"<th style='{cell}'>efficiency</th></tr></thead><tbody>{body}</tbody></table>"
            f"<div>reference: {k} x A100 at {s}x ({self.reference_efficiency * 100:.1f}%)</div></div>"
        )


def bench_scaling(
    cluster: RankCaller,
    steps: int = 30,
    warmup_steps: int = 5,
    sizes: list[int] | None = None,
    batch: int | None = None,
    hidden: int | None = None,
    timeout: float | None = 1800.0,
    collective_timeout: float = COLLECTIVE_TIMEOUT,
) -> ScalingResult:
    """Train the same small model on 1, 2, ... N workers of ``cluster`` (``%gpu_cluster bench scaling``).

    Parameters
    ----------
    cluster
        Anything with ``call(fn, *args, timeout=..., **kwargs) -> list`` and ``world_size``.
    steps, warmup_steps
        Timed and untimed training steps per worker count.
    sizes
        Worker counts (default: :func:`scaling_sizes`).
    batch, hidden
        Per-worker batch and MLP width (defaults: 256 x 4096 on GPU, 64 x 256 on CPU).
    timeout
        Seconds the whole benchmark may take.
    collective_timeout
        Seconds any one collective may take (non-members of a size wait for its training at one barrier).
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"steps must be >= 1 and warmup_steps >= 0 (got {steps} and {warmup_steps})")
    world = int(getattr(cluster, "world_size", 0)) or len(cluster.call(_world_size, timeout=timeout))
    sizes = sorted({int(k) for k in (sizes or scaling_sizes(world)) if 1 <= int(k) <= world})
    if 1 not in sizes:
        sizes = [1] + sizes
    per_rank = cluster.call(
        scaling_train,
        sizes,
        steps=steps,
        warmup_steps=warmup_steps,
        batch=batch,
        hidden=hidden,
        collective_timeout=collective_timeout,
        timeout=timeout,
    )
    backend = cluster.call(_backend, timeout=timeout)[0]
    return ScalingResult(str(backend), scaling_rows(per_rank), steps)


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size()


def _backend() -> str:
    import torch.distributed as dist

    return str(dist.get_backend())
