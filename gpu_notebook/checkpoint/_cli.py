"""``python -m gpu_notebook.checkpoint``: list, show, compare (diff), verify, export and gc the checkpoints of a
folder or an ``s3://`` prefix from a terminal or CI, without a notebook.

Exit codes: 0 done (``verify``: every checkpoint checked is intact), 1 a checkpoint is damaged or an operation
failed (the store unreachable, an object missing), 2 a usage error (a bad argument, no such store, checkpoint
id or ``--select`` key). Results go to stdout, progress and errors to stderr; credentials never appear.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from ._errors import CheckpointError, IntegrityError, NoCheckpointError, ObjectMissingError, UnsafeValueError
from ._export import ExportError
from ._open import export, open_reader
from ._progress import describe
from .checkpointer import Checkpointer
from .options import DistributedOptions, PolicyOptions, RuntimeOptions, StorageOptions

__all__ = ["main"]

OK, FAILED, USAGE = 0, 1, 2

_SECRET = re.compile(r"(?i)(://)[^/@\s]+@|((?:access_key|secret|token|signature|credential)[\w-]*=)[^&\s]+")


def _clean(text: str) -> str:
    """``text`` without the user:password of a URL or the signature of a presigned one."""
    return _SECRET.sub(lambda m: f"{m.group(1)}***@" if m.group(1) else f"{m.group(2)}***", text)


def _out(text: str) -> None:
    print(_clean(text), flush=True)


def _err(text: str) -> None:
    print(_clean(text), file=sys.stderr, flush=True)


class _Progress:
    """A progress line on stderr for transfers that take more than a second (at most two updates a second)."""

    def __init__(self) -> None:
        self._last = 0.0
        self._shown = False

    def __call__(self, label: str, done: int, total: int, elapsed: float) -> None:
        now = time.monotonic()
        if elapsed < 1.0 or (now - self._last < 0.5 and done < total):
            return
        self._last, self._shown = now, True
        sys.stderr.write(f"\r{describe(label, done, total, elapsed)}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpu_notebook.checkpoint",
        description=(
            "List, show, compare, verify, export and garbage-collect the checkpoints of a store (a folder, "
            "file:// or s3:// URL)."
        ),
        epilog="exit codes: 0 ok, 1 damaged checkpoint or failed operation, 2 usage error",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{ls,show,diff,verify,gc,export}")

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help)
        c.add_argument("store", metavar="URL", help="a folder, file:///path or s3://bucket/prefix")
        c.add_argument("--endpoint-url", help="the endpoint of an S3-compatible store (MinIO, R2, ...)")
        return c

    ls = cmd("ls", "list the checkpoints: id, step, branch, time, kind, sizes")
    ls.add_argument("--json", action="store_true", help="one JSON object per checkpoint")
    show = cmd("show", "one checkpoint's tensors: dtype, shape, bytes, chunks")
    show.add_argument(
        "id", nargs="?", default="latest", help="checkpoint id or unique prefix (default: latest)"
    )
    diff = cmd("diff", "what changed between two checkpoints: tensors (chunks changed) and plain values")
    diff.add_argument("a", help="checkpoint id or unique prefix")
    diff.add_argument(
        "b", nargs="?", default="latest", help="checkpoint id or unique prefix (default: latest)"
    )
    gc = cmd(
        "gc", "delete all but the newest checkpoints of the live branch, and the objects no kept one needs"
    )
    gc.add_argument(
        "--keep", type=_positive_int, default=3, help="checkpoints of the live branch to keep (3)"
    )
    gc.add_argument(
        "--grace", type=_seconds, default=3600.0, help="keep unreferenced objects newer than this (s, 3600)"
    )
    gc.add_argument("--keep-abandoned", action="store_true", help="keep the checkpoints of other branches")
    gc.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    ver = cmd("verify", "restore and check every chunk's hash (exit 1 if one is damaged)")
    ver.add_argument("id", nargs="?", help="checkpoint id or unique prefix (default: every checkpoint)")
    ex = cmd("export", "write a checkpoint to a .safetensors or torch.save (.pt) file")
    ex.add_argument("id", help="checkpoint id, unique prefix, or 'latest'")
    ex.add_argument("dest", help="the file to write: *.safetensors, *.pt or *.pth")
    ex.add_argument("--select", help="export only this sub-tree (a key path: model, model.encoder)")
    ex.add_argument("--format", choices=["safetensors", "torch"], help="overrides the file's suffix")
    return p


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return n


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds (0 or more), not {text!r}")
    return v


def _gc(args: argparse.Namespace) -> int:
    ck = Checkpointer(
        args.store,
        storage=StorageOptions(endpoint_url=args.endpoint_url or None),
        policy=PolicyOptions(preemption=None),
        distributed=DistributedOptions(rank=0, world_size=1),
        runtime=RuntimeOptions(progress=False, current=False),
    )
    try:
        res = ck.gc(
            keep=args.keep, grace_s=args.grace, dry_run=args.dry_run, keep_abandoned=args.keep_abandoned
        )
    finally:
        ck.close(wait=False)
    _out(res.dry_run_text() if args.dry_run else repr(res))
    for cid in res.manifests:
        _out(f"{'would delete' if args.dry_run else 'deleted'} {cid}")
    return OK


def _ls(ck: Any, args: argparse.Namespace) -> int:
    lst = ck.list()
    if args.json:
        for c in lst:
            _out(
                json.dumps(
                    {
                        "id": c.id,
                        "step": c.step,
                        "branch": c.branch,
                        "created_at": c.created_at,
                        "kind": "base" if c.is_base else "delta",
                        "raw_bytes": c.raw_bytes,
                        "new_bytes": c.new_bytes,
                        "restore_bytes": c.restore_bytes,
                        "world_size": c.world_size,
                    }
                )
            )
    else:
        _out(repr(lst))
    for cid, e in ck.unreadable:
        _err(f"warning: manifest of {cid} cannot be read: {e}")
    return FAILED if ck.unreadable else OK


def _verify(ck: Any, args: argparse.Namespace) -> int:
    ids = [ck.manifest(args.id)["id"]] if args.id else [c.id for c in ck.list()]
    if not ids:
        _err(f"no checkpoints in {ck.store.url}: nothing verified")
        return FAILED
    bad = unread = 0
    for i, cid in enumerate(ids, 1):
        _err(f"verify [{i}/{len(ids)}] {cid} ...")
        try:
            ck.restore(cid, verify=True, allow_pickle=False, per_rank="drop", map_location="cpu")
        except (IntegrityError, ObjectMissingError) as e:
            bad += 1
            _out(f"{cid}  DAMAGED  {e}")
            continue
        except UnsafeValueError as e:
            bad += 1
            _out(f"{cid}  NOT CHECKED  it holds pickled values, which verify does not unpickle ({e})")
            continue
        _out(f"{cid}  ok")
    for cid, err in ck.unreadable:
        unread += 1
        _out(f"{cid}  DAMAGED  manifest cannot be read: {err}")
    _out(
        f"{len(ids) - bad} of {len(ids)} checkpoint(s) intact" + (f", {unread} unreadable" if unread else "")
    )
    return FAILED if bad or unread else OK


def _run(args: argparse.Namespace) -> int:
    if args.command == "gc":
        return _gc(args)
    ck = open_reader(args.store, args.endpoint_url, progress=_Progress())
    try:
        if args.command == "ls":
            return _ls(ck, args)
        if args.command == "show":
            _out(repr(ck.show(args.id)))
            return OK
        if args.command == "verify":
            return _verify(ck, args)
        if args.command == "diff":
            a, b = (ck.manifest(x)["id"] for x in (args.a, args.b))
            _out(repr(ck.diff(a, b)))
            return OK
        res = export(ck, args.id, args.dest, select=args.select, format=args.format)
        _out(repr(res))
        if res.dropped:
            _err(f"left out (not tensors): {', '.join(res.dropped[:20])}")
        return OK
    finally:
        ck.close(wait=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (NoCheckpointError, ExportError) as e:
        _err(f"error: {e}")
        return USAGE
    except CheckpointError as e:
        msg = str(e)
        _err(f"error: {msg}")
        return USAGE if "is not a checkpoint store" in msg or "does not exist" in msg else FAILED
    except (ValueError, TypeError) as e:  # a store URL it cannot parse
        _err(f"error: {e}")
        return USAGE
    except KeyboardInterrupt:
        return 130
