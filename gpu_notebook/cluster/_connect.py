"""Connecting this process to Ray: a light local cluster (the embedded default) or an existing one by address."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from gpu_notebook._display import Progress, first_line
from gpu_notebook._registry import Slot, ray_connection
from gpu_notebook.cluster import _ray_exit  # noqa: F401 - a local Ray we start ends at once at a kernel shutdown
from gpu_notebook.errors import GpuNotebookError


class ConnectError(GpuNotebookError, RuntimeError):
    """Ray could not be started or reached (the message says what to do)."""


@dataclass
class RayConnection:
    """What this process is connected to."""

    address: str  # the GCS address, or the ray:// address given
    started_here: bool  # we started this Ray (and must shut it down)
    client_mode: bool  # ray:// (Ray Client)
    owned: bool = True  # we called ray.init (else someone else did and we only borrow the connection)
    dashboard_url: str = ""  # http://host:port of Ray's dashboard when it runs, else ""


#: the kernel's one Ray connection, in the registry with the rest of the kernel's state
_CONNECTION: Slot[RayConnection] = ray_connection

#: Ray's system config for a local Ray we start: no idle workers prestarted for the first driver
NO_PRESTART = {"prestart_worker_first_driver": False}


#: seconds a ``host:port`` or ``ray://`` address has to answer a TCP connect before Ray is asked to connect
#: (Ray itself retries a silent GCS address for many minutes)
PROBE_TIMEOUT_S = 10.0


def current_connection() -> RayConnection | None:
    """The kernel's Ray connection while Ray is up (None once Ray was shut down behind our back)."""
    ray = _import_ray()
    conn = _CONNECTION.get()
    if conn is not None and not ray.is_initialized():
        return None
    return conn


def recorded_connection() -> RayConnection | None:
    """The connection :func:`connect` recorded last, whether or not Ray is still up."""
    return _CONNECTION.get()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConnectError(
            f"Ray is not installed in this environment ({exc}): pip install 'gpu_notebook[ray]' "
            f"(or 'ray[default]'), then restart the kernel"
        ) from None
    return ray


def address_from_env() -> str | None:
    """The Ray address in ``RAY_ADDRESS`` (what ``ray.init()`` connects to), or ``None`` when unset or ``local``."""
    value = os.environ.get("RAY_ADDRESS", "").strip()
    return value if value and value != "local" else None


def _quiet_env() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def normalise_address(address: str) -> str:
    """Check an address: ``auto``, ``host:port`` or ``ray://host:port``."""
    address = address.strip()
    if address in ("auto", "local"):
        return address
    body = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = body.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConnectError(
            f"bad Ray address {address!r}: use 'auto' (the cluster this machine belongs to), 'host:port' "
            f"(the GCS address printed by `ray start --head`) or 'ray://host:port' (Ray Client)"
        )
    return address


def connect(
    address: str | None,
    num_cpus: float | None = None,
    num_gpus: int | None = None,
    dashboard: bool = False,
    progress: Progress | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> RayConnection:
    """Start a local Ray (``address=None``) or connect to one; reuse the connection this process already has.

    ``runtime_env`` is the job-wide one of a connection to an existing cluster (Ray Client needs our package
    there: its server on the head unpickles our classes).
    """
    say = progress or (lambda msg: None)
    _quiet_env()
    ray = _import_ray()

    if address is not None:
        address = normalise_address(address)
        if address == "local":
            address = None
    if ray.is_initialized():
        conn = _reuse_connection(ray, address, say)
    elif address is None:
        conn = _start_local(ray, num_cpus, num_gpus, dashboard, say)
    else:
        conn = _connect_to(ray, address, runtime_env, say)
    _CONNECTION.set(conn)
    return conn


def _reuse_connection(ray: Any, address: str | None, say: Progress) -> RayConnection:
    """The connection this process already has, when ``address`` asks for it (or for any).

    A process holds one Ray connection, so asking for another address is a :class:`ConnectError`. A Ray someone
    else started (``ray.init()`` in the notebook) is borrowed: ``owned=False``, so stopping our cluster leaves it.
    """
    existing = _CONNECTION.get()
    if address is None or existing is None or address in ("auto", existing.address):
        if existing is None:
            rctx = ray.get_runtime_context()
            gcs = getattr(rctx, "gcs_address", None) or "existing"
            existing = RayConnection(
                gcs, started_here=False, client_mode=ray.util.client.ray.is_connected(), owned=False
            )
        say(f"using the Ray this kernel is already connected to ({existing.address})")
        return existing
    raise ConnectError(
        f"this kernel is already connected to Ray at {existing.address}; a process can hold one Ray "
        f"connection. Stop the clusters that use it (%gpu_cluster stop --all) before connecting to {address}."
    )


def _start_local(
    ray: Any, num_cpus: float | None, num_gpus: int | None, dashboard: bool, say: Progress
) -> RayConnection:
    """Start a local Ray of ``num_cpus`` (default: the CPUs this process may use) and say where its dashboard is."""
    cpus = num_cpus if num_cpus is not None else local_cpus()
    say(
        f"starting a local Ray cluster ({cpus:g} CPUs{'' if num_gpus is None else f', {num_gpus} GPUs'}, "
        f"dashboard {'on' if dashboard else 'off'})"
    )
    ctx = _init_local(ray, _local_init_kwargs(cpus, num_gpus, dashboard), say)
    url = _dashboard_url(ctx) if dashboard else ""
    if dashboard:
        say(
            f"Ray dashboard: {url}"
            if url
            else "the Ray dashboard did not start (is 'ray[default]' installed?); the cluster runs without it"
        )
    return RayConnection(ctx.address_info.get("gcs_address", "local"), True, False, dashboard_url=url)


def _local_init_kwargs(cpus: float, num_gpus: int | None, dashboard: bool) -> dict[str, Any]:
    """``ray.init``'s arguments for a local Ray: quiet, and an object store of a tenth of memory (100 MiB to 2 GiB)."""
    mem = _total_memory()
    store = int(min(2 * 2**30, max(100 * 2**20, mem * 0.1))) if mem else None
    return dict(
        address="local",
        num_cpus=int(cpus) if float(cpus).is_integer() else None,
        num_gpus=num_gpus,
        include_dashboard=dashboard,
        object_store_memory=store,
        logging_level=logging.WARNING,
        log_to_driver=False,
        configure_logging=True,
        # Ray starts one idle worker per CPU for the first driver; ours are actors in processes of their own,
        # so on a 2-core laptop those idle workers only take CPU from the start (docs/benchmarks.md, "Small machines")
        _system_config=NO_PRESTART,
    )


def _init_local(ray: Any, init_kw: dict[str, Any], say: Progress) -> Any:
    """``ray.init(**init_kw)``, once more when the node missed Ray's 30 s to register; returns Ray's context.

    Each failed or interrupted start ends what it had started (see :func:`_abort_local_start`); a failure becomes
    one :class:`ConnectError` with Ray's text.
    """
    # Ray warns on every local start that it enabled token authentication (it stays enabled): not news.
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = auth_log.level
    auth_log.setLevel(logging.ERROR)
    try:
        for attempt in (1, 2):
            before = _child_pids()
            try:
                ctx = ray.init(**init_kw)
                break
            # whatever ray.init raises (its own errors, OSError, ValueError...) becomes one ConnectError
            except Exception as exc:  # noqa: BLE001
                _abort_local_start(ray, before)
                if attempt == 1 and _slow_node_start(exc):
                    say(
                        "Ray's node did not register within Ray's own 30 s (is the machine busy?); "
                        "starting it once more"
                    )
                    continue
                raise ConnectError(f"could not start a local Ray cluster: {exc}") from exc
            # Ctrl-C: ray.init leaves what it started so far (GCS, dashboard, raylet) running
            except BaseException:
                _abort_local_start(ray, before)
                raise
    finally:
        auth_log.setLevel(level)
    return ctx


def _connect_to(ray: Any, address: str, runtime_env: dict[str, Any] | None, say: Progress) -> RayConnection:
    """Connect to the Ray at ``address`` (``auto``, ``host:port`` or ``ray://``) after a quick probe of it.

    A Ray Client (``ray://``) connection is tried three times when the server was not ready; anything else that
    fails is one :class:`ConnectError` with a hint.
    """
    say(f"connecting to the Ray cluster at {address}")
    probe(address)
    attempts = 3 if address.startswith("ray://") else 1
    url = ""
    for attempt in range(1, attempts + 1):
        try:
            ctx = ray.init(
                address=address, logging_level=logging.WARNING, log_to_driver=False, runtime_env=runtime_env
            )
            url = _dashboard_url(ctx)
            break
        except Exception as exc:  # noqa: BLE001 - as for a local start: every failure becomes a ConnectError
            # Ray Client starts a server process per client on the head; on a busy head it can miss its start-up
            # deadline ("Initialization failure from server"): transient, try again
            if attempt < attempts and _transient_client_error(exc):
                say(
                    f"the Ray Client server at {address} was not ready ({first_line(str(exc))[:300]}); retrying"
                )
                try:
                    ray.shutdown()
                except Exception:  # noqa: BLE001 - a half-made connection may fail to close; the retry goes on
                    pass
                time.sleep(2.0 * attempt)
                continue
            _raise_connect_error(address, exc)
    return RayConnection(address, False, address.startswith("ray://"), dashboard_url=url)


def _dashboard_url(ctx: Any) -> str:
    """``http://host:port`` of the dashboard ``ray.init`` started (Ray gives it without the scheme), or ""."""
    url = str(getattr(ctx, "dashboard_url", "") or "")
    return url if not url or "://" in url else f"http://{url}"


def local_cpus() -> int:
    """The CPUs this process may use: its affinity mask (``taskset``, a container's cpuset), capped by a cgroup
    CPU quota (Binder, Docker ``--cpus``); at least 1.

    ``os.cpu_count()`` counts the host's cores, so on a 2-CPU Binder pod of a 64-core host a local Ray would
    declare 64 CPUs and give each worker a whole one that is not there.
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity mask
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        n = min(n, int(quota))
    return max(1, n)


def _cgroup_cpu_quota() -> float | None:
    """CPUs the cgroup's quota allows (v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``), None when unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, _, period = f.read().strip().partition(" ")
        if quota != "max" and float(period or 100000) > 0:
            return float(quota) / float(period or 100000)
        return None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = float(f.read().strip())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = float(f.read().strip())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _child_pids() -> set[int]:
    """This process's direct children (Linux ``/proc``; elsewhere psutil when installed, else none)."""
    me = os.getpid()
    pids: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        try:
            import psutil
        except ImportError:
            return pids
        return {p.pid for p in psutil.Process(me).children()}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # the command name may hold spaces and parentheses
        if len(fields) > 1 and int(fields[1]) == me:
            pids.add(int(entry))
    return pids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        try:
            import psutil

            return " ".join(psutil.Process(pid).cmdline())
        except Exception:  # noqa: BLE001 - psutil missing, or the process gone or not ours: no command line
            return ""


def _slow_node_start(exc: BaseException) -> bool:
    """Whether a local ``ray.init`` failed because its raylet took longer than Ray's fixed 30 s to register (a busy
    or slow machine: a Binder pod, a laptop compiling something); a second start usually makes it."""
    return "timed out during startup" in str(exc)


def _abort_local_start(ray: Any, before: set[int]) -> None:
    """Undo a local ``ray.init`` that did not finish (interrupted, or failed half way).

    ``ray.shutdown()`` stops what Ray already registered; the processes it started before that (the GCS, the
    dashboard, the raylet and its workers) would otherwise run until the kernel exits: end the Ray processes
    this process started since ``before``.
    """
    import signal

    try:
        ray.shutdown()
    except BaseException:  # noqa: BLE001 - best effort; the caller re-raises the original error
        pass
    left = [pid for pid in _child_pids() - before if "ray" in _cmdline(pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 3.0
        while left and time.monotonic() < deadline:
            for pid in list(left):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done == pid:
                    left.remove(pid)
            if left:
                time.sleep(0.05)
        if not left:
            break


def probe(address: str, timeout: float | None = None) -> None:
    """Fail fast, with a clear :class:`ConnectError`, when nothing answers at ``address``.

    ``ray.init`` keeps retrying an address where no Ray head listens for many minutes (a GCS address) or
    half a minute (Ray Client); a plain TCP connect tells in moments. ``auto`` is checked only when it means
    ``RAY_ADDRESS``.
    """
    shown = address
    if address == "auto":
        env = address_from_env()
        if env is None or env == "auto":
            return
        address, shown = env, f"{env} (RAY_ADDRESS)"
    body = address[len("ray://") :] if address.startswith("ray://") else address
    host, _, port = body.rpartition(":")
    host = host.strip("[]")
    wait = PROBE_TIMEOUT_S if timeout is None else timeout
    kind = (
        "Ray Client server (ray start --head opens it on port 10001)"
        if address.startswith("ray://")
        else "Ray head (its GCS port, 6379 unless ray start --head --port says otherwise)"
    )
    try:
        with socket.create_connection((host, int(port)), timeout=wait):
            pass
    except (OSError, ValueError) as exc:
        if isinstance(exc, socket.gaierror):
            why = f"the host name {host!r} does not resolve ({exc.strerror or exc})"
        elif isinstance(exc, TimeoutError):
            why = f"no answer from {host} port {port} within {wait:g} s (a firewall, or the wrong host?)"
        elif isinstance(exc, ConnectionRefusedError):
            why = f"nothing listens on {host} port {port} (connection refused)"
        else:
            why = f"{host} port {port} cannot be reached ({exc})"
        raise ConnectError(
            f"could not connect to Ray at {shown}: {why}; is a {kind} running there?"
        ) from None
    if not _speaks_grpc(host, int(port), wait):
        raise ConnectError(
            f"could not connect to Ray at {shown}: something answers on {host} port {port}, but it does not speak "
            f"gRPC (an SSH or web server?), so it is no {kind}; check the port"
        )


def _speaks_grpc(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` completes a gRPC (HTTP/2) handshake, as a Ray GCS or Ray Client server does.

    ``ray.init`` waits a long time on a port where another server answers (``host:22``). With Ray's TLS
    (``RAY_USE_TLS``) a plain channel cannot tell, and without grpc (it comes with Ray) there is no check: True.
    """
    if os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true", "yes"):
        return True
    try:
        import grpc
    except ImportError:
        return True
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def _transient_client_error(exc: BaseException) -> bool:
    # not a plain timeout: that is what a wrong address gives, and retrying it only makes the user wait
    return "initialization failure" in str(exc).lower()


def _raise_connect_error(address: str, exc: BaseException) -> NoReturn:
    hint = (
        "is a Ray head running there? (`ray start --head` prints its address)"
        if address != "auto"
        else "no running Ray cluster was found on this machine (start one with `ray start --head`)"
    )
    if address != "auto" and os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        # Ray sends its token to an address given by hand only in token mode, and a cluster that ray.init()
        # started asks for one: it then looks like nothing answers
        hint += (
            "; if it uses Ray's token authentication (a cluster another notebook's ray.init() started does), "
            "run %env RAY_AUTH_MODE=token first: Ray then sends the token of ~/.ray/auth_token"
        )
    raise ConnectError(
        f"could not connect to Ray at {address}: {first_line(str(exc))[:300]}; {hint}"
    ) from exc


def disconnect() -> None:
    """Shut down Ray in this process (a local Ray we started stops with it)."""
    ray = _import_ray()

    if ray.is_initialized():
        ray.shutdown()
    _CONNECTION.set(None)


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cluster_nodes() -> list[dict[str, Any]]:
    """The alive nodes of the connected Ray cluster."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]
