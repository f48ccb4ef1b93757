"""``%gpu_checkpoint``: list, inspect, restore, compare and clean up checkpoints (thin over
:class:`gpu_notebook.checkpoint.Checkpointer`)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from gpu_notebook import _registry, checkpoint
from gpu_notebook.errors import GpuNotebookError
from gpu_notebook.magics._common import MagicError, parse, reported, usage_error

COMMANDS = ["list", "show", "restore", "diff", "gc", "use"]
#: how many positional ids each command takes (min, max)
_IDS = {"list": (0, 0), "show": (0, 1), "restore": (0, 1), "diff": (2, 2), "gc": (0, 0), "use": (1, 1)}
_IDS_HINT = {
    "list": "list takes no checkpoint id",
    "show": "show takes at most one checkpoint id (default: the latest)",
    "restore": "restore takes at most one checkpoint id (default: the latest)",
    "diff": "diff takes two checkpoint ids: %gpu_checkpoint diff A B",
    "gc": "gc takes no checkpoint id (how many to keep: --keep N)",
    "use": "use takes one store: %gpu_checkpoint use /path/or/s3://bucket/prefix",
}


def _refused_value(args: Any) -> str | None:
    """What is wrong with a value given (the Checkpointer's own checks, made before a store is opened)."""
    if args.command == "restore" and args.ids and args.ids[0] != "latest" and args.step is not None:
        return f"give a checkpoint id or a step, not both (id {args.ids[0]!r}, step {args.step})"
    if args.command == "gc" and args.keep < 1:
        return "keep must be >= 1"
    return None


@contextlib.contextmanager
def _keeping_current() -> Iterator[None]:
    """The current Checkpointer stays the current one (a library restore makes its Checkpointer current; the
    magics' own must never become it: a budget stop saves with the current one, training code may look it up)."""
    before = _registry.active_checkpointer()
    try:
        yield
    finally:
        _registry.set_active_checkpointer(before)


def _checkpointer(checkpoint: Any, store: Any, **options: Any) -> Any:
    """``Checkpointer(store, ...)``; a store URL it cannot parse (``s3://``) is an error of the magic's."""
    try:
        return checkpoint.Checkpointer(store, **options)
    except GpuNotebookError:
        raise
    except ValueError as exc:  # the store's URL: "bad S3 URL 's3://': expected s3://bucket/prefix"
        raise MagicError(str(exc)) from None


@magics_class
class CheckpointMagics(Magics):
    """The ``%gpu_checkpoint`` magic."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self._used: Any = None  # the Checkpointer opened by ``use`` (the library only keeps a weak reference)
        # the current Checkpointer when ``use`` was typed: a Checkpointer made current after it takes over again
        self._used_over: weakref.ref[Any] | None = None
        self._opened: dict[tuple[str, str | None, bool], Any] = {}  # --store checkpointers, kept for reuse

    @magic_arguments()
    @argument("command", nargs="?", default="list", choices=COMMANDS, help="what to do (default: list)")
    @argument("ids", nargs="*", help="show/restore: ID (default latest); diff: A B; use: STORE")
    @argument("--store", help="the store (folder or s3://bucket/prefix); default: the current checkpointer's")
    @argument("--endpoint-url", help="S3-compatible endpoint (MinIO, ...)")
    @argument("--step", type=int, help="restore/show: the newest checkpoint at this step")
    @argument(
        "--into",
        help="restore: load in place into notebook variables, KEY=VAR[,KEY=VAR] (KEY alone: VAR=KEY)",
    )
    @argument(
        "-o",
        "--out",
        default="ckpt_state",
        help="restore: variable that receives the state (default ckpt_state)",
    )
    @argument("--keep", type=int, default=3, help="gc: commits of the live branch to keep (default 3)")
    @argument("--keep-abandoned", action="store_true", help="gc: keep the abandoned branches too")
    @argument(
        "--grace",
        type=float,
        default=3600.0,
        help="gc: keep unreferenced objects younger than this, s (3600)",
    )
    @argument("--dry-run", action="store_true", help="gc: only report what would be deleted")
    @argument(
        "--allow-pickle", action="store_true", help="restore: allow pickled values (trusted stores only)"
    )
    @argument(
        "--fallback",
        action="store_true",
        help="restore (latest): if its data is missing or corrupted, the newest intact older checkpoint",
    )
    @line_magic
    def gpu_checkpoint(self, line: str) -> Any:
        """List, inspect, restore, compare and garbage-collect delta checkpoints.

        The store is ``--store``'s; else the one of the last ``use STORE``, unless a ``Checkpointer`` was made
        current after it; else the current ``Checkpointer``'s (the last one created in this kernel). ``use`` and
        ``--store`` never change which ``Checkpointer`` is current.

        Examples
        --------
        In [1]: %gpu_checkpoint use /tmp/runs/exp1
        In [2]: %gpu_checkpoint list
        In [3]: %gpu_checkpoint show c0000000007
        In [4]: %gpu_checkpoint restore latest --into model,optim=optimizer
        In [5]: %gpu_checkpoint diff c0000000003 c0000000007
        In [6]: %gpu_checkpoint gc --keep 3
        """
        args = parse(self.gpu_checkpoint, line)
        lo, hi = _IDS[args.command]
        if not lo <= len(args.ids) <= hi:
            raise usage_error(
                self.gpu_checkpoint, f"{_IDS_HINT[args.command]}, got {' '.join(args.ids) or 'none'}"
            )
        refused = _refused_value(args)
        if refused:
            raise usage_error(self.gpu_checkpoint, refused)
        with reported(self.gpu_checkpoint):
            try:
                return getattr(self, f"_cmd_{args.command}")(args, checkpoint)
            except OSError as exc:  # the store's own files, disk or network (permissions, a full disk)
                raise MagicError(str(exc)) from None
        return None

    # ------------------------------------------------------------------ helpers
    def _open(self, checkpoint: Any, store: Any, endpoint_url: str | None, write: bool) -> Any:
        """A Checkpointer of ``store`` for the magic's own use: read-only unless ``write`` (gc), never the
        current one, no preemption watcher; one per store, reused (their threads are not left behind)."""
        key = (str(getattr(store, "url", store)), endpoint_url, write)
        ck = self._opened.get(key)
        if ck is None:
            opts = {"endpoint_url": endpoint_url} if endpoint_url and isinstance(store, str) else {}
            ck = _checkpointer(checkpoint, store, read_only=not write, current=False, preemption=None, **opts)
            self._opened[key] = ck
        return ck

    def _ckpt(self, args: Any, checkpoint: Any, write: bool = False) -> Any:
        if args.store:
            return self._open(checkpoint, args.store, args.endpoint_url, write)
        cur = checkpoint.current()
        over = self._used_over() if self._used_over is not None else None
        if self._used is not None and (cur is None or cur is over):
            cur = self._used  # ``use`` picked it, and no other Checkpointer was made current since
        if cur is None:
            raise MagicError("no current checkpoint store: use %gpu_checkpoint use STORE, or --store STORE")
        if write and cur.read_only:  # the store set by ``use`` is opened read-only: gc needs one that writes
            return self._open(checkpoint, cur.store, getattr(cur.store, "endpoint_url", None), True)
        return cur

    @staticmethod
    def _one_id(args: Any) -> str | None:
        return args.ids[0] if args.ids else None

    # ------------------------------------------------------------------ commands
    def _cmd_use(self, args: Any, checkpoint: Any) -> None:
        opts = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
        # read-only: a mistyped path is an error (not a new, empty store) and nothing is written
        # current=False: the training loop's Checkpointer stays the current one (a budget stop saves with it)
        ck = _checkpointer(checkpoint, args.ids[0], read_only=True, preemption=None, current=False, **opts)
        if self._used is not None and self._used is not ck:
            self._used.close(wait=False)
        self._used = ck
        cur = checkpoint.current()
        self._used_over = weakref.ref(cur) if cur is not None else None
        kept = f"; {cur.store.url} stays the current Checkpointer" if cur is not None else ""
        print(f"%gpu_checkpoint reads {ck.store.url} ({len(ck.list())} checkpoints){kept}")

    def _cmd_list(self, args: Any, checkpoint: Any) -> Any:
        lst = self._ckpt(args, checkpoint).list()
        display(lst)
        return None

    def _cmd_show(self, args: Any, checkpoint: Any) -> None:
        ck = self._ckpt(args, checkpoint)
        cid = self._one_id(args)
        if args.step is not None and cid is None:
            # the newest commit at that step, one on the live branch if there is one (as restore --step picks)
            found = [c.id for c in sorted(ck.list(), key=lambda c: c.branch == "live") if c.step == args.step]
            if not found:
                raise MagicError(f"no checkpoint at step {args.step}")
            cid = found[-1]
        print(repr(ck.show(cid)))

    def _cmd_restore(self, args: Any, checkpoint: Any) -> None:
        ck = self._ckpt(args, checkpoint)
        ns = self.shell.user_ns if self.shell is not None else {}
        into = None
        if args.into:
            into = {}
            for part in args.into.split(","):
                key, _, var = part.strip().partition("=")
                var = var or key
                if var not in ns:
                    raise MagicError(f"--into: no variable {var!r} in the notebook")
                into[key] = ns[var]
        with _keeping_current():
            state = ck.restore(
                self._one_id(args),
                step=args.step,
                into=into,
                allow_pickle=args.allow_pickle or None,
                fallback=args.fallback,
            )
        ns[args.out] = state
        info = ck.last_info
        print(
            f"restored {info.id} (step {info.step}) into {args.out}"
            + (f" and {args.into}" if args.into else "")
        )

    def _cmd_diff(self, args: Any, checkpoint: Any) -> None:
        print(repr(self._ckpt(args, checkpoint).diff(*args.ids)))

    def _cmd_gc(self, args: Any, checkpoint: Any) -> None:
        res = self._ckpt(args, checkpoint, write=not args.dry_run).gc(
            keep=args.keep, grace_s=args.grace, dry_run=args.dry_run, keep_abandoned=args.keep_abandoned
        )
        print(("(dry run) " if args.dry_run else "") + repr(res))


__all__ = ["CheckpointMagics"]
