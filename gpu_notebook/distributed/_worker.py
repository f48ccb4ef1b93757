"""The rank worker: one persistent process per rank that runs notebook cells.

A :class:`RankWorker` is wrapped into a Ray actor by :func:`remote_worker_class`. It keeps the user's namespace
across cells (like an ipyparallel engine) in a real ``__main__`` module (see :mod:`._main`), captures everything the process writes (Python threads, C code and
subprocesses; see :mod:`._capture`) into a buffer the driver drains while a cell runs, and joins the
``torch.distributed`` process group once (see :mod:`._process_group`).

Two concurrency groups: ``exec`` (one thread) runs cells in order; ``ctl`` serves output draining, interrupts,
push, pull and status while a cell runs.

What a cell sends back is made safe for the notebook first (see :mod:`._sendable`). At the end of a cell, libc's
buffers are flushed and the pipe reader is waited for, so everything the cell wrote is delivered with the cell.
The cell is kept (:class:`KeptCell`) until the next one: a kernel that attaches to a detached cluster's workers
after the one that started it died reads its reply there (``await_cell``).

``sys.exit(0)`` (``exit()``, ``quit()``, ``SystemExit(None)``) ends a rank's cell as a success, with a one-line
note in its output, as at the end of a script; a non-zero code fails the cell with the code named.
"""

from __future__ import annotations

import ast
import ctypes
import linecache
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from gpu_notebook import _registry
from gpu_notebook.distributed import (
    _interruptible,
    _main,
    _process_group,
    _remains,
    _rich,
    _script,
    _shell,
    _stacks,
)
from gpu_notebook.distributed._capture import Capture, StreamProxy, flush_std
from gpu_notebook.distributed._debugger import DebugAnswer, DebugState, RankDebugger
from gpu_notebook.distributed._logfile import RankLogFile, default_log_dir, read_tail
from gpu_notebook.distributed._logupload import LogUploader
from gpu_notebook.distributed._process_group import collective_seq, join, leave, torchrun_env
from gpu_notebook.distributed._ranks import RankPlan
from gpu_notebook.distributed._sendable import DEFAULT_MAX_RESULT_BYTES
from gpu_notebook.distributed._sendable import sendable as _sendable
from gpu_notebook.distributed._sendable import to_cpu as _to_cpu

# Frames of these files are left out of the tracebacks of user code (the torch.distributed wrappers that
# torchrun-style cells call are in _process_group).
_OUR_FILES = frozenset(
    os.path.abspath(f.rstrip("c"))
    for f in (__file__, _process_group.__file__, _main.__file__, _shell.__file__, _script.__file__)
)

# Ray reads this attribute (what ``@ray.method(concurrency_group=...)`` sets) when the class becomes an actor;
# setting it directly keeps ray out of this module's imports. push and pull are control calls: they work while a
# cell runs (a background cell).
_CTL: tuple[str, ...] = ("meta", "free_port", "ping", "drain_output", "interrupt", "push", "pull", "stacks")
_CTL += ("debug_state", "debug_command", "debug_post_mortem")  # the debugger (see _debugger)
_CTL += ("cell_state", "await_cell", "guard_notice")  # a kernel attaching to a detached cluster's workers
_CTL += ("open_log", "log_tail")  # the rank's log files (see _logfile)
_EXEC = ("init_process_group", "run_cell", "call", "shutdown")


class WorkerMeta(TypedDict):
    """Where a worker runs, as it reports it before it has a rank (:meth:`RankWorker.meta`)."""

    node_id: str  # Ray's node id
    ip: str
    pid: int  # the worker process, named when it dies
    hostname: str
    gpu_ids: list[str]  # the GPUs Ray gave it
    cuda_visible_devices: str | None  # as Ray set it, before the group sets its own
    cuda_available: bool  # whether CUDA works in the process (NVML's answer; False without GPUs)


class CellReply(TypedDict, total=False):
    """What a rank sends back for a cell or a call (:meth:`RankWorker.run_cell`, :meth:`RankWorker.call`)."""

    ok: bool  # the code ran to the end
    value: Any  # its value, made sendable (ok only)
    etype: str  # the exception's type name, message, traceback without our frames (not ok only)
    evalue: str
    traceback: str
    cell_lines: list[int]  # the cell's line numbers in the traceback, innermost last
    seq: int | None  # collectives this rank has issued on the default group (None: no group)
    output: str  # what the rank printed since the last drain: the driver needs no drain call after a reply


@dataclass(frozen=True)
class Worker:
    """The driver's record of one rank: its actor, where it runs, and what its process reported.

    Fixed for the life of the process; a rebuilt group has new records.
    """

    actor: Any  # the Ray actor handle of the RankWorker
    plan: RankPlan  # its rank, node, local rank and GPUs
    meta: WorkerMeta  # its process: pid, IP, the GPUs Ray gave it

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def pid(self) -> int:
        return self.meta["pid"]

    def where(self) -> str:
        """``"pid 1234 on 10.0.0.5"``: the process, for a report that it died."""
        return f"pid {self.meta.get('pid', '?')} on {self.meta.get('ip', '?')}"


def _format_exception(exc: BaseException, cell_file: str | None) -> CellReply:
    """Format an exception raised by user code, without our own frames."""
    te = traceback.TracebackException.from_exception(exc, capture_locals=False)
    stack = [f for f in te.stack if os.path.abspath(f.filename) not in _OUR_FILES]
    te.stack = traceback.StackSummary.from_list(stack)
    cell_lines = [f.lineno for f in stack if f.filename == cell_file and f.lineno is not None]
    return {
        "ok": False,
        "etype": type(exc).__name__,
        "evalue": str(exc),
        "traceback": "".join(te.format()),
        "cell_lines": cell_lines,
    }


def _exit_status(exc: SystemExit) -> int:
    """The exit status ``exc`` gives a Python process: None is 0, a number itself, anything else 1."""
    if exc.code is None:
        return 0
    return int(exc.code) if isinstance(exc.code, int) else 1


def _exit_text(exc: SystemExit) -> str:
    """``"exit code 3"``, or ``"bad input (exit code 1)"`` for ``sys.exit("bad input")``."""
    status = _exit_status(exc)
    return (
        f"exit code {status}"
        if exc.code is None or isinstance(exc.code, int)
        else f"{exc.code} (exit code 1)"
    )


class KeptCell:
    """The cell a rank runs now, or ran last, kept until the next one starts: what a kernel reads that attaches
    to a detached cluster after the kernel that started the cell is gone (its reply, with the output the rank
    wrote since the last drain)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.time()
        self.ended: float | None = None
        self.reply: CellReply | None = None
        self.done = threading.Event()

    def finish(self, reply: CellReply) -> CellReply:
        self.reply, self.ended = reply, time.time()
        self.done.set()
        return reply

    def state(self) -> dict[str, Any]:
        ok = None if self.reply is None else bool(self.reply.get("ok"))
        return {"label": self.label, "started": self.started, "ended": self.ended, "ok": ok}


class RankWorker:
    """One rank of a distributed worker group; its namespace persists across cells."""

    def __init__(self, group_id: str, env: dict[str, str] | None = None) -> None:
        self.group_id = group_id
        self.rank: int | None = None
        # the cells' module, sys.modules["__main__"], so pickle finds cell-defined classes (see _main)
        self.main = _main.new_main_module()
        self.ns: dict[str, Any] = self.main.__dict__
        self._ipython = _shell.RankShell(self.main)  # !cmd and %magic lines, through IPython (see _shell)
        self._exec_tid: int | None = None  # the thread running a cell or call: what interrupt() interrupts
        self._exec_native: int | None = None  # its native thread id (py-spy names threads by it)
        self._exec_lock = threading.Lock()  # guards _exec_tid between interrupt() and the end of a cell
        self._cell_started: float | None = None
        self._kept: KeptCell | None = None  # the cell running now or run last (see KeptCell)
        self._log: RankLogFile | None = None  # the rank's JSON-lines files on its node (open_log)
        self._upload: LogUploader | None = None
        self._capture = Capture()
        if env:
            os.environ.update(env)
        self._capture.capture_fds()
        # what the driver has not drained yet survives the process (read on its death, see _remains)
        self._spool = _remains.spool_paths(group_id, os.getpid())
        try:
            self._capture.spool(*self._spool)
        except OSError:  # no writable temporary directory: the worker runs, its last words may be lost
            pass
        _main.install_by_value()
        _rich.install(self._capture.write)  # display() and matplotlib figures go to the cell (see _rich)
        _interruptible.install()  # a cell blocked in sleep() or a lock wait still sees the stop button
        self._debugger = RankDebugger(self._capture.write)  # breakpoint() and post-mortem (see _debugger)
        self._debugger.install(
            None if "PYTHONBREAKPOINT" in (env or {}) else os.environ.get("PYTHONBREAKPOINT")
        )
        sys.stdout = StreamProxy(self._capture, "<stdout>")  # type: ignore[assignment]
        sys.stderr = StreamProxy(self._capture, "<stderr>")  # type: ignore[assignment]
        _process_group.import_torch_soon()  # init_process_group needs it next; what it prints goes to the cell

    def __repr__(self) -> str:
        return f"RankWorker(rank={self.rank})"

    # ---- control group ---------------------------------------------------------------------------------
    def meta(self) -> WorkerMeta:
        """Where this worker runs: node, IP, pid and the GPUs Ray gave it."""
        import ray

        ctx = ray.get_runtime_context()
        try:
            gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        except Exception:  # noqa: BLE001 - a worker whose GPUs Ray cannot tell still serves as a CPU rank
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
        return {
            "pid": os.getpid(),
            "busy": self._exec_tid is not None,
            "rank": self.rank,
            "seq": collective_seq(),
            "debugger": self._debugger.is_paused(),
        }

    def drain_output(self) -> str:
        return self._capture.drain()

    def debug_state(self) -> DebugState:
        return self._debugger.state()

    def debug_command(self, line: str | None, settle: float | None = None) -> DebugAnswer:
        return self._debugger.command(line) if settle is None else self._debugger.command(line, settle)

    def debug_post_mortem(self) -> DebugAnswer:
        return self._debugger.post_mortem()

    def stacks(self, native: bool = False) -> dict[str, Any]:
        """Every thread's Python stack in this process, the cell's first (see :mod:`._stacks`)."""
        return _stacks.capture(self._exec_tid, rank=self.rank, native_tid=self._exec_native, native=native)

    def cell_state(self) -> dict[str, Any] | None:
        """The cell running now or run last (label, start, end, whether it succeeded); None before any."""
        return None if self._kept is None else self._kept.state()

    def await_cell(self, label: str | None = None, timeout: float = 7 * 86400.0) -> CellReply:
        """The reply of the cell ``label`` (None: the current or last one), once it ends: a kernel that attached
        after the kernel that started it was gone waits here, draining the output meanwhile as for any cell."""
        kept = self._kept
        if kept is None or label not in (None, kept.label):
            now = kept.label if kept is not None else "none"
            msg = f"rank {self.rank} has no cell {label!r} to attach to (its current or last cell: {now})"
            return {"ok": False, "etype": "LookupError", "evalue": msg, "traceback": f"LookupError: {msg}\n"}
        kept.done.wait(timeout)
        if kept.reply is None:
            return {"ok": False, "etype": "TimeoutError", "evalue": "the cell did not end", "traceback": ""}
        return {**kept.reply, "output": kept.reply.get("output", "") + self._capture.drain()}

    def guard_notice(self, why: str, seconds: float) -> None:
        """The cluster's guard stops it in ``seconds``: a Checkpointer in the running cell saves at its next
        ``maybe_save`` (as on a spot notice; see gpu_notebook.checkpoint.policy.guard_notice)."""
        _registry.stop_notice.set({"why": why, "deadline": time.time() + seconds})
        self._capture.write(f"gpu_notebook: {why}: the cluster stops in {seconds:.0f} s\n")

    def open_log(self, cluster: str, dest: str | None = None) -> str:
        """Also write this rank's output to size-capped, rotating JSON-lines files on its node (what collectors
        ship, and what ``%gpu_cluster logs`` reads after an attach); ``dest``: local rank 0 also uploads the node's
        files there in batches (a folder or ``s3://bucket/prefix``). Returns the folder."""
        directory = default_log_dir(cluster)
        if self._log is None:
            self._log = RankLogFile(directory, int(self.rank or 0), socket.gethostname(), cluster)
            log = self._log
            self._capture.tee = lambda text: log.write(_rich.plain(text))
        if dest and self._upload is None and self.ns.get("local_rank", 0) == 0:
            self._upload = LogUploader(directory, dest)
        return directory

    def log_tail(self, n: int | None = 50) -> list[str]:
        """This rank's last ``n`` lines from its log files (all of them with None)."""
        if self._log is not None:
            self._log.flush()
        found = read_tail(default_log_dir(self._log.cluster), int(self.rank or 0), n) if self._log else []
        return [str(r.get("line", "")) for r in found]

    def interrupt(self) -> bool:
        """Raise KeyboardInterrupt in the thread running the current cell (returns False if none runs).

        Under the same lock as the end of a cell, so it never lands in a cell that has already ended.
        """
        with self._exec_lock:
            tid = self._exec_tid
            if tid is None:
                return False
            self._debugger.interrupt()  # a cell paused in the debugger ends too
            n = ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(tid), ctypes.py_object(KeyboardInterrupt)
            )
        return n == 1

    def _guarded(
        self,
        work: Callable[[], Any],
        cell_file: str | None,
        max_bytes: int | None,
        ranks: list[int] | None = None,
    ) -> CellReply:
        """Run ``work`` (the user's code) as the interruptible cell and report its value or error.

        Only the user's code runs while the cell can be interrupted. An interrupt sent just as it ends can
        still fire in the few lines of this method before :meth:`_end_exec`: it is caught there, and
        ``_end_exec`` marks the cell ended and cancels any interrupt still pending for this thread, under the
        lock that :meth:`interrupt` takes. Formatting, pickling and the output flush come after. ``ranks``:
        the ranks running this cell when they are not all of them (a collective that needs the others fails
        at once, see :func:`._process_group.cell_ranks`).
        """
        tid = threading.get_ident()
        _rich.begin_cell()
        _interruptible.release_later(self._debugger.begin_cell(cell_file))  # the last failure's frames go
        box: list[tuple[bool, Any]] = []
        try:
            try:
                try:
                    with self._exec_lock:  # inside the try: an interrupt can fire as soon as this is set
                        self._exec_tid, self._exec_native = tid, threading.get_native_id()
                    with _process_group.cell_ranks(ranks), _interruptible.cell_thread():
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
        status = _exit_status(payload) if not ok and isinstance(payload, SystemExit) else None
        if status == 0:  # sys.exit(0) at the end of a script: the cell ends there, as a success
            ok, payload = True, None
        result: CellReply
        if ok:
            try:
                result = {"ok": True, "value": _sendable(payload, max_bytes, self.rank)}
            except BaseException as exc:  # noqa: BLE001 - a value's own code raised: the cell's error
                result = _format_exception(exc, cell_file)
        else:
            result = _format_exception(payload, cell_file)
            if isinstance(payload, SystemExit):  # name the code, as a shell would see it
                result["evalue"] = _exit_text(payload)
            # its traceback holds the cell's frames and what they hold (a DataLoader iterator, whose shutdown
            # waits 5 s for its workers): kept for post-mortem until the next cell, then dropped on another
            # thread, so no reply is held up (see _interruptible)
            self._debugger.keep(payload)
            _interruptible.release_later(payload, box)
            payload = None
            box = []
        result["seq"] = collective_seq()
        _rich.end_cell()  # figures left open are sent, as the inline backend does
        flush_std()
        self._capture.sync()  # everything written to fds 1 and 2 goes with this cell, not the next one
        if status == 0:
            self._capture.write("exited with code 0 (the cell ended there; the worker keeps its state)\n")
        result["output"] = self._capture.drain()
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
        plan: RankPlan,
        world_size: int,
        nodes: int,
        master_addr: str,
        master_port: int,
        backend: str,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Join the process group as ``plan.rank``, its GPUs and the torchrun environment set first.

        See :func:`._process_group.select_devices` and :func:`._process_group.join`. The namespace gets
        ``rank``, ``world_size``, ``local_rank``, ``device`` (the current device: the rank's first own GPU, or
        the CPU) and ``devices`` (all its own devices, as Ray Train's ``get_devices()``).
        """
        devs = _process_group.select_devices(backend, plan.cuda_visible_devices, plan.device_indices)
        env = torchrun_env(
            rank=plan.rank,
            world_size=world_size,
            local_rank=plan.local_rank,
            local_world_size=plan.local_world_size,
            node_rank=plan.node_rank,
            nodes=nodes,
            master_addr=master_addr,
            master_port=master_port,
            run_id=self.group_id,  # the same on every rank of the group, and across its rebuilds
            agent_store=True,  # rank 0's store listens on MASTER_PORT from join() on
            device=str(devs.device) if devs.device.type == "cuda" else None,  # see NOT_TORCHRUN
        )
        joined = join(env, backend, timeout_s)
        self.rank = plan.rank
        self.ns.update(
            rank=plan.rank,
            world_size=world_size,
            local_rank=plan.local_rank,
            device=devs.device,
            devices=list(devs.devices),
        )
        return {
            "rank": plan.rank,
            "backend": joined,
            "device": str(devs.device),
            "devices": [str(d) for d in devs.devices],
            "cuda_device": None if devs.cuda_index is None else f"cuda:{devs.cuda_index}",
        }

    def run_cell(
        self,
        code: str,
        label: str,
        header: str | None = None,
        max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
        ranks: list[int] | None = None,
    ) -> CellReply:
        """Run a cell in the persistent namespace; returns the last expression's value (like a REPL).

        ``header`` is the cell's first line in the notebook (the ``%%distributed`` line): line numbers in
        tracebacks then match the notebook cell's. The value is sent as :func:`_sendable` makes it, with
        ``max_result_bytes`` as its size limit (None: no limit). ``ranks``: the ranks running the cell, when
        they are not all (see :meth:`_guarded`).
        """
        filename = f"<{label}>"
        body = code
        if header is not None:
            code = "\n" + code
        lines = code.splitlines(True)
        if header is not None:
            lines[0] = header.rstrip("\n") + "\n"
        linecache.cache[filename] = (len(code), None, lines, filename)

        def work() -> Any:
            self._cell_started = time.time()
            source = self._ipython.transform(body)
            tree = ast.parse("\n" + source if header is not None else source, filename, "exec")
            last = None
            tail = tree.body[-1] if tree.body else None
            if isinstance(tail, ast.Expr):
                tree.body.pop()
                last = ast.Expression(tail.value)
            exec(compile(tree, filename, "exec"), self.ns)
            return eval(compile(last, filename, "eval"), self.ns) if last is not None else None

        self._kept = KeptCell(label)
        return self._kept.finish(self._guarded(work, filename, max_result_bytes, ranks))

    def call(
        self,
        fn: Any,
        args: tuple,
        kwargs: dict,
        max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
        ranks: list[int] | None = None,
    ) -> CellReply:
        """Run a Python function in this rank's process (the group is initialised); its value as a cell's."""
        self._kept = KeptCell(getattr(fn, "__name__", "call"))
        return self._kept.finish(self._guarded(lambda: fn(*args, **kwargs), None, max_result_bytes, ranks))

    def push(self, values: dict[str, Any]) -> list[str]:
        self.ns.update(values)
        return sorted(values)

    def pull(self, name: str, keep_device: bool = False) -> Any:
        """The variable's value; its tensors moved to the CPU as a cell's value's are, unless ``keep_device``."""
        if name not in self.ns:
            raise NameError(f"name {name!r} is not defined on rank {self.rank}")
        value = self.ns[name]
        torch = sys.modules.get("torch")  # without torch imported there are no tensors to move
        if not keep_device and torch is not None and isinstance(getattr(torch, "Tensor", None), type):
            value = _to_cpu(value, torch)
        try:
            import ray.cloudpickle as cp

            cp.dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling runs the value's own code: anything it raises
            raise TypeError(f"variable {name!r} on rank {self.rank} cannot be pickled: {exc}") from None
        return value

    def shutdown(self) -> None:
        """Leave the process group cleanly (best effort) and remove the output spool: nobody will read it."""
        leave()
        self._capture.close_spool()
        _remains.remove(self._spool)
        self._capture.tee = None
        if self._upload is not None:
            self._upload.close()  # a last pass: what the rank wrote last goes too
        if self._log is not None:
            self._log.close()


for _name in _CTL:
    getattr(RankWorker, _name).__ray_concurrency_group__ = "ctl"
for _name in _EXEC:
    getattr(RankWorker, _name).__ray_concurrency_group__ = "exec"


def _cuda_available() -> bool:
    """Whether CUDA works in this process, without initialising it.

    CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it is initialised, and the group may still change it
    (``gpu_visibility="node"``), so this asks NVML, as ``torch.cuda.is_available()`` does with
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1``. A CPU-only PyTorch build answers False.
    """
    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken torch install (not only ImportError): no CUDA either
        return False
    try:
        if not torch.backends.cuda.is_built():
            return False
        count = torch.cuda._device_count_nvml()
        if count >= 0:
            return bool(count > 0)
    except Exception:  # noqa: BLE001 - a private torch API (NVML missing, renamed): answered below
        pass
    return True  # NVML cannot tell: a CUDA build with GPUs from Ray; set_device reports it if CUDA fails


_REMOTE_CLASS: Any = None


def remote_worker_class() -> Any:
    """The Ray actor class for :class:`RankWorker` (created once, on first use)."""
    global _REMOTE_CLASS
    if _REMOTE_CLASS is None:
        import ray

        _REMOTE_CLASS = ray.remote(concurrency_groups={"exec": 1, "ctl": 4}, max_restarts=0)(RankWorker)  # type: ignore[call-overload]
    return _REMOTE_CLASS
