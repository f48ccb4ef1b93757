"""``%gpu_checkpoint``: list, inspect, restore, compare and clean up checkpoints (thin over
:class:`gpu_notebook.checkpoint.Checkpointer`)."""

from __future__ import annotations

import argparse
import keyword
import weakref
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from gpu_notebook import checkpoint
from gpu_notebook.errors import GpuNotebookError
from gpu_notebook.magics._args import convert, count, identifier, number, path, text
from gpu_notebook.magics._common import (
    MagicError,
    Option,
    option,
    options,
    parse,
    refuse_others,
    reported,
    subcommands,
)

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
_CHECKPOINT_ID = text("a checkpoint id such as c0000000007 (or a unique prefix of one), or latest")
_STORE = path("store (a folder or s3://bucket/prefix)")


def _into_pairs(value: str) -> list[tuple[str, str]]:
    """``KEY=VAR[,KEY=VAR]`` (``KEY`` alone: ``VAR`` is ``KEY``) as (key, variable) pairs."""
    pairs = []
    for part in value.split(","):
        key, _, var = part.strip().partition("=")
        key, var = key.strip(), (var or key).strip()
        if not key or not var.isidentifier() or keyword.iskeyword(var):
            raise argparse.ArgumentTypeError(
                f"expected KEY=VARIABLE[,KEY=VARIABLE] such as model=net,optim (a Python variable each), "
                f"not {value!r}"
            )
        pairs.append((key, var))
    return pairs


def _into(value: str) -> str:
    _into_pairs(value)
    return value.strip()


_into.__name__ = "KEY=VARIABLE list"

STORE = option(
    "--store",
    type=_STORE,
    help="the store (folder or s3://bucket/prefix); default: the current checkpointer's",
)
ENDPOINT = option(
    "--endpoint-url",
    type=text("an S3 endpoint URL such as http://localhost:9000"),
    help="S3-compatible endpoint (MinIO, ...); s3:// stores only",
)
STEP = option(
    "--step",
    type=count("steps", minimum=0, maximum=10**15),
    metavar="N",
    help="restore/show: the newest checkpoint at this step",
)
INTO = option(
    "--into",
    type=_into,
    metavar="KEY=VAR[,KEY=VAR]",
    help="restore: load in place into notebook variables, KEY=VAR[,KEY=VAR] (KEY alone: VAR=KEY)",
)
OUT = option(
    "-o",
    "--out",
    type=identifier(),
    default="ckpt_state",
    metavar="NAME",
    help="restore: variable that receives the state (default ckpt_state)",
)
KEEP = option(
    "--keep",
    type=count("checkpoints"),
    default=3,
    metavar="N",
    help="gc: commits of the live branch to keep (default 3)",
)
KEEP_ABANDONED = option("--keep-abandoned", action="store_true", help="gc: keep the abandoned branches too")
GRACE = option(
    "--grace",
    type=number("seconds", maximum=365 * 24 * 3600.0, allow_minimum=True),
    default=3600.0,
    metavar="SECONDS",
    help="gc: keep unreferenced objects younger than this, s (3600)",
)
DRY_RUN = option("--dry-run", action="store_true", help="gc: only report what would be deleted")
ALLOW_PICKLE = option(
    "--allow-pickle", action="store_true", help="restore: allow pickled values (trusted stores only)"
)
FALLBACK = option(
    "--fallback",
    action="store_true",
    help="restore (latest): if its data is missing or corrupted, the newest intact older checkpoint",
)
EVERY_OPTION = (
    STORE,
    ENDPOINT,
    STEP,
    INTO,
    OUT,
    KEEP,
    KEEP_ABANDONED,
    GRACE,
    DRY_RUN,
    ALLOW_PICKLE,
    FALLBACK,
)
#: the options each subcommand takes; any other option given is a usage error, never ignored
OPTIONS: dict[str, tuple[Option, ...]] = {
    "list": (STORE, ENDPOINT),
    "show": (STORE, ENDPOINT, STEP),
    "restore": (STORE, ENDPOINT, STEP, INTO, OUT, ALLOW_PICKLE, FALLBACK),
    "diff": (STORE, ENDPOINT),
    "gc": (STORE, ENDPOINT, KEEP, KEEP_ABANDONED, GRACE, DRY_RUN),
    "use": (ENDPOINT,),
}
_POSITIONALS = {"show": "[ID]", "restore": "[ID]", "diff": "A B", "use": "STORE"}


def _refused_value(args: argparse.Namespace) -> str | None:
    """What is wrong with a value given (the Checkpointer's own checks, made before a store is opened)."""
    if args.command == "restore" and args.ids and args.ids[0] != "latest" and args.step is not None:
        return f"give a checkpoint id or a step, not both (id {args.ids[0]!r}, step {args.step})"
    store = args.ids[0] if args.command == "use" else args.store
    if args.endpoint_url and not (store or "").startswith("s3://"):
        where = "use STORE" if args.command == "use" else "--store"
        return f"--endpoint-url only applies to an s3:// store ({where} s3://bucket/prefix)"
    return None


def _checkpointer(checkpoint: Any, store: Any, read_only: bool, endpoint_url: str | None) -> Any:
    """A Checkpointer of ``store`` for the magic's own use: never the current one (the training loop's stays
    current: a budget stop saves with it), no preemption watcher. A store URL it cannot parse (``s3://``) is an
    error of the magic's."""
    try:
        return checkpoint.Checkpointer(
            store,
            storage=checkpoint.StorageOptions(read_only=read_only, endpoint_url=endpoint_url),
            policy=checkpoint.PolicyOptions(preemption=None),
            runtime=checkpoint.RuntimeOptions(current=False),
        )
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
    @options(*EVERY_OPTION)
    @subcommands(OPTIONS, _POSITIONALS)
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
        with reported(self.gpu_checkpoint, command=args.command):
            refuse_others(args, OPTIONS, args.command)
            lo, hi = _IDS[args.command]
            if not lo <= len(args.ids) <= hi:
                raise UsageError(f"{_IDS_HINT[args.command]}, got {' '.join(args.ids) or 'none'}")
            parser = _STORE if args.command == "use" else _CHECKPOINT_ID
            args.ids = [convert(parser, i, args.command) for i in args.ids]
            refused = _refused_value(args)
            if refused:
                raise UsageError(refused)
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
            endpoint = endpoint_url if endpoint_url and isinstance(store, str) else None
            ck = _checkpointer(checkpoint, store, read_only=not write, endpoint_url=endpoint)
            self._opened[key] = ck
        return ck

    def _ckpt(self, args: argparse.Namespace, checkpoint: Any, write: bool = False) -> Any:
        if args.store:
            if write:  # read-only first: a mistyped store is an error, not a new empty store made to gc it
                self._open(checkpoint, args.store, args.endpoint_url, False)
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
    def _one_id(args: argparse.Namespace) -> str | None:
        return args.ids[0] if args.ids else None

    # ------------------------------------------------------------------ commands
    def _cmd_use(self, args: argparse.Namespace, checkpoint: Any) -> None:
        # read-only: a mistyped path is an error (not a new, empty store) and nothing is written
        ck = _checkpointer(checkpoint, args.ids[0], read_only=True, endpoint_url=args.endpoint_url or None)
        if self._used is not None and self._used is not ck:
            self._used.close(wait=False)
        self._used = ck
        cur = checkpoint.current()
        self._used_over = weakref.ref(cur) if cur is not None else None
        kept = f"; {cur.store.url} stays the current Checkpointer" if cur is not None else ""
        print(f"%gpu_checkpoint reads {ck.store.url} ({len(ck.list())} checkpoints){kept}")

    def _cmd_list(self, args: argparse.Namespace, checkpoint: Any) -> Any:
        lst = self._ckpt(args, checkpoint).list()
        display(lst)
        return None

    def _cmd_show(self, args: argparse.Namespace, checkpoint: Any) -> None:
        ck = self._ckpt(args, checkpoint)
        cid = self._one_id(args)
        if args.step is not None and cid is None:
            # the newest commit at that step, one on the live branch if there is one (as restore --step picks)
            found = [c.id for c in sorted(ck.list(), key=lambda c: c.branch == "live") if c.step == args.step]
            if not found:
                raise MagicError(f"no checkpoint at step {args.step}")
            cid = found[-1]
        print(repr(ck.show(cid)))

    def _cmd_restore(self, args: argparse.Namespace, checkpoint: Any) -> None:
        ck = self._ckpt(args, checkpoint)
        ns = self.shell.user_ns if self.shell is not None else {}
        into = None
        if args.into:
            into = {}
            for key, var in _into_pairs(args.into):
                if var not in ns:
                    raise MagicError(f"--into: no variable {var!r} in the notebook")
                into[key] = ns[var]
        state = (
            ck.restore(  # (a store's own Checkpointer is made with current=False: it never becomes current)
                self._one_id(args),
                step=args.step,
                into=into,
                allow_pickle=args.allow_pickle or None,
                fallback=args.fallback,
            )
        )
        ns[args.out] = state
        info = ck.last_info
        print(
            f"restored {info.id} (step {info.step}) into {args.out}"
            + (f" and {args.into}" if args.into else "")
        )

    def _cmd_diff(self, args: argparse.Namespace, checkpoint: Any) -> None:
        print(repr(self._ckpt(args, checkpoint).diff(*args.ids)))

    def _cmd_gc(self, args: argparse.Namespace, checkpoint: Any) -> None:
        res = self._ckpt(args, checkpoint, write=not args.dry_run).gc(
            keep=args.keep, grace_s=args.grace, dry_run=args.dry_run, keep_abandoned=args.keep_abandoned
        )
        if not args.dry_run:
            print(repr(res))
            return
        print(res.dry_run_text())


__all__ = ["CheckpointMagics"]
