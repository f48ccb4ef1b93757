"""``%gpu_checkpoint``: list, inspect, restore, compare and clean up checkpoints (thin over
:class:`gpu_notebook.checkpoint.Checkpointer`)."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from gpu_notebook.magics._common import BadArguments, error, parse

COMMANDS = ["list", "show", "restore", "diff", "gc", "use"]


@magics_class
class CheckpointMagics(Magics):
    """The ``%gpu_checkpoint`` magic."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self._used: Any = None  # the Checkpointer opened by ``use`` (the library only keeps a weak reference)

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
    @argument("--keep", type=int, default=3, help="gc: checkpoints to keep (default 3)")
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

        The store is the one of the last ``Checkpointer`` created in this kernel, or the one set with
        ``%gpu_checkpoint use STORE``, or ``--store``.

        Examples
        --------
        In [1]: %gpu_checkpoint use /tmp/runs/exp1
        In [2]: %gpu_checkpoint list
        In [3]: %gpu_checkpoint show 000000000100-3fa9c2d10001
        In [4]: %gpu_checkpoint restore latest --into model,optim=optimizer
        In [5]: %gpu_checkpoint diff 000000000100 000000000200
        In [6]: %gpu_checkpoint gc --keep 3
        """
        try:
            args = parse(self.gpu_checkpoint, line)
        except BadArguments:
            return None
        from gpu_notebook import checkpoint

        try:
            return getattr(self, f"_cmd_{args.command}")(args, checkpoint)
        except (checkpoint.CheckpointError, LookupError, ValueError, OSError) as exc:
            error(str(exc))
            return None

    # ------------------------------------------------------------------ helpers
    def _ckpt(self, args: Any, checkpoint: Any) -> Any:
        opts = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
        if args.store:
            return checkpoint.Checkpointer(args.store, **opts)
        cur = checkpoint.current() or self._used
        if cur is None:
            raise LookupError("no current checkpoint store: use %gpu_checkpoint use STORE, or --store STORE")
        return cur

    @staticmethod
    def _one_id(args: Any, what: str) -> str | None:
        if len(args.ids) > 1:
            raise ValueError(f"{what} takes one checkpoint id")
        return args.ids[0] if args.ids else None

    # ------------------------------------------------------------------ commands
    def _cmd_use(self, args: Any, checkpoint: Any) -> None:
        if len(args.ids) != 1:
            raise ValueError("use takes one store: %gpu_checkpoint use /path/or/s3://bucket/prefix")
        opts = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
        ck = self._used = checkpoint.Checkpointer(args.ids[0], **opts)
        print(f"current checkpoint store: {ck.store.url}")

    def _cmd_list(self, args: Any, checkpoint: Any) -> Any:
        lst = self._ckpt(args, checkpoint).list()
        display(lst)
        return None

    def _cmd_show(self, args: Any, checkpoint: Any) -> None:
        ck = self._ckpt(args, checkpoint)
        cid = self._one_id(args, "show")
        if args.step is not None and cid is None:
            found = [c.id for c in ck.list() if c.step == args.step]
            if not found:
                raise LookupError(f"no checkpoint at step {args.step}")
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
                    raise LookupError(f"--into: no variable {var!r} in the notebook")
                into[key] = ns[var]
        state = ck.restore(
            self._one_id(args, "restore"),
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
        if len(args.ids) != 2:
            raise ValueError("diff takes two checkpoint ids: %gpu_checkpoint diff A B")
        print(repr(self._ckpt(args, checkpoint).diff(*args.ids)))

    def _cmd_gc(self, args: Any, checkpoint: Any) -> None:
        res = self._ckpt(args, checkpoint).gc(keep=args.keep, grace_s=args.grace, dry_run=args.dry_run)
        print(("(dry run) " if args.dry_run else "") + repr(res))


__all__ = ["CheckpointMagics"]
