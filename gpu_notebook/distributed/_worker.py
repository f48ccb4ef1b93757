"""The rank worker: one persistent process per rank that runs notebook cells.

A :class:`RankWorker` is wrapped into a Ray actor by :func:`remote_worker_class`. It keeps the user's namespace
across cells (like an ipyparallel engine), captures everything the process writes (Python threads, C code and
subprocesses, through a pipe on file descriptors 1 and 2) into a buffer the driver drains while a cell runs,
and initialises ``torch.distributed`` once with the torchrun environment variables set.

Two concurrency groups: ``exec`` (one thread) runs cells in order; ``ctl`` serves output draining, interrupts
and status while a cell runs.

What a cell sends back is made safe for the notebook first: torch tensors are moved to the CPU (the notebook
may have no GPU), values that cannot be pickled become :class:`Unpicklable`, and values over a size limit
become :class:`TooLarge` (so ``model.state_dict()`` as a cell's last line does not copy every rank's weights
into the kernel). At the end of a cell, libc's buffers are flushed and the pipe reader is waited for, so
everything the cell wrote is delivered with the cell.
"""

from __future__ import annotations

import ast
import codecs
import copy
import ctypes
import io
import linecache
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

_THIS_FILE = __file__.rstrip("c")

# Ray reads this attribute (what ``@ray.method(concurrency_group=...)`` sets) when the class becomes an actor;
# setting it directly keeps ray out of this module's imports.
_CTL = ("meta", "free_port", "ping", "drain_output", "interrupt")
_EXEC = ("init_process_group", "run_cell", "call", "push", "pull", "shutdown")

DEFAULT_MAX_RESULT_BYTES = 64 * 2**20  # the largest value (pickled) a cell or call sends back by default

# Written into the capture pipe at the end of a cell; the reader takes it out and reports having read it.
_SYNC_PREFIX = b"\x00gpu_notebook:sync:"
_SYNC_END = b"\x00"
_SYNC_DIGITS = 20


def _split_sync(buf: bytes) -> tuple[bytes, list[int], bytes]:
    """Take the end-of-cell markers out of bytes read from the capture pipe.

    Returns the bytes that are output, the sequence numbers of the markers found, and a tail to hold back
    until the next read (the beginning of a marker that the read cut off).
    """
    out: list[bytes] = []
    seqs: list[int] = []
    pos = 0
    while True:
        i = buf.find(_SYNC_PREFIX, pos)
        if i < 0:
            break
        start = i + len(_SYNC_PREFIX)
        j = buf.find(_SYNC_END, start, start + _SYNC_DIGITS + 1)
        tail = buf[start:]
        if j < 0 and len(tail) <= _SYNC_DIGITS and (not tail or tail.isdigit()):
            out.append(buf[pos:i])
            return b"".join(out), seqs, buf[i:]  # cut off by the read
        if j > start and buf[start:j].isdigit():
            out.append(buf[pos:i])
            seqs.append(int(buf[start:j]))
            pos = j + 1
        else:  # not one of ours: the user's output
            out.append(buf[pos : i + 1])
            pos = i + 1
    rest = buf[pos:]
    for k in range(min(len(rest), len(_SYNC_PREFIX) - 1), 0, -1):
        if _SYNC_PREFIX.startswith(rest[-k:]):
            out.append(rest[:-k])
            return b"".join(out), seqs, rest[-k:]
    out.append(rest)
    return b"".join(out), seqs, b""


class _Capture:
    """A process-wide sink for output: a locked list of text chunks plus the file-descriptor pipe reader."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._lock = threading.Lock()
        self._total = 0
        self._fd_thread: threading.Thread | None = None
        self._orig_fds: dict[int, int] = {}
        self._sync_fd: int | None = None  # our own end of the pipe, for end-of-cell markers
        self._sync_cond = threading.Condition()
        self._sync_sent = 0
        self._sync_seen = 0

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
        self._sync_fd = write_fd
        orig_out = self._orig_fds.get(1)

        def pump() -> None:
            decoder = codecs.getincrementaldecoder("utf-8")("replace")  # characters cut by a read stay whole
            held = b""
            with os.fdopen(read_fd, "rb", buffering=0) as pipe:
                while True:
                    data = pipe.read(65536)
                    if not data:
                        self.write(decoder.decode(held, final=True))
                        return
                    data, seqs, held = _split_sync(held + data)
                    if data:
                        self.write(decoder.decode(data))
                        if orig_out is not None:
                            try:
                                os.write(orig_out, data)
                            except OSError:
                                pass
                    if seqs:
                        with self._sync_cond:
                            self._sync_seen = max(self._sync_seen, *seqs)
                            self._sync_cond.notify_all()

        self._fd_thread = threading.Thread(target=pump, name="gpu_notebook-fd-capture", daemon=True)
        self._fd_thread.start()

    def sync(self, timeout: float = 2.0) -> bool:
        """Wait until the pipe reader has read everything written to file descriptors 1 and 2 so far.

        A marker goes through the pipe behind what is already in it; returns False if it was not read in time.
        """
        if self._sync_fd is None or self._fd_thread is None or not self._fd_thread.is_alive():
            return False
        with self._sync_cond:
            self._sync_sent += 1
            seq = self._sync_sent
        try:
            os.write(self._sync_fd, _SYNC_PREFIX + str(seq).encode() + _SYNC_END)
        except OSError:
            return False
        deadline = time.monotonic() + timeout
        with self._sync_cond:
            while self._sync_seen < seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._sync_cond.wait(left)
        return True


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


class TooLarge:
    """Stands in for a value too large to send back with a cell: says what it was and how to fetch it."""

    def __init__(
        self,
        type_name: str,
        nbytes: int,
        limit: int,
        length: int | None = None,
        rank: int | None = None,
        measured: str = "pickled",
    ) -> None:
        self.type_name, self.nbytes, self.limit, self.length = type_name, nbytes, limit, length
        self.rank, self.measured = rank, measured

    def __repr__(self) -> str:
        what = self.type_name if self.length is None else f"{self.type_name} of {self.length} entries"
        rank = "R" if self.rank is None else str(self.rank)
        return (
            f"<{what} not sent: {_fmt_bytes(self.nbytes)} {self.measured}, over the "
            f"{_fmt_bytes(self.limit)} limit for values sent back. Assign it to a variable and fetch one "
            f"copy with `%gpu_pull NAME --rank {rank}`, or save it from the workers; raise the limit with "
            f"`%%distributed --max-result 1G` (or max_result_bytes=)>"
        )


def _fmt_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:g} bytes"
    units = ("KiB", "MiB", "GiB", "TiB")
    i = 0
    n /= 1024
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.1f} {units[i]}"


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
        self._exec_tid: int | None = None  # the thread running a cell or call: what interrupt() interrupts
        self._exec_lock = threading.Lock()  # guards _exec_tid between interrupt() and the end of a cell
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
            "cuda_available": _cuda_available() if gpu_ids else False,
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
        """Raise KeyboardInterrupt in the thread running the current cell (returns False if none runs).

        Under the same lock as the end of a cell, so it never lands in a cell that has already ended.
        """
        with self._exec_lock:
            tid = self._exec_tid
            if tid is None:
                return False
            n = ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(tid), ctypes.py_object(KeyboardInterrupt)
            )
        return n == 1

    def _guarded(
        self, work: Callable[[], Any], cell_file: str | None, max_bytes: int | None
    ) -> dict[str, Any]:
        """Run ``work`` (the user's code) as the interruptible cell and report its value or error.

        Only the user's code runs while the cell can be interrupted. An interrupt sent just as it ends can
        still fire in the few lines of this method before :meth:`_end_exec`: it is caught there, and
        ``_end_exec`` marks the cell ended and cancels any interrupt still pending for this thread, under the
        lock that :meth:`interrupt` takes. Formatting, pickling and the output flush come after.
        """
        tid = threading.get_ident()
        box: list[tuple[bool, Any]] = []
        try:
            try:
                try:
                    with self._exec_lock:  # inside the try: an interrupt can fire as soon as this is set
                        self._exec_tid = tid
                    box.append((True, work()))
                except BaseException as exc:  # noqa: BLE001 - report everything, KeyboardInterrupt included
                    box.append((False, exc))
            finally:
                self._end_exec(tid)
        except KeyboardInterrupt as exc:  # fired in our code, before the cell was marked ended
            box.append((False, exc))
            self._end_exec(tid)
        # from here on no interrupt can arrive
        ok, payload = box[0] if box else (False, KeyboardInterrupt())
        if ok:
            try:
                result = {"ok": True, "value": _sendable(payload, max_bytes, self.rank)}
            except BaseException as exc:  # noqa: BLE001
                result = _format_exception(exc, cell_file)
        else:
            result = _format_exception(payload, cell_file)
        result["seq"] = _collective_seq()
        _flush_std()
        self._capture.sync()  # everything written to fds 1 and 2 goes with this cell, not the next one
        return result

    def _end_exec(self, tid: int) -> None:
        """Mark the cell ended and cancel any interrupt still pending for its thread."""
        for _ in range(5):
            try:
                with self._exec_lock:
                    self._exec_tid = None
                    self._cell_started = None
                    # one sent after the cell's code ended must not fire later (in Ray's code, the next cell)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)
                return
            except KeyboardInterrupt:  # the pending one fired before it was cancelled: once more
                continue

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

    def run_cell(
        self,
        code: str,
        label: str,
        header: str | None = None,
        max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
    ) -> dict[str, Any]:
        """Run a cell in the persistent namespace; returns the last expression's value (like a REPL).

        ``header`` is the cell's first line in the notebook (the ``%%distributed`` line): line numbers in
        tracebacks then match the notebook cell's. The value is sent as :func:`_sendable` makes it, with
        ``max_result_bytes`` as its size limit (None: no limit).
        """
        filename = f"<{label}>"
        if header is not None:
            code = "\n" + code
        lines = code.splitlines(True)
        if header is not None:
            lines[0] = header.rstrip("\n") + "\n"
        linecache.cache[filename] = (len(code), None, lines, filename)

        def work() -> Any:
            self._cell_started = time.time()
            tree = ast.parse(code, filename, "exec")
            last = None
            tail = tree.body[-1] if tree.body else None
            if isinstance(tail, ast.Expr):
                tree.body.pop()
                last = ast.Expression(tail.value)
            exec(compile(tree, filename, "exec"), self.ns)
            return eval(compile(last, filename, "eval"), self.ns) if last is not None else None

        return self._guarded(work, filename, max_result_bytes)

    def call(
        self, fn: Any, args: tuple, kwargs: dict, max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES
    ) -> dict[str, Any]:
        """Run a Python function in this rank's process (the group is initialised); its value as a cell's."""
        return self._guarded(lambda: fn(*args, **kwargs), None, max_result_bytes)

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


_LIBC: Any = None


def _collective_seq() -> int | None:
    """The default process group's sequence number: how many collectives this rank has issued on it.

    Ranks in step have equal numbers after a cell. With NCCL only collectives count (point-to-point operations
    have their own counter); with gloo ``send``/``recv`` count too.
    """
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        group: Any = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - an older torch, a destroyed group: no check
        return None


def _flush_std() -> None:
    """Flush Python's own streams and every C stdio stream (``printf`` output sits in libc's buffer)."""
    global _LIBC
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None)
        _LIBC.fflush(None)
    except Exception:  # noqa: BLE001 - no libc (not Linux/macOS): nothing buffered there to lose
        pass


def _cuda_available() -> bool:
    """Whether CUDA works in this process, without initialising it.

    CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it is initialised, and the group may still change it
    (``gpu_visibility="node"``), so this asks NVML, as ``torch.cuda.is_available()`` does with
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1``. A CPU-only PyTorch build answers False.
    """
    try:
        import torch
    except Exception:  # noqa: BLE001
        return False
    try:
        if not torch.backends.cuda.is_built():
            return False
        count = torch.cuda._device_count_nvml()
        if count >= 0:
            return bool(count > 0)
    except Exception:  # noqa: BLE001
        pass
    return True  # NVML cannot tell: a CUDA build with GPUs from Ray; set_device reports it if CUDA fails


_MAX_DEPTH = 8  # how deep _sendable looks into lists, tuples and dicts for tensors
_MAX_ITEMS = 100_000  # ... and in how long ones (a long list of numbers holds no tensors worth the walk)


def _walkable(value: Any, depth: int) -> bool:
    return depth < _MAX_DEPTH and isinstance(value, (list, tuple, dict)) and len(value) <= _MAX_ITEMS


def _tensors(value: Any, torch: Any, depth: int = 0) -> Any:
    """Every torch tensor in ``value`` and in the lists, tuples and dicts it holds."""
    if isinstance(value, torch.Tensor):
        yield value
    elif _walkable(value, depth):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _tensors(v, torch, depth + 1)


def _tensor_bytes(t: Any) -> int:
    try:  # pickling a tensor writes its whole storage (a view of a large tensor too)
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001
        return int(t.nelement() * t.element_size())


def _to_cpu(value: Any, torch: Any, depth: int = 0) -> Any:
    """``value`` with every tensor not on the CPU replaced by a CPU copy; containers copied only if needed.

    Keeps container types (an OrderedDict state_dict keeps its ``_metadata``, a namedtuple stays one).
    """
    if isinstance(value, torch.Tensor):
        if value.device.type in ("cpu", "meta"):
            return value
        out = value.detach().cpu()
        if isinstance(value, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=value.requires_grad)
        return out.requires_grad_(True) if value.requires_grad else out
    if not _walkable(value, depth):
        return value
    if isinstance(value, (list, tuple)):
        items = [_to_cpu(v, torch, depth + 1) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        if type(value) is list:
            return items
        if type(value) is tuple:
            return tuple(items)
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        if isinstance(value, list):
            new_list = copy.copy(value)
            new_list[:] = items
            return new_list
        return value
    if isinstance(value, dict):
        changed = {k: c for k, v in value.items() if (c := _to_cpu(v, torch, depth + 1)) is not v}
        if not changed:
            return value
        new = copy.copy(value)  # the same type, attributes (state_dict's _metadata) and default_factory
        new.update(changed)
        return new
    return value


def _sendable(value: Any, max_bytes: int | None = DEFAULT_MAX_RESULT_BYTES, rank: int | None = None) -> Any:
    """What to send back for a cell's value.

    Tensors move to the CPU (in lists, tuples and dicts too, e.g. a state_dict); a value that cannot be
    pickled becomes an :class:`Unpicklable` with its repr, one whose pickle is over ``max_bytes`` a
    :class:`TooLarge` (tensors over the limit are not even copied to the CPU).
    """
    if value is None:
        return None
    torch = sys.modules.get("torch")  # without torch imported there are no tensors to look for
    if torch is not None and isinstance(getattr(torch, "Tensor", None), type):
        if max_bytes is not None:
            total = sum(_tensor_bytes(t) for t in _tensors(value, torch))
            if total > max_bytes:
                return TooLarge(type(value).__name__, total, max_bytes, _length(value), rank, "of tensors")
        try:
            value = _to_cpu(value, torch)
        except Exception:  # noqa: BLE001 - pickling below decides
            pass
    try:
        import ray.cloudpickle as cp

        size = len(cp.dumps(value))
    except Exception as exc:  # noqa: BLE001
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001
            text = f"<{type(value).__name__} object>"
        return Unpicklable(type(value).__name__, text, str(exc))
    if max_bytes is not None and size > max_bytes:
        return TooLarge(type(value).__name__, size, max_bytes, _length(value), rank)
    return value


def _length(value: Any) -> int | None:
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return len(value)
    return None


_REMOTE_CLASS: Any = None


def remote_worker_class() -> Any:
    """The Ray actor class for :class:`RankWorker` (created once, on first use)."""
    global _REMOTE_CLASS
    if _REMOTE_CLASS is None:
        import ray

        _REMOTE_CLASS = ray.remote(concurrency_groups={"exec": 1, "ctl": 4}, max_restarts=0)(RankWorker)  # type: ignore[call-overload]
    return _REMOTE_CLASS
