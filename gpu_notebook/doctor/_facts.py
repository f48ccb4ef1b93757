"""Gather the facts the doctor judges, inside one worker process (or this one).

Everything here only reads (apart from one tiny CUDA kernel on this process's GPU, which proves that the
driver really runs PyTorch's build): versions, ``torch.cuda``, NVML (``pynvml`` from nvidia-ml-py, when installed),
environment variables, network interfaces, ``/sys/class/infiniband``, ``fi_info``, disk and ``/dev/shm``.
Each probe is wrapped: a failing probe records ``"ExcType: message"`` under ``facts["probe_errors"]`` and
never raises, so a CPU-only node or a broken driver still gives a full set of facts.

The peer reachability test has two halves: :func:`collect_facts` (with ``listen=True``) opens a TCP listener
in this process and reports its address; :func:`probe_peers` then connects from every rank to one listener
per node, plus ``MASTER_ADDR:MASTER_PORT``; :func:`stop_listener` closes the listeners afterwards (they
also close by themselves after two minutes).
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from ._shapes import (
    DiskUsage,
    DistFacts,
    Endpoint,
    Facts,
    FiInfo,
    Interface,
    KernelProbe,
    NvmlFacts,
    NvmlGpu,
    PeerProbe,
    PeerResult,
    Route,
    ShmFacts,
    TcpProbe,
    TorchGpu,
)

__all__ = ["collect_facts", "probe_peers", "stop_listener", "probe_tcp", "list_interfaces", "route_interface"]

NCCL_ENV = (
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "NCCL_IB_DISABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_NET",
    "GLOO_SOCKET_IFNAME",
    "FI_PROVIDER",
    "FI_EFA_USE_DEVICE_RDMA",
    "CUDA_VISIBLE_DEVICES",
    "MASTER_ADDR",
    "MASTER_PORT",
)

_listener: dict[str, Any] = {}


def _probe(facts: Facts, name: str, fn: Callable[[], Any], default: Any = None) -> Any:
    """``facts[name] = fn()``, or ``default`` with the error recorded under ``probe_errors``."""
    raw = cast("dict[str, Any]", facts)  # name is a key of Facts chosen at run time
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - a probe must never break the doctor
        raw.setdefault("probe_errors", {})[name] = f"{type(exc).__name__}: {exc}"[:300]
        value = default
    raw[name] = value
    return value


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist, key in (
        ("torch", "torch"),
        ("ray", "ray"),
        ("gpu_notebook", "gpu_notebook"),
        ("numpy", "numpy"),
    ):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out


def list_interfaces() -> list[Interface]:
    """Network interfaces with their IPv4 address (``None`` when they have none), from the kernel."""
    out: list[Interface] = []
    try:
        import psutil

        addrs = psutil.net_if_addrs()
        stats = psutil.net_if_stats()
        for name, entries in addrs.items():
            ipv4 = next((a.address for a in entries if a.family == socket.AF_INET), None)
            up = stats[name].isup if name in stats else None
            speed = stats[name].speed if name in stats else None
            out.append({"name": name, "ipv4": ipv4, "up": up, "speed_mbps": speed or None})
        return sorted(out, key=lambda i: i["name"])
    except ImportError:
        pass
    import fcntl
    import struct

    for _, name in socket.if_nameindex():
        ipv4 = None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                siocgifaddr = 0x8915
                packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
                ipv4 = socket.inet_ntoa(packed[20:24])
            except OSError:
                pass
        out.append({"name": name, "ipv4": ipv4, "up": None, "speed_mbps": None})
    return sorted(out, key=lambda i: i["name"])


def route_interface(target: str | None, interfaces: Sequence[Interface]) -> Route:
    """The local IP and interface the kernel routes to ``target`` through (a UDP connect sends nothing)."""
    if not target:
        return {"ip": None, "interface": None}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(target), 9))
        ip = s.getsockname()[0]
    name = next((i["name"] for i in interfaces if i.get("ipv4") == ip), None)
    return {"ip": ip, "interface": name}


def probe_tcp(host: str, port: int, timeout: float = 3.0) -> TcpProbe:
    """Try a TCP connect; ``{"ok", "ms", "error"}``."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
        return {"ok": True, "ms": round((time.perf_counter() - t0) * 1000, 2), "error": None}
    except OSError as exc:
        return {"ok": False, "ms": None, "error": f"{type(exc).__name__}: {exc}"}


def _torch_facts(facts: Facts, kernel_probe: str = "auto") -> None:
    import torch

    facts["torch_cuda"] = torch.version.cuda
    facts["cuda_available"] = bool(torch.cuda.is_available())
    facts["device_count"] = int(torch.cuda.device_count()) if facts["cuda_available"] else 0
    facts["torch_arch_list"] = list(torch.cuda.get_arch_list()) if facts["cuda_available"] else []
    gpus: list[TorchGpu] = []
    for i in range(facts["device_count"]):
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)
        gpus.append(
            {
                "index": i,
                "name": props.name,
                "cc": [props.major, props.minor],
                "uuid": str(uuid) if uuid is not None else None,
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
        )
    facts["gpus"] = gpus
    device: int | None = None
    if facts["device_count"]:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()):
            device = int(torch.cuda.current_device())
        else:
            device = local_rank % facts["device_count"]
    facts["current_device"] = device
    # cudaDriverGetVersion: the CUDA version of the user-mode libcuda this process loaded, which a CUDA
    # forward-compatibility package (cuda-compat) makes newer than the kernel module NVML reports
    facts["libcuda_cuda"] = None
    get_driver = getattr(torch._C, "_cuda_getDriverVersion", None)
    if facts["cuda_available"] and get_driver is not None:
        try:
            facts["libcuda_cuda"] = int(get_driver()) or None
        except Exception:  # noqa: BLE001 - a private torch API: unknown is an answer the checks handle
            facts["libcuda_cuda"] = None
    facts["cuda_kernel"] = None
    if device is not None:
        if _probe_here(kernel_probe, torch):
            facts["cuda_kernel"] = _kernel_probe(torch, device)
        else:
            facts["cuda_kernel"] = _kernel_probe_subprocess(device, facts["probe_errors"])
    nccl = None
    if facts["cuda_available"]:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - CPU builds have no NCCL
            nccl = None
    facts["nccl_version"] = nccl


def _probe_here(mode: str, torch: Any) -> bool:
    """Whether the kernel probe runs in this process: ``"here"``; ``"subprocess"``; ``"auto"``: here only when
    this process already has CUDA initialised (the probe's CUDA context then costs nothing more). The notebook's
    kernel must not keep a CUDA context (hundreds of MiB on the GPU, and on a GPU in exclusive-process mode no
    worker could use it) just because the doctor looked."""
    if mode == "here":
        return True
    if mode == "subprocess":
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - when in doubt, probe in a subprocess (never leave a CUDA context here)
        return False


_PROBE_CODE = (
    "import json, sys, torch\n"
    "from gpu_notebook.doctor._facts import _kernel_probe\n"
    "print(json.dumps(_kernel_probe(torch, int(sys.argv[1]))))\n"
)


def _kernel_probe_subprocess(
    device: int, errors: dict[str, str], timeout: float = 120.0
) -> KernelProbe | None:
    """:func:`_kernel_probe` in a short-lived Python process (same interpreter and environment), so no CUDA
    context stays behind here. None (recorded in ``errors``) when the process itself could not report."""
    import json

    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE, str(device)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ),
        )
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode == 0 and lines:
            result = json.loads(lines[-1])
            if isinstance(result, dict) and "ok" in result:
                return cast(KernelProbe, result)
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        errors["cuda_kernel"] = f"probe process exited with {out.returncode}: {tail}"[:300]
    except Exception as exc:  # noqa: BLE001 - a timeout, no interpreter: the probe's answer is unknown
        errors["cuda_kernel"] = f"{type(exc).__name__}: {exc}"[:300]
    return None


def _kernel_probe(torch: Any, device: int) -> KernelProbe:
    """Run three tiny kernels on ``cuda:device``: ``{"ok": True, "error": None}`` or the error they raised."""
    try:
        x = torch.arange(4, device=f"cuda:{device}", dtype=torch.float32)
        total = float((x * 2).sum().item())
    except Exception as exc:  # noqa: BLE001 - "no kernel image", "driver version is insufficient", ...
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if total != 12.0:
        return {"ok": False, "error": f"wrong result: 2 * (0 + 1 + 2 + 3) gave {total}"}
    return {"ok": True, "error": None}


def _dist_facts() -> DistFacts:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {"initialized": False}
    return {
        "initialized": True,
        "backend": str(dist.get_backend()),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
    }


def _proc_driver_version(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The kernel module's version from ``/proc/driver/nvidia/version`` (no NVML needed)."""
    import re

    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def _proc_gpu_count(path: str = "/proc/driver/nvidia/gpus") -> int | None:
    """How many GPUs the NVIDIA kernel module drives (one directory per PCI device); ``None`` without it."""
    try:
        return len(os.listdir(path))
    except OSError:
        return None


def _nvml_facts() -> NvmlFacts:
    try:
        import pynvml
    except ImportError:
        return {
            "available": False,
            "reason": "pynvml (nvidia-ml-py) is not installed",
            "driver": _proc_driver_version(),
            "gpu_count": _proc_gpu_count(),
        }
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded on CPU nodes
        return {
            "available": False,
            "reason": f"{type(exc).__name__}: {exc}",
            "driver": _proc_driver_version(),
            "gpu_count": _proc_gpu_count(),
        }
    try:
        out: NvmlFacts = {"available": True}
        out["driver"] = _nvml_try(pynvml.nvmlSystemGetDriverVersion)
        out["cuda_driver"] = _nvml_try(pynvml.nvmlSystemGetCudaDriverVersion_v2) or _nvml_try(
            pynvml.nvmlSystemGetCudaDriverVersion
        )
        out["gpus"] = [_nvml_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - the facts are read; a failing shutdown changes none of them
            pass


def _nvml_try(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with bytes decoded, or None when this GPU or driver does not support the query."""
    try:
        value = fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return None
    return value.decode() if isinstance(value, bytes) else value


def _nvml_gpu(pynvml: Any, i: int) -> NvmlGpu:
    """What NVML says about GPU ``i``: identity, ECC and row remapping, throttle reasons, persistence."""
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    throttle_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    uncorrected = getattr(pynvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    remap = _nvml_try(pynvml.nvmlDeviceGetRemappedRows, h)
    pci = _nvml_try(pynvml.nvmlDeviceGetPciInfo, h)
    ecc_mode = _nvml_try(pynvml.nvmlDeviceGetEccMode, h)
    cc = _nvml_try(pynvml.nvmlDeviceGetCudaComputeCapability, h)
    throttle = _nvml_try(throttle_fn, h) if throttle_fn else None
    persistence = _nvml_try(pynvml.nvmlDeviceGetPersistenceMode, h)
    bus_id = pci.busId if pci is not None else None
    return {
        "index": i,
        "name": _nvml_try(pynvml.nvmlDeviceGetName, h),
        "uuid": _nvml_try(pynvml.nvmlDeviceGetUUID, h),
        "cc": list(cc) if cc else None,
        "pci_bus_id": (bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id))
        if pci is not None
        else None,
        "ecc_mode": ecc_mode[0] if ecc_mode else None,
        "ecc_uncorrected_volatile": _nvml_try(
            pynvml.nvmlDeviceGetTotalEccErrors, h, uncorrected, pynvml.NVML_VOLATILE_ECC
        ),
        "ecc_uncorrected_aggregate": _nvml_try(
            pynvml.nvmlDeviceGetTotalEccErrors, h, uncorrected, pynvml.NVML_AGGREGATE_ECC
        ),
        "remap_pending": bool(remap[2]) if remap else None,
        "remap_failure": bool(remap[3]) if remap else None,
        "throttle_mask": int(throttle) if throttle is not None else None,
        "persistence": int(persistence) if persistence is not None else None,
        "temperature_c": _nvml_try(pynvml.nvmlDeviceGetTemperature, h, 0),
    }


def _infiniband() -> list[str]:
    path = "/sys/class/infiniband"
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _fi_info() -> FiInfo:
    exe = shutil.which("fi_info") or next(
        (p for p in ("/opt/amazon/efa/bin/fi_info",) if os.path.exists(p)), None
    )
    if exe is None:
        return {"found": False, "efa": False}
    proc = subprocess.run([exe, "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True, text=True, timeout=10)
    efa = proc.returncode == 0 and "provider: efa" in proc.stdout
    return {"found": True, "efa": efa, "output": (proc.stdout or proc.stderr)[:300]}


def _storage() -> dict[str, DiskUsage]:
    out: dict[str, DiskUsage] = {}
    for path in dict.fromkeys([os.getcwd(), "/tmp", os.path.expanduser("~")]):
        try:
            usage = shutil.disk_usage(path)
            out[path] = {"free": usage.free, "total": usage.total}
        except OSError:
            continue
    return out


def _shm() -> ShmFacts | None:
    if not os.path.isdir("/dev/shm"):
        return None
    st = os.statvfs("/dev/shm")
    return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


def _node_ip(route: Route | None) -> str | None:
    if "ray" in sys.modules:
        try:
            import ray

            if ray.is_initialized():
                return str(ray.util.get_node_ip_address())
        except Exception:  # noqa: BLE001 - Ray half up: fall back to the route's or the host name's address
            pass
    if route and route.get("ip") and not str(route["ip"]).startswith("127."):
        return str(route["ip"])
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def _start_listener(host: str = "0.0.0.0") -> dict[str, int]:
    """Open a TCP listener on an ephemeral port in this process (accepts and closes connections)."""
    _stop_listener()
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, 0))
    server.listen(64)
    server.settimeout(0.5)
    stop = threading.Event()
    deadline = time.time() + 120  # never outlive a forgotten probe by long

    def serve() -> None:
        while not stop.is_set() and time.time() < deadline:
            try:
                conn, _ = server.accept()
                conn.close()
            except TimeoutError:
                continue
            except OSError:
                break
        server.close()

    thread = threading.Thread(target=serve, name="gnb-doctor-listener", daemon=True)
    thread.start()
    _listener.update(server=server, stop=stop, thread=thread)
    return {"port": server.getsockname()[1]}


def stop_listener() -> bool:
    """Close this process's test listener, once every rank has probed it; True if one was open."""
    was_open = "stop" in _listener
    _stop_listener()
    return was_open


def _stop_listener() -> None:
    stop = _listener.pop("stop", None)
    thread = _listener.pop("thread", None)
    _listener.pop("server", None)
    if stop is not None:
        stop.set()
    if thread is not None:
        thread.join(timeout=2)


def collect_facts(listen: bool = False, kernel_probe: str = "auto") -> Facts:
    """Everything the doctor needs to know about this process and its node; never raises.

    Parameters
    ----------
    listen
        Also open a TCP listener on an ephemeral port for :func:`probe_peers` (its port is in
        ``facts["listen_port"]``).
    kernel_probe
        Where the tiny CUDA kernel that proves the driver runs PyTorch's build is run: ``"here"`` (a worker
        that uses the GPU anyway), ``"subprocess"``, or ``"auto"`` (here only if this process already
        initialised CUDA; else in a short-lived subprocess, so e.g. the notebook keeps no CUDA context).
    """
    facts: Facts = {"probe_errors": {}}
    env = os.environ
    facts["rank"] = int(env["RANK"]) if env.get("RANK", "").isdigit() else None
    facts["local_rank"] = int(env["LOCAL_RANK"]) if env.get("LOCAL_RANK", "").isdigit() else None
    facts["world_size"] = int(env["WORLD_SIZE"]) if env.get("WORLD_SIZE", "").isdigit() else None
    facts["hostname"] = socket.gethostname()
    facts["pid"] = os.getpid()
    facts["platform"] = platform.platform()
    facts["env"] = {k: env.get(k) for k in NCCL_ENV}
    _probe(facts, "versions", _versions, {})
    _probe(facts, "dist", _dist_facts, {"initialized": False})
    dist_info = facts["dist"] or {}
    if dist_info.get("initialized"):
        facts["rank"] = dist_info["rank"]
        facts["world_size"] = dist_info["world_size"]
    try:
        _torch_facts(facts, kernel_probe)
    except Exception as exc:  # noqa: BLE001 - a broken torch install is a finding to report, not a crash
        facts["probe_errors"]["torch"] = f"{type(exc).__name__}: {exc}"[:300]
        for key, default in (
            ("torch_cuda", None),
            ("cuda_available", False),
            ("device_count", 0),
            ("torch_arch_list", []),
            ("gpus", []),
            ("current_device", None),
            ("libcuda_cuda", None),
            ("cuda_kernel", None),
            ("nccl_version", None),
        ):
            cast("dict[str, Any]", facts).setdefault(key, default)
    _probe(facts, "nvml", _nvml_facts, {"available": False, "reason": "probe failed"})
    interfaces = _probe(facts, "interfaces", list_interfaces, [])
    _probe(facts, "route", lambda: route_interface(env.get("MASTER_ADDR"), interfaces or []), None)
    facts["node_ip"] = _node_ip(facts.get("route"))
    _probe(facts, "infiniband", _infiniband, [])
    _probe(facts, "fi_info", _fi_info, {"found": False, "efa": False})
    _probe(facts, "storage", _storage, {})
    _probe(facts, "shm", _shm, None)
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT", "").isdigit():
        _probe(facts, "master_probe", lambda: probe_tcp(env["MASTER_ADDR"], int(env["MASTER_PORT"])), None)
    else:
        facts["master_probe"] = None
    facts["listen_port"] = None
    if listen:
        started = _probe(facts, "listener", _start_listener, None)
        facts["listen_port"] = started["port"] if started else None
    return facts


def probe_peers(endpoints: Sequence[Endpoint], timeout: float = 3.0) -> PeerProbe:
    """Connect to each ``{"node", "ip", "port"}`` endpoint (listeners stay open: see :func:`stop_listener`).

    Returns ``{"rank", "results": [{"node", "ip", "port", "ok", "ms", "error"}]}``.
    """
    results: list[PeerResult] = [
        {**ep, **probe_tcp(ep["ip"], ep["port"], timeout=timeout)} for ep in endpoints
    ]
    rank = os.environ.get("RANK")
    return {"rank": int(rank) if rank and rank.isdigit() else None, "results": results}
