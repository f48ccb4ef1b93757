"""All-reduce benchmark in the manner of nccl-tests' ``all_reduce_perf``, plus a pairwise link test.

Definitions follow nccl-tests (``doc/PERFORMANCE.md``): for ``S`` bytes all-reduced in ``t`` seconds over
``n`` ranks, the algorithm bandwidth is ``algbw = S / t`` and the bus bandwidth ``busbw = algbw * 2(n-1)/n``
(the per-link load of a ring all-reduce, comparable across rank counts). Times are averaged over ranks, as
nccl-tests does by default. ``#wrong`` counts result elements that differ from the exact expected sum.

torch's ``all_reduce`` works in place, so the timed loop runs in place on a zeroed buffer (values stay
finite), and correctness is checked once per size with a fresh rank-dependent pattern.

Every collective runs in a process group made for the benchmark with ``collective_timeout`` seconds (default
300): a rank that is stuck or gone makes the others fail with ``TimeoutError`` after that long instead of
waiting for the cluster's own process-group timeout (30 minutes for gloo).
"""

from __future__ import annotations

import html
import itertools
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from plotly.graph_objects import Figure

    from gpu_notebook.doctor._shapes import (
        BenchRow,
        LinkRow,
        PairTiming,
        RankBench,
        RankCaller,
        SizeTiming,
        Where,
    )

__all__ = [
    "COLLECTIVE_TIMEOUT",
    "parse_size",
    "algbw_gbps",
    "busbw_gbps",
    "message_sizes",
    "allreduce_bench",
    "pair_bench",
    "choose_pairs",
    "find_slow_links",
    "BenchResult",
    "bench_allreduce",
]

#: Seconds any one collective (all-reduce, barrier, group creation) of a benchmark may take.
COLLECTIVE_TIMEOUT = 300.0

_DTYPE_NAMES = {
    "float32": "float",
    "float": "float",
    "float16": "half",
    "half": "half",
    "bfloat16": "bfloat16",
    "float64": "double",
    "double": "double",
    "int32": "int32",
    "int64": "int64",
}


def parse_size(text: str | int) -> int:
    """``"128M"`` -> 134217728, like nccl-tests' ``-b``/``-e`` (K, M, G are powers of 1024); ints pass through.

    Usable as an argparse ``type=`` for ``--max-bytes``.
    """
    if isinstance(text, int):
        return text
    t = str(text).strip().upper().removesuffix("B")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    number = t[:-1] if mult > 1 else t
    try:
        value = int(float(number) * mult)
    except (ValueError, OverflowError):  # OverflowError: "inf"
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 64K, 128M, 1G)") from None
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes): ``bytes / time``."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw_gbps(algbw: float, world_size: int) -> float:
    """Bus bandwidth of an all-reduce: ``algbw * 2(n-1)/n`` (nccl-tests' factor)."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 0 else 0.0


def message_sizes(
    min_bytes: int, max_bytes: int, factor: int = 2, elem_size: int = 4
) -> list[tuple[int, int]]:
    """``(bytes, count)`` per step from ``min_bytes`` to ``max_bytes``, multiplying by ``factor``.

    Like ``all_reduce_perf -b MIN -e MAX -f FACTOR``: the element count is ``bytes // elem_size`` (at least 1)
    and the reported bytes are ``count * elem_size``.
    """
    if factor < 2:
        raise ValueError("factor must be >= 2")
    out = []
    size = max(int(min_bytes), elem_size)
    while size <= max_bytes:
        count = max(1, size // elem_size)
        out.append((count * elem_size, count))
        size *= factor
    return out


def _device_and_sync(group: Any = None) -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend(group)):
        dev = torch.device("cuda", torch.cuda.current_device())
        return dev, torch.cuda.synchronize
    return torch.device("cpu"), lambda: None


def bench_group(ranks: list[int], timeout: float) -> Any:
    """A process group of ``ranks`` whose collectives fail after ``timeout`` seconds (every rank must call)."""
    import datetime

    import torch.distributed as dist

    return dist.new_group(sorted(ranks), timeout=datetime.timedelta(seconds=float(timeout)))


def free_group(group: Any) -> None:
    """Destroy a benchmark sub-group (older torch cannot destroy sub-groups; they are freed at exit)."""
    import torch.distributed as dist

    try:
        dist.destroy_process_group(group)
    except Exception:  # noqa: BLE001 - freeing a benchmark group after a failure must not hide that failure
        pass


def collective_failed(exc: BaseException, rank: int, what: str, timeout: float) -> TimeoutError | None:
    """A clear ``TimeoutError`` for a collective that timed out (``None`` when ``exc`` is something else)."""
    text = str(exc).lower()
    if "timed out" not in text and "timeout" not in text:
        return None
    return TimeoutError(
        f"rank {rank}: {what} did not complete within {timeout:g} s: another rank is stuck or has died "
        f"({type(exc).__name__}: {str(exc)[:200]}); restart the workers before the next distributed call"
    )


def _where() -> Where:
    ip = None
    try:
        import sys

        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - a label only: fall back to the host's own address
        ip = None
    return {"hostname": socket.gethostname(), "node_ip": ip, "pid": os.getpid()}


def allreduce_bench(
    min_bytes: int = 8,
    max_bytes: int = 128 * 2**20,
    factor: int = 2,
    iters: int = 20,
    warmup: int = 5,
    dtype: str = "float32",
    check: bool = True,
    collective_timeout: float = COLLECTIVE_TIMEOUT,
) -> RankBench:
    """Time all-reduce (sum) for each message size; run it in every rank of an initialised process group.

    Returns this rank's measurements: ``{"rank", "world_size", "backend", "dtype", "hostname", "node_ip",
    "rows": [{"bytes", "count", "time_us", "wrong"}]}``; :func:`bench_allreduce` combines the ranks.
    Raises ``TimeoutError`` when a collective takes longer than ``collective_timeout`` seconds.
    """
    import torch
    import torch.distributed as dist

    tdtype = getattr(torch, dtype)
    device, sync = _device_and_sync()
    rank, n = dist.get_rank(), dist.get_world_size()
    elem = torch.tensor([], dtype=tdtype).element_size()
    sizes = message_sizes(min_bytes, max_bytes, factor, elem)
    what = "creating the benchmark's process group"
    rows: list[SizeTiming] = []
    try:
        group = bench_group(list(range(n)), collective_timeout)
        buf = torch.zeros(sizes[-1][1] if sizes else 1, dtype=tdtype, device=device)
        for nbytes, count in sizes:
            what = f"all_reduce of {nbytes} B"
            view = buf[:count]
            wrong = 0
            if check:
                pattern = (torch.arange(count, device=device, dtype=torch.int32) % 13).to(tdtype)
                view.copy_(pattern + (rank + 1))
                dist.all_reduce(view, group=group)
                expected = pattern * n + n * (n + 1) // 2
                wrong = int((view != expected).sum().item())
            view.zero_()
            elapsed = _time_all_reduce(view, group, warmup, iters, sync)
            rows.append({"bytes": nbytes, "count": count, "time_us": elapsed * 1e6, "wrong": wrong})
    # re-raised: as a TimeoutError naming the stuck rank when the collective timed out, else unchanged
    except Exception as exc:  # noqa: BLE001
        timed_out = collective_failed(exc, rank, what, collective_timeout)
        if timed_out is not None:
            raise timed_out from exc
        raise
    free_group(group)
    return {
        "rank": rank,
        "world_size": n,
        "backend": str(dist.get_backend()),
        "dtype": dtype,
        **_where(),
        "rows": rows,
    }


def _time_all_reduce(buf: Any, group: Any, warmup: int, iters: int, sync: Any) -> float:
    """Seconds per ``all_reduce`` of ``buf`` in ``group``, after ``warmup`` untimed ones and a barrier."""
    import torch.distributed as dist

    for _ in range(warmup):
        dist.all_reduce(buf, group=group)
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf, group=group)
    sync()
    return (time.perf_counter() - t0) / max(1, iters)


def pair_bench(
    pairs: list[list[int]],
    nbytes: int = 4 * 2**20,
    iters: int = 10,
    warmup: int = 3,
    collective_timeout: float = COLLECTIVE_TIMEOUT,
) -> list[PairTiming]:
    """Time a 2-rank all-reduce for each pair of ranks in turn (all ranks must call this, with equal pairs).

    Every rank creates every pair's sub-group (``dist.new_group`` is collective); only the pair's members
    run the timing while the rest wait at a barrier. Returns this rank's timings, one per pair it was in.
    Raises ``TimeoutError`` when a collective takes longer than ``collective_timeout`` seconds.
    """
    import torch
    import torch.distributed as dist

    device, sync = _device_and_sync()
    rank = dist.get_rank()
    count = max(1, nbytes // 4)
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    out: list[PairTiming] = []
    what = "creating the benchmark's process group"
    try:
        everyone = bench_group(list(range(dist.get_world_size())), collective_timeout)
        for pair in pairs:
            what = f"the 2-rank all_reduce of ranks {pair[0]} and {pair[1]}"
            group = bench_group(pair, collective_timeout)
            if rank in pair:
                elapsed = _time_all_reduce(buf, group, warmup, iters, sync)
                out.append({"pair": list(pair), "bytes": count * 4, "time_us": elapsed * 1e6})
            dist.barrier(group=everyone)
            free_group(group)
    # re-raised: as a TimeoutError naming the stuck rank when the collective timed out, else unchanged
    except Exception as exc:  # noqa: BLE001
        timed_out = collective_failed(exc, rank, what, collective_timeout)
        if timed_out is not None:
            raise timed_out from exc
        raise
    free_group(everyone)
    return out


def choose_pairs(rank_nodes: dict[int, str], max_pairs: int = 28) -> tuple[str, list[list[int]]]:
    """Which rank pairs to time: one rank per node across nodes, or ranks within a single node.

    Returns ``(mode, pairs)`` with mode ``"node"`` or ``"rank"``. All pairs while they are at most
    ``max_pairs``, else a ring (each with its successor).
    """
    by_node: dict[str, list[int]] = {}
    for rank, node in sorted(rank_nodes.items()):
        by_node.setdefault(node, []).append(rank)
    if len(by_node) > 1:
        mode, members = "node", [ranks[0] for ranks in by_node.values()]
    else:
        mode, members = "rank", sorted(rank_nodes)
    if len(members) < 2:
        return mode, []
    pairs = [list(p) for p in itertools.combinations(members, 2)]
    if len(pairs) > max_pairs:
        pairs = [[members[i], members[(i + 1) % len(members)]] for i in range(len(members))]
    return mode, pairs


def find_slow_links(pair_bw: dict[tuple[str, str], float], slow_factor: float = 0.5) -> list[str]:
    """Names whose pairs are much slower than the rest: median busbw of their pairs < ``slow_factor`` x
    the median over all pairs. Needs at least three names to tell which end of a slow pair is at fault.
    """
    if not pair_bw:
        return []
    names = sorted({n for pair in pair_bw for n in pair})
    if len(names) < 3:
        return []
    overall = statistics.median(pair_bw.values())
    slow = []
    for name in names:
        mine = [bw for pair, bw in pair_bw.items() if name in pair]
        if mine and statistics.median(mine) < slow_factor * overall:
            slow.append(name)
    return slow


@dataclass
class BenchResult:
    """All-reduce benchmark over a worker group: per size, and per pair of nodes (or ranks).

    Attributes
    ----------
    rows
        Per size: ``bytes``, ``count``, ``type``, ``redop``, ``time_us`` (mean over ranks), ``algbw``,
        ``busbw`` (GB/s), ``wrong`` (sum over ranks), ``time_us_per_rank``.
    pairs
        Per timed pair: ``ranks``, ``names``, ``bytes``, ``time_us``, ``algbw``, ``busbw``.
    slow
        Nodes (or ranks) whose links are much slower than the others.
    """

    world_size: int
    backend: str
    dtype: str
    rows: list[BenchRow]
    pairs: list[LinkRow] = field(default_factory=list)
    pair_mode: str = "node"
    slow: list[str] = field(default_factory=list)
    rank_nodes: dict[int, str] = field(default_factory=dict)

    @property
    def avg_busbw(self) -> float:
        """Mean bus bandwidth over all sizes (nccl-tests' "Avg bus bandwidth")."""
        return statistics.fmean(r["busbw"] for r in self.rows) if self.rows else 0.0

    @property
    def peak_busbw(self) -> float:
        """Highest bus bandwidth over all sizes."""
        return max((r["busbw"] for r in self.rows), default=0.0)

    @property
    def wrong(self) -> int:
        """Wrong result elements over all sizes and ranks (0 when all-reduce is correct)."""
        return sum(int(r["wrong"]) for r in self.rows)

    def flags(self) -> list[str]:
        """Human-readable warnings: wrong results, slow nodes or links."""
        out = []
        if self.wrong:
            out.append(f"{self.wrong} wrong result elements: all-reduce returned incorrect sums")
        kind = "node" if self.pair_mode == "node" else "rank"
        for name in self.slow:
            out.append(
                f"{kind} {name}: its links are much slower than the others (under half the median busbw)"
            )
        return out

    def table(self) -> str:
        """A text table like all_reduce_perf's."""
        lines = [
            f"# all_reduce over {self.world_size} ranks, backend {self.backend}, in-place",
            f"# {'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
            f"# {'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}",
        ]
        for r in self.rows:
            lines.append(
                f"  {r['bytes']:>12} {r['count']:>12} {r['type']:>8} {r['redop']:>6} {r['time_us']:>10.1f} "
                f"{r['algbw']:>8.2f} {r['busbw']:>8.2f} {r['wrong']:>7}"
            )
        lines.append(f"# Out of bounds values : {self.wrong} {'OK' if not self.wrong else 'FAILED'}")
        lines.append(f"# Avg bus bandwidth    : {self.avg_busbw:.4f}")
        if self.pairs:
            lines.append(f"#\n# 2-rank links ({self.pair_mode}s), {self.pairs[0]['bytes']} B:")
            for p in self.pairs:
                lines.append(
                    f"#   {p['names'][0]} <-> {p['names'][1]}: {p['time_us']:.1f} us, busbw {p['busbw']:.2f} GB/s"
                )
        for flag in self.flags():
            lines.append(f"# WARNING: {flag}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return (
            f"<BenchResult all_reduce {self.world_size} ranks {self.backend}: {len(self.rows)} sizes, "
            f"peak busbw {self.peak_busbw:.2f} GB/s, #wrong {self.wrong}>"
        )

    def figure(self) -> Figure:
        """A plotly figure of algbw and busbw against message size (log-log)."""
        import plotly.graph_objects as go

        x = [r["bytes"] for r in self.rows]
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=x, y=[r["busbw"] for r in self.rows], name="busbw", mode="lines+markers"))
        fig.add_trace(go.Scatter(x=x, y=[r["algbw"] for r in self.rows], name="algbw", mode="lines+markers"))
        fig.update_layout(
            title=f"all_reduce, {self.world_size} ranks ({self.backend})",
            xaxis={"title": "message size (bytes)", "type": "log"},
            yaxis={"title": "bandwidth (GB/s)"},
            height=360,
            margin={"l": 50, "r": 20, "t": 40, "b": 40},
        )
        return fig

    def _repr_html_(self) -> str:
        esc = html.escape
        cell = "padding:1px 8px;text-align:right;border-bottom:1px solid #eee"
        heads = ["size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"]
        body = "".join(
            "<tr>"
            + "".join(
                f"<td style='{cell}'>{v}</td>"
                for v in (
                    r["bytes"],
                    r["count"],
                    r["type"],
                    f"{r['time_us']:.1f}",
                    f"{r['algbw']:.2f}",
                    f"{r['busbw']:.2f}",
                    f"<span style='color:{'#cf222e' if r['wrong'] else 'inherit'}'>{r['wrong']}</span>",
                )
            )
            + "</tr>"
            for r in self.rows
        )
        pairs = ""
        if self.pairs:
            slow_tag = " <b style='color:#cf222e'>slow</b>"
            items = "".join(
                f"<li>{esc(str(p['names'][0]))} &harr; {esc(str(p['names'][1]))}: {p['busbw']:.2f} GB/s"
                f"{slow_tag if set(map(str, p['names'])) & set(self.slow) else ''}</li>"
                for p in self.pairs
            )
            pairs = f"<div>2-rank links ({self.pair_mode}s):<ul>{items}</ul></div>"
        flags = "".join(f"<div style='color:#cf222e'>&#9888; {esc(f)}</div>" for f in self.flags())
        head = "".join(f"<th style='{cell}'>{h}</th>" for h in heads)
        return (
            f"<div class='gnb-bench'><b>all_reduce</b> over {self.world_size} ranks ({esc(self.backend)}): "
            f"avg busbw {self.avg_busbw:.2f} GB/s, peak {self.peak_busbw:.2f} GB/s{flags}"
            f"<table style='border-collapse:collapse;font-size:90%'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{pairs}</div>"
        )


def combine(per_rank: list[RankBench]) -> tuple[int, str, str, list[BenchRow]]:
    """Merge per-rank :func:`allreduce_bench` results into rows with mean time, algbw, busbw, #wrong."""
    n = per_rank[0]["world_size"]
    dtype = per_rank[0]["dtype"]
    rows: list[BenchRow] = []
    for i, first in enumerate(per_rank[0]["rows"]):
        times = [r["rows"][i]["time_us"] for r in per_rank]
        t = statistics.fmean(times)
        alg = algbw_gbps(first["bytes"], t / 1e6)
        rows.append(
            {
                "bytes": first["bytes"],
                "count": first["count"],
                "type": _DTYPE_NAMES.get(dtype, dtype),
                "redop": "sum",
                "time_us": t,
                "algbw": alg,
                "busbw": busbw_gbps(alg, n),
                "wrong": sum(int(r["rows"][i]["wrong"]) for r in per_rank),
                "time_us_per_rank": times,
            }
        )
    return n, str(per_rank[0]["backend"]), dtype, rows


def bench_allreduce(
    cluster: RankCaller,
    min_bytes: int = 8,
    max_bytes: int = 128 * 2**20,
    factor: int = 2,
    iters: int = 20,
    warmup: int = 5,
    dtype: str = "float32",
    links: bool = True,
    link_bytes: int = 4 * 2**20,
    timeout: float | None = 1800.0,
    collective_timeout: float = COLLECTIVE_TIMEOUT,
) -> BenchResult:
    """Run the all-reduce benchmark on every rank of ``cluster`` (``%gpu_cluster bench allreduce``).

    Parameters
    ----------
    cluster
        Anything with ``call(fn, *args, timeout=..., **kwargs) -> list`` (``gpu_notebook.Cluster``,
        :class:`LocalGroup`).
    min_bytes, max_bytes, factor
        Message sizes, as ``all_reduce_perf -b 8 -e 128M -f 2``.
    iters, warmup
        Timed and untimed iterations per size (nccl-tests' defaults: 20 and 5).
    dtype
        torch dtype name.
    links
        Also time a 2-rank all-reduce of ``link_bytes`` for pairs of nodes (pairs of ranks on one node)
        to find a node whose links are much slower.
    timeout
        Seconds the whole size sweep (and then the link test) may take.
    collective_timeout
        Seconds any one collective may take: a stuck or dead rank makes the others raise ``TimeoutError``.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0 (got iters={iters}, warmup={warmup})")
    if not 0 < min_bytes <= max_bytes:
        raise ValueError(f"need 0 < min_bytes <= max_bytes (got {min_bytes} and {max_bytes})")
    per_rank = cluster.call(
        allreduce_bench,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        factor=factor,
        iters=iters,
        warmup=warmup,
        dtype=dtype,
        collective_timeout=collective_timeout,
        timeout=timeout,
    )
    n, backend, dtype_name, rows = combine(per_rank)
    result = BenchResult(n, backend, dtype_name, rows, rank_nodes=_rank_nodes(per_rank))
    if links and n >= 2:
        _link_test(cluster, result, link_bytes, collective_timeout, timeout)
    return result


def _rank_nodes(per_rank: list[RankBench]) -> dict[int, str]:
    """Rank -> node label: the host name, or ``host/ip`` when host names collide."""
    hosts: dict[tuple[str, str | None], int] = {}
    for r in per_rank:
        hosts.setdefault((r["hostname"], r.get("node_ip")), len(hosts))
    host_names = {r["hostname"] for r in per_rank}
    return {
        r["rank"]: (r["hostname"] if len(host_names) == len(hosts) else f"{r['hostname']}/{r.get('node_ip')}")
        for r in per_rank
    }


def _link_test(
    cluster: RankCaller,
    result: BenchResult,
    link_bytes: int,
    collective_timeout: float,
    timeout: float | None,
) -> None:
    """Time a 2-rank all-reduce per pair of nodes (or of ranks on one node); fill ``pairs`` and ``slow``."""
    mode, pairs = choose_pairs(result.rank_nodes)
    if not pairs:
        return
    timings = cluster.call(
        pair_bench,
        pairs,
        nbytes=link_bytes,
        iters=10,
        warmup=3,
        collective_timeout=collective_timeout,
        timeout=timeout,
    )
    by_pair: dict[tuple[int, ...], list[PairTiming]] = {}
    for rank_timings in timings:
        for t in rank_timings:
            by_pair.setdefault(tuple(t["pair"]), []).append(t)
    pair_bw: dict[tuple[str, str], float] = {}
    for pair in pairs:
        ts = by_pair.get(tuple(pair), [])
        if not ts:
            continue
        t_us = statistics.fmean(t["time_us"] for t in ts)
        alg = algbw_gbps(ts[0]["bytes"], t_us / 1e6)
        names = [result.rank_nodes[r] if mode == "node" else str(r) for r in pair]
        bus = busbw_gbps(alg, 2)
        result.pairs.append(
            {
                "ranks": list(pair),
                "names": names,
                "bytes": ts[0]["bytes"],
                "time_us": t_us,
                "algbw": alg,
                "busbw": bus,
            }
        )
        pair_bw[(names[0], names[1])] = bus
    result.pair_mode = mode
    result.slow = find_slow_links(pair_bw)
