"""Checks of the network between ranks: NCCL's version and settings, the interface NCCL would bootstrap on,
InfiniBand/EFA, and whether every rank reaches the rendezvous and every other node's ephemeral ports.

A wrong interface or a firewall that only opens ``MASTER_PORT`` does not fail at start-up: training stalls at
the first collective. These checks name the interface to export or the rule to add.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ._findings import Findings
from ._gpus import has_gpu
from ._report import ERROR, OK, WARNING, Finding
from ._shapes import Facts, Interface, PeerProbe

__all__ = ["check_network", "check_rdma", "check_reachability", "nccl_select_interfaces"]


def nccl_select_interfaces(spec: str | None, interfaces: Sequence[Interface]) -> list[str]:
    """Interfaces NCCL's socket transport would pick, following its ``NCCL_SOCKET_IFNAME`` rules.

    ``spec`` is a comma-separated list of name prefixes; a leading ``^`` excludes them, a leading ``=``
    asks for exact names. Unset, NCCL prefers ``ib*`` interfaces, then anything but ``docker*`` and
    ``lo``, then ``docker*``, then ``lo``. Only interfaces with an IPv4 address count here.
    """
    names = [i["name"] for i in interfaces if i.get("ipv4") and i.get("up", True) is not False]

    def match(s: str) -> list[str]:
        exclude = s.startswith("^")
        s = s[1:] if exclude else s
        exact = s.startswith("=")
        s = s[1:] if exact else s
        prefixes = [p for p in s.split(",") if p]
        hit = [n for n in names if any(n == p if exact else n.startswith(p) for p in prefixes)]
        return [n for n in names if n not in hit] if exclude else hit

    if spec:
        return match(spec)
    for default in ("ib", "^docker,lo", "docker", "lo"):
        found = match(default)
        if found:
            return found
    return []


def check_network(facts: Facts, node: str, multi_node: bool) -> list[Finding]:
    """NCCL version and settings: interfaces NCCL would use, NCCL_SOCKET_IFNAME, NCCL_DEBUG."""
    out = Findings("nccl", node)
    _nccl_version(facts, out)
    _nccl_env(facts, out)
    _socket_interface(facts, out, multi_node)
    return out.findings


def _nccl_version(facts: Facts, out: Findings) -> None:
    nccl = facts.get("nccl_version")
    if nccl:
        out.ok(f"NCCL {nccl}")
    elif has_gpu(facts) and facts.get("torch_cuda"):
        out.warn("NCCL version unknown (torch.cuda.nccl.version() failed)")
    else:
        out.ok("no NCCL (no GPU / CPU-only build): gloo is used")


def _nccl_env(facts: Facts, out: Findings) -> None:
    """NCCL_DEBUG's level, and the switches that turn NCCL's fast transports off."""
    env = facts.get("env") or {}
    debug = env.get("NCCL_DEBUG")
    if debug and debug.upper() not in ("VERSION", "WARN", "INFO", "TRACE", "ABORT"):
        out.warn(
            f"NCCL_DEBUG={debug!r} is not a level NCCL knows",
            "use NCCL_DEBUG=WARN normally, INFO to debug",
            check="nccl-env",
        )
    elif debug and debug.upper() in ("INFO", "TRACE"):
        out.ok(
            f"NCCL_DEBUG={debug}: verbose logs in the worker output",
            "unset NCCL_DEBUG (or =WARN) when not debugging",
            check="nccl-env",
        )
    else:
        shown = f"NCCL_DEBUG={debug}" if debug else "NCCL_DEBUG unset"
        out.ok(f"{shown} (set NCCL_DEBUG=INFO to debug hangs)", check="nccl-env")
    for var in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"):
        if env.get(var) == "1" and has_gpu(facts):
            avoided = "NVLink/PCIe peer-to-peer" if "P2P" in var else "InfiniBand/RDMA"
            out.warn(
                f"{var}=1: NCCL avoids {avoided}",
                f"unset {var} unless it works around a known fault",
                check="nccl-env",
            )


def _socket_interface(facts: Facts, out: Findings, multi_node: bool) -> None:
    """The interface NCCL bootstraps on against the one the kernel routes ``MASTER_ADDR`` through."""
    env = facts.get("env") or {}
    interfaces = facts.get("interfaces") or []
    route = facts.get("route")
    route_if = route.get("interface") if route else None
    spec = env.get("NCCL_SOCKET_IFNAME")
    chosen = nccl_select_interfaces(spec, interfaces)
    all_names = [i["name"] for i in interfaces if i.get("ipv4")]
    relevant = has_gpu(facts)
    suffix = "" if relevant else " (NCCL unused on this CPU-only node)"
    check = "network-interface"
    if spec and not chosen:
        out.add(
            ERROR if relevant else OK,
            f"NCCL_SOCKET_IFNAME={spec} matches no interface with an IPv4 address "
            f"(have: {', '.join(all_names) or 'none'}){suffix}",
            f"export NCCL_SOCKET_IFNAME={route_if or (all_names[0] if all_names else 'eth0')}",
            check=check,
        )
        return
    if multi_node and chosen and all(n == "lo" for n in chosen):
        out.add(
            ERROR if relevant else WARNING,
            f"NCCL would use only the loopback interface, which cannot reach other nodes{suffix}",
            f"export NCCL_SOCKET_IFNAME={route_if or 'eth0'}",
            check=check,
        )
        return
    how = f"NCCL_SOCKET_IFNAME={spec}" if spec else "NCCL's default choice"
    first = chosen[0] if chosen else None
    route_txt = f"; traffic to MASTER_ADDR leaves through {route_if}" if route_if else ""
    if multi_node and route_if and route_if != "lo" and first and first != route_if:
        out.add(
            WARNING if relevant else OK,
            f"{how} is {', '.join(chosen)}{route_txt}: NCCL bootstraps on {first}, which may not reach "
            f"the other nodes (training stalls at the first collective){suffix}",
            f"export NCCL_SOCKET_IFNAME={route_if}",
            check=check,
        )
    else:
        out.ok(f"{how}: {', '.join(chosen) or 'none'}{route_txt}{suffix}", check=check)


def check_rdma(facts: Facts, node: str, multi_node: bool) -> list[Finding]:
    """InfiniBand / EFA presence: needed for fast all-reduce between GPU nodes."""
    out = Findings("rdma", node)
    ib = list(facts.get("infiniband") or [])
    fi = facts.get("fi_info") or {}
    efa = bool(fi.get("efa")) or any(d.startswith(("efa", "rdmap")) for d in ib)
    env = facts.get("env") or {}
    parts = []
    if ib:
        parts.append(f"RDMA devices: {', '.join(ib)}")
    if efa:
        parts.append("EFA provider found" if fi.get("efa") else "EFA device present")
    if parts:
        if env.get("NCCL_IB_DISABLE") == "1" and not efa:
            text = "; ".join(parts) + " but NCCL_IB_DISABLE=1 sends NCCL over TCP"
            return out.warn(text, "unset NCCL_IB_DISABLE").findings
        return out.ok("; ".join(parts)).findings
    if multi_node and has_gpu(facts):
        return out.warn(
            "no InfiniBand or EFA: NCCL between nodes runs over TCP sockets (far lower bus bandwidth)",
            "for multi-node training pick instances with EFA/InfiniBand (e.g. p4d/p5, NDv4) "
            "and install the NCCL RDMA plugin",
        ).findings
    why = "single node" if not multi_node else "CPU-only"
    return out.ok(f"no InfiniBand or EFA (not needed: {why})").findings


def check_reachability(
    facts: Sequence[Facts], labels: dict[int, str], probes: Sequence[PeerProbe] | None = None
) -> list[Finding]:
    """MASTER_ADDR:MASTER_PORT from each rank, and every node's test listener from every rank."""
    out = Findings("master-port", "*")
    for i, f in enumerate(facts):
        mp = f.get("master_probe")
        env = f.get("env") or {}
        target = f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
        if mp is None:
            continue
        if mp.get("ok"):
            out.ok(f"reaches {target}", node=labels[i], rank=f.get("rank"))
        else:
            out.error(
                f"cannot reach {target}: {mp.get('error')}",
                "allow TCP between all cluster nodes (e.g. a security group rule allowing the group itself)",
                node=labels[i],
                rank=f.get("rank"),
            )
    _peer_ports(facts, labels, probes or [], out)
    return out.findings


def _peer_ports(
    facts: Sequence[Facts], labels: dict[int, str], probes: Sequence[PeerProbe], out: Findings
) -> None:
    """One finding per (source node, unreachable node), and one per source node for what it reached."""
    rank_to_label = {f.get("rank"): labels[i] for i, f in enumerate(facts)}
    failures: dict[tuple[str, str], list[str]] = defaultdict(list)
    successes: dict[str, set[str]] = defaultdict(set)
    for p in probes:
        src = rank_to_label.get(p.get("rank"), "?")
        for r in p.get("results") or []:
            if r.get("ok"):
                successes[src].add(r["node"])
            else:
                failures[(src, r["node"])].append(f"{r['ip']}:{r['port']} {r.get('error')}")
    for (src, dst), errs in failures.items():
        out.error(
            f"cannot open a TCP connection to node {dst} on an ephemeral port ({errs[0]}); "
            "gloo and NCCL connect between all nodes on such ports",
            "allow all TCP between cluster nodes (not only MASTER_PORT)",
            check="peer-ports",
            node=src,
            rank=None,
        )
    for src, dsts in successes.items():
        bad = {d for (s, d) in failures if s == src}
        ok = sorted(dsts - bad)
        if ok:
            out.ok(f"reaches ephemeral TCP ports on {', '.join(ok)}", check="peer-ports", node=src, rank=None)
