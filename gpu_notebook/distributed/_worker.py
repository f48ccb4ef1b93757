"""The rank worker: one persistent process per rank that runs notebook cells.

A :class:`RankWorker` is wrapped into a Ray actor by :func:`remote_worker_class`. It keeps the user's namespace
across cells (like an ipyparallel engine), captures everything the process writes (Python threads, C code and
subprocesses, through a pipe on file descriptors 1 and 2) into a buffer the driver drains while a cell runs,
and initialises ``torch.distributed`` once with the torchrun environment variables set.

Two concurrency groups: ``exec`` (one thread) runs cells in order; ``ctl`` serves output draining, interrupts
and status while a cell runs.
"""

from __future__ import annotations

import ast
import ctypes
import io
import linecache
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any

_THIS_FILE = __file__.rstrip("c")

# Ray reads this attribute (what ``@ray.method(concurrency_group=...)`` sets) when the class becomes an actor;
# setting it directly keeps ray out of this module's imports.
_CTL = ("meta", "free_port", "ping", "drain_output", "interrupt")
_EXEC = ("init_process_group", "run_cell", "call", "push", "pull", "shutdown")


class _Capture:
    """A process-wide sink for output: a locked list of text chunks plus the file-descriptor pipe reader."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._lock = threading.Lock()
        self._total = 0
        self._fd_thread: threading.Thread | None = None
        self._orig_fds: dict[int, int] = {}

    def write(self, text: str) -> None:
        if text:
            with self._lock:
                self._chunks.append(text)
                self._total += len(text)
                if self._total > 8_000_000:  # never grow without bound between drains
                    joined = "".join(self._chunks)[-4_000_000:]
                    self._chunks = ["[... output truncated ...]\n", joined]
                    self._total = len(joined)

    def drain(self) -> str:
        with self._lock:
            text = "".join(self._chunks)
            self._chunks = []
            self._total = 0
        return text

    def capture_fds(self) -> None:
        """Send file descriptors 1 and 2 (C code, subprocesses) through a pipe into this buffer.

        What arrives is also copied to the original descriptors, so Ray's own worker log files still get it.
        """
        if self._fd_thread is not None:
            return
        read_fd, write_fd = os.pipe()
        for fd in (1, 2):
            try:
                self._orig_fds[fd] = os.dup(fd)
                os.dup2(write_fd, fd)
            except OSError:
                pass
        os.close(write_fd)
        orig_out = self._orig_fds.get(1)

        def pump() -> None:
            with os.fdopen(read_fd, "rb", buffering=0) as pipe:
                while True:
                    data = pipe.read(65536)
                    if not data:
                        return
                    self.write(data.decode("utf-8", "replace"))
                    if orig_out is not None:
                        try:
                            os.write(orig_out, data)
                        except OSError:
                            pass

        self._fd_thread = threading.Thread(target=pump, name="gpu_notebook-fd-capture", daemon=True)
        self._fd_thread.start()


class _StreamProxy(io.TextIOBase):
    """A text stream that writes into the capture buffer (used as sys.stdout and sys.stderr)."""

    def __init__(self, capture: _Capture, name: str) -> None:
        super().__init__()
        self._capture = capture
        self.name = name

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:  # type: ignore[override]
        self._capture.write(s)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # subprocess.run(stdout=sys.stdout) needs a real descriptor: the captured fd
        return 1 if self.name == "<stdout>" else 2


class Unpicklable:
    """Stands in for a value that could not be sent back to the notebook: keeps its type name and repr."""

    def __init__(self, type_name: str, text: str, reason: str) -> None:
        self.type_name, self.text, self.reason = type_name, text, reason

    def __repr__(self) -> str:
        return self.text


def _format_exception(exc: BaseException, cell_file: str | None) -> dict[str, Any]:
    """Format an exception raised by user code, without this module's frames."""
    te = traceback.TracebackException.from_exception(exc, capture_locals=False)
    stack = [f for f in te.stack if os.path.abspath(f.filename) != os.path.abspath(_THIS_FILE)]
    te.stack = traceback.StackSummary.from_list(stack)
    cell_lines = [f.lineno for f in stack if cell_file is not None and f.filename == cell_file]
    return {
        "ok": False,
        "etype": type(exc).__name__,
        "evalue": str(exc),
        "traceback": "".join(te.format()),
        "cell_lines": cell_lines,
    }


def _patch_torch_distributed() -> None:
    """Make torchrun-style code run unchanged on an already initialised group.

    ``init_process_group`` on an initialised default group returns quietly (it would raise otherwise), and
    ``destroy_process_group()`` of the default group is ignored: the group belongs to the worker, not the cell.
    """
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_gpu_notebook", False):
        return
    real_init, real_destroy = dist.init_process_group, dist.destroy_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if dist.is_initialized():
            return None
        return real_init(*args, **kwargs)

    def destroy_process_group(group: Any = None) -> None:
        if group is None or group is dist.GroupMember.WORLD:
            return None
        return real_destroy(group)

    init_process_group._gpu_notebook = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = real_init  # type: ignore[attr-defined]
    destroy_process_group.__wrapped__ = real_destroy  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.destroy_process_group = destroy_process_group
    dist._gpu_notebook_real_destroy = real_destroy  # type: ignore[attr-defined]


class RankWorker:
    """One rank of a distributed worker group; its namespace persists across cells."""

    def __init__(self, group_id: str, env: dict[str, str] | None = None) -> None:
        self.group_id = group_id
        self.rank: int | None = None
        self.ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self._exec_tid: int | None = None
        self._cell_started: float | None = None
        self._capture = _Capture()
        if env:
            os.environ.update(env)
        self._capture.capture_fds()
        sys.stdout = _StreamProxy(self._capture, "<stdout>")  # type: ignore[assignment]
        sys.stderr = _StreamProxy(self._capture, "<stderr>")  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RankWorker(rank={self.rank})"

    # ---- control group ---------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """Where this worker runs: node, IP, pid and the GPUs Ray gave it."""
        import ray

        ctx = ray.get_runtime_context()
        try:
            gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        except Exception:
            gpu_ids = []
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "gpu_ids": gpu_ids,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "busy": self._exec_tid is not None, "rank": self.rank}

    def drain_output(self) -> str:
        return self._capture.drain()

    def interrupt(self) -> bool:
        """Raise KeyboardInterrupt in the thread running the current cell (returns False if none runs)."""
        tid = self._exec_tid
        if tid is None:
            return False
        n = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(KeyboardInterrupt))
        return n == 1

    # ---- exec group --------------------------------------------------------------------------------------
    def init_process_group(
        self,
        rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: int,
        node_rank: int,
        master_addr: str,
        master_port: int,
        backend: str,
        cuda_visible_devices: str | None,
        device_index: int,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Set the torchrun variables and initialise torch.distributed for this rank."""
        import datetime

        if cuda_visible_devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_world_size),
            NODE_RANK=str(node_rank),
            GROUP_RANK=str(node_rank),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        import torch
        import torch.distributed as dist

        _patch_torch_distributed()
        if backend == "nccl":
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            torch.cuda.set_device(device_index)
            device = torch.device("cuda", device_index)
        else:
            device = torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group.__wrapped__(  # type: ignore[attr-defined]
                backend,
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        self.rank = rank
        self.ns.update(rank=rank, world_size=world_size, local_rank=local_rank, device=device)
        return {"rank": rank, "backend": dist.get_backend(), "device": str(device)}

    def run_cell(self, code: str, label: str, header: str | None = None) -> dict[str, Any]:
        """Run a cell in the persistent namespace; returns the last expression's value (like a REPL).

        ``header`` is the cell's first line in the notebook (the ``%%distributed`` line): line numbers in
        tracebacks then match the notebook cell's.
        """
        filename = f"<{label}>"
        if header is not None:
            code = "\n" + code
        lines = code.splitlines(True)
        if header is not None:
            lines[0] = header.rstrip("\n") + "\n"
        linecache.cache[filename] = (len(code), None, lines, filename)
        self._exec_tid = threading.get_ident()
        self._cell_started = time.time()
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            tail = tree.body[-1] if tree.body else None
            if isinstance(tail, ast.Expr):
                tree.body.pop()
                last = ast.Expression(tail.value)
            exec(compile(tree, filename, "exec"), self.ns)
            value = eval(compile(last, filename, "eval"), self.ns) if last is not None else None
            return {"ok": True, "value": _sendable(value)}
        except BaseException as exc:  # noqa: BLE001 - report everything, KeyboardInterrupt included
            return _format_exception(exc, filename)
        finally:
            self._exec_tid = None
            self._cell_started = None
            _flush_std()

    def call(self, fn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Run a Python function in this rank's process (the group is initialised)."""
        self._exec_tid = threading.get_ident()
        try:
            return {"ok": True, "value": fn(*args, **kwargs)}
        except BaseException as exc:  # noqa: BLE001
            return _format_exception(exc, None)
        finally:
            self._exec_tid = None
            _flush_std()

    def push(self, values: dict[str, Any]) -> list[str]:
        self.ns.update(values)
        return sorted(values)

    def pull(self, name: str) -> Any:
        if name not in self.ns:
            raise NameError(f"name {name!r} is not defined on rank {self.rank}")
        value = self.ns[name]
        try:
            import ray.cloudpickle as cp

            cp.dumps(value)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"variable {name!r} on rank {self.rank} cannot be pickled: {exc}") from None
        return value

    def shutdown(self) -> None:
        """Leave the process group cleanly (best effort)."""
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                getattr(dist, "_gpu_notebook_real_destroy", dist.destroy_process_group)()
        except Exception:  # noqa: BLE001
            pass


for _name in _CTL:
    getattr(RankWorker, _name).__ray_concurrency_group__ = "ctl"
for _name in _EXEC:
    getattr(RankWorker, _name).__ray_concurrency_group__ = "exec"


def _flush_std() -> None:
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _sendable(value: Any) -> Any:
    """The value itself if it can be pickled, else an :class:`Unpicklable` with its repr."""
    if value is None:
        return None
    try:
        import ray.cloudpickle as cp

        cp.dumps(value)
        return value
    except Exception as exc:  # noqa: BLE001
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001
            text = f"<{type(value).__name__} object>"
        return Unpicklable(type(value).__name__, text, str(exc))


_REMOTE_CLASS: Any = None


def remote_worker_class() -> Any:
    """The Ray actor class for :class:`RankWorker` (created once, on first use)."""
    global _REMOTE_CLASS
    if _REMOTE_CLASS is None:
        import ray

        _REMOTE_CLASS = ray.remote(concurrency_groups={"exec": 1, "ctl": 4}, max_restarts=0)(RankWorker)  # type: ignore[call-overload]
    return _REMOTE_CLASS
