"""``%%distributed``, ``%gpu_result``, ``%gpu_push`` and ``%gpu_pull``: run cells on every rank (also in the
background), move variables (thin magics)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments

from gpu_notebook.cluster import Cluster, get_manager
from gpu_notebook.distributed import BackgroundCell, BusyError, CellResult, find_background, parse_ranks
from gpu_notebook.magics._args import duration, identifier, name, rank_list, rank_number, size
from gpu_notebook.magics._common import (
    MagicError,
    option,
    options,
    parse,
    progress_printer,
    refused,
    reported,
    usage_errors,
)
from gpu_notebook.magics._detach import note_cell


class CellSyntaxError(MagicError):
    """A ``%%distributed`` cell that is not Python: shown as IPython shows a SyntaxError (no frames)."""


def cell_syntax_error(exc: SyntaxError) -> CellSyntaxError:
    """``exc`` as a :class:`CellSyntaxError` showing the line and the caret, as IPython shows a cell's."""
    import traceback

    text = "".join(traceback.format_exception_only(SyntaxError, exc)).rstrip("\n").splitlines()
    err = CellSyntaxError(text[-1] if text else str(exc))
    err._render_traceback_ = lambda: list(text)  # type: ignore[attr-defined]
    return err


def target_cluster(args: argparse.Namespace) -> Cluster:
    """The cluster a rank-targeting magic runs on: ``--cluster NAME``, else the current one."""
    cluster: Cluster = get_manager().get(args.cluster) if args.cluster else get_manager().require_current()
    return cluster


@contextlib.contextmanager
def busy_is_usage() -> Iterator[None]:
    """A cell sent to workers running a background cell is the user's mistake: a UsageError saying what runs."""
    try:
        yield
    except BusyError as exc:
        raise UsageError(str(exc)) from None


def print_buffered(result: CellResult, shown: Any = None) -> None:
    """Print what each rank wrote, after the run (``--no-stream``), prefixed as streamed output is (only the
    ``shown`` ranks', when given: ``--output-ranks``)."""
    for rank in sorted(result.outputs):
        if shown is not None and rank not in shown:
            continue
        for out_line in result.outputs[rank]:
            print(f"[rank {rank}] {out_line}")


def conclude(result: CellResult, world_size: int) -> None:
    """Fail the cell with the per-rank report when a rank failed; else show the run's note, if any."""
    if result.failures:
        result.raise_for_failures(world_size)
    elif result.note:
        print(result.note, file=sys.stderr)


def show_values(result: CellResult) -> None:
    """Print each rank's value like ``%px`` does; identical values from several ranks are shown once."""
    for line in result.value_lines():
        print(line)


def _ends_with_semicolon(cell: str) -> bool:
    """Whether the cell's last token is ``;`` (a comment after it counts too), as IPython decides for ``Out``."""
    import io
    import tokenize

    skip = (
        tokenize.ENDMARKER,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.COMMENT,
        tokenize.INDENT,
        tokenize.DEDENT,
    )
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(cell).readline))
    except (tokenize.TokenError, SyntaxError):
        return cell.rstrip().endswith(";")
    for tok in reversed(tokens):
        if tok.type not in skip:
            return tok.type == tokenize.OP and tok.string == ";"
    return False


#: which ranks a magic runs on or sends to, the same option in every magic that selects ranks (--targets is
#: ipyparallel's spelling, as in %%px --targets); --workers, the worker count of %gpu_cluster start, is refused
#: there: %%distributed --workers 2 would read as two workers and run on rank 2 alone
RANK_SELECTION = (
    option(
        "--ranks",
        "--targets",
        type=rank_list(),
        default="all",
        metavar="RANKS",
        help="which ranks: all, 0,2 or 0-3 (default all)",
    ),
    refused(
        "--workers",
        "-w",
        message="--workers is the worker count of %gpu_cluster start; to choose ranks use --ranks, "
        "e.g. --ranks 0,2 (or --targets)",
    ),
)
rank_selection = options(*RANK_SELECTION)
#: the cluster a magic works on, the same option in every magic that reaches the ranks
CLUSTER = option("--cluster", type=name("cluster name"), help="this cluster instead of the current one")
on_cluster = options(CLUSTER)
#: where and how code runs on the ranks: the options %%distributed and %gpu_run share
RANK_ARGS = (
    *RANK_SELECTION,
    option(
        "--timeout",
        "-t",
        type=duration(zero_is_no_limit=True),
        metavar="SECONDS",
        help="seconds before the running ranks are interrupted (default and 0: no limit)",
    ),
    option("--no-stream", action="store_true", help="print output after the cell ends, grouped by rank"),
    CLUSTER,
)
rank_args = options(*RANK_ARGS)


@magics_class
class DistributedMagics(Magics):
    """``%%distributed`` and the variable-moving magics."""

    @property
    def _ns(self) -> dict[str, Any]:
        assert self.shell is not None
        return self.shell.user_ns

    @magic_arguments()
    @rank_args
    @argument(
        "-o",
        "--out",
        type=identifier(),
        metavar="NAME",
        help="store the per-rank values of the last expression in this notebook variable",
    )
    @argument(
        "--max-result",
        type=size(zero_is_no_limit=True),
        metavar="SIZE",
        help="the most a rank's value may take to come back, e.g. 256M or 2G (default 64M; 0: no limit)",
    )
    @argument(
        "--output-ranks",
        type=rank_list(),
        metavar="RANKS",
        help="show only these ranks' output in the cell: 0, 0,2 or 0-3 (default all; the others' output goes "
        "to %%gpu_cluster logs; their failures are still reported)",
    )
    @argument(
        "--noblock",
        "--no-block",
        action="store_true",
        help="return at once with a handle (.ready(), .wait(), .get(), .cancel()); the output keeps streaming "
        "into this cell while other cells run; %%gpu_result waits and shows the values",
    )
    @no_var_expand
    @cell_magic
    def distributed(self, line: str, cell: str) -> BackgroundCell | None:
        """Run the cell on every worker as one PyTorch distributed job.

        torch.distributed is initialised (NCCL on GPUs, gloo on CPUs), the torchrun variables (RANK,
        LOCAL_RANK, WORLD_SIZE, ...) are set, and each worker keeps its namespace from cell to cell.

        Examples
        --------
        In [1]: %%distributed
           ...: import torch, torch.distributed as dist
           ...: x = torch.ones(1) * dist.get_rank()
           ...: dist.all_reduce(x)
           ...: x.item()
        Out[ranks 0-1]: 1.0

        In [2]: %%distributed --ranks 0 -o loss --timeout 60
           ...: compute_loss()

        In [3]: %%distributed --output-ranks 0
           ...: train(epochs=1)   # only rank 0's output (prints, displays, progress bars) in the cell

        In [4]: %%distributed --noblock -o losses
           ...: train(epochs=10)
        In [5]: %gpu_pull step
        In [6]: %gpu_result
        """
        args = parse(self.distributed, line)
        with reported(self.distributed):
            self._check_syntax(cell)
            with self._output_ranks(args) as shown:
                if args.noblock:
                    return self._run_background(args, line, cell)
                with busy_is_usage():
                    self._run(args, line, cell, shown)
        return None

    @contextlib.contextmanager
    def _output_ranks(self, args: argparse.Namespace) -> Iterator[Any]:
        """``--output-ranks``: only those ranks' output is shown, in this cell and the background cell it starts."""
        from gpu_notebook.distributed import _rich

        ranks = None
        if args.output_ranks is not None and args.output_ranks != "all":
            cluster = target_cluster(args)
            with usage_errors(ValueError):
                ranks = parse_ranks(args.output_ranks, cluster.world_size)
        with _rich.output_ranks(ranks) as shown:
            yield shown

    def _check_syntax(self, cell: str) -> None:
        """A cell that is not Python fails here, as IPython shows a SyntaxError, before any rank runs it.

        The cell is turned into plain Python as the ranks turn it (``!ls``, ``%time``), and parsed with a line
        before it for the ``%%distributed`` line, so line numbers are the notebook cell's.
        """
        import ast

        assert self.shell is not None
        count = getattr(self.shell, "execution_count", None)
        filename = f"<cell In[{count}]>" if count is not None else "<cell>"
        try:
            ast.parse("\n" + self.shell.transform_cell(cell), filename, "exec")
        except SyntaxError as exc:
            raise cell_syntax_error(exc) from None

    def _run(self, args: argparse.Namespace, line: str, cell: str, shown: Any = None) -> None:
        """Run the cell and show its output and values; a rank's failure fails the cell (DistributedError)."""
        cluster = target_cluster(args)
        count = getattr(self.shell, "execution_count", None)
        # run's own ValueError is about its arguments: a bad --ranks selection
        with usage_errors(ValueError):
            result = cluster.run(
                cell,
                ranks=args.ranks,
                timeout=args.timeout,
                stream=not args.no_stream,
                label=f"cell In[{count}]" if count is not None else None,
                progress=progress_printer(),
                header=f"%%distributed {line}".rstrip(),
                max_result_bytes=args.max_result,
            )
        if args.no_stream:
            print_buffered(result, None if shown is None else shown.shown)
        if shown is not None and (note := shown.note(args.cluster)):
            print(note, file=sys.stderr)
        # a cell where every rank failed leaves NAME as it was (an earlier result is not replaced by nothing)
        if args.out and (len(result.values) or not result.failures):
            self._ns[args.out] = result.values
        if result.ranks and result.values and not _ends_with_semicolon(cell):  # a trailing ; hides values
            show_values(result)
        cluster.await_stop(result)
        result.add_push_hint(self._ns)
        conclude(result, cluster.world_size)

    def _run_background(self, args: argparse.Namespace, line: str, cell: str) -> BackgroundCell:
        """Start the cell in a thread and return its handle, shown as a view the thread keeps updating."""
        if args.no_stream:
            raise UsageError("--no-stream and --noblock: a background cell's output is kept in its handle")
        cluster = target_cluster(args)
        count = getattr(self.shell, "execution_count", None)
        count = count - 1 if isinstance(count, int) else None  # IPython counts the cell before running it
        ns, out = self._ns, args.out

        def bind(bg: BackgroundCell) -> None:  # -o NAME: set when the values are back (as a blocking cell's)
            if out and bg.result is not None and (len(bg.result.values) or not bg.result.failures):
                ns[out] = bg.result.values

        with busy_is_usage(), usage_errors(ValueError):  # a bad --ranks selection
            bg = cluster.run(
                cell,
                ranks=args.ranks,
                timeout=args.timeout,
                label=f"cell In[{count}]" if count is not None else "background-cell",
                name=str(count) if count is not None else f"bg{id(cell) % 10000}",
                header=f"%%distributed {line}".rstrip(),
                max_result_bytes=args.max_result,
                live=getattr(self.shell, "kernel", None) is not None,  # a Jupyter kernel: update the view
                on_done=bind,
                block=False,
            )
        note_cell(cluster, bg.name, out)  # a detached cluster's keeper keeps -o for a kernel that attaches
        return bg

    @magic_arguments()
    @argument(
        "name",
        nargs="?",
        type=name("background cell"),
        help="the background cell: its In[] number (default: the latest)",
    )
    @argument(
        "--timeout",
        "-t",
        type=duration(zero_is_no_limit=True),
        metavar="SECONDS",
        help="wait at most this long (default and 0: until it ends)",
    )
    @argument(
        "--cancel", action="store_true", help="interrupt its ranks first (the workers keep their state)"
    )
    @argument(
        "-o",
        "--out",
        type=identifier(),
        metavar="NAME",
        help="store the per-rank values in this notebook variable",
    )
    @line_magic
    def gpu_result(self, line: str) -> None:
        """Wait for a background cell (``%%distributed --noblock``) and show its values, or its failure.

        The stop button stops the wait, not the cell: ``--cancel`` interrupts the cell's ranks.

        Examples
        --------
        In [5]: %gpu_result
        In [6]: %gpu_result 3 --timeout 60 -o losses
        In [7]: %gpu_result 3 --cancel
        """
        args = parse(self.gpu_result, line)
        with reported(self.gpu_result, strip_quotes=True):
            try:
                bg = find_background(args.name)
            except LookupError as exc:
                raise UsageError(str(exc.args[0])) from None
            if args.cancel and bg.cancel():
                print(f"cancelling background cell {bg.name}: its ranks were interrupted")
            deadline = time.monotonic() + args.timeout if args.timeout else None
            seen = 0

            def stream() -> None:  # a cell a gone kernel started: its output since, then as it comes
                nonlocal seen
                lines, seen = bg.lines_since(seen)
                if lines:
                    print("\n".join(lines), flush=True)

            try:
                while not bg.wait(0.1):  # short waits: the stop button ends the wait at once
                    if bg.followed:
                        stream()
                    if deadline is not None and time.monotonic() > deadline:
                        raise MagicError(f"{bg.busy_message('waiting')} (still running after --timeout)")
            except KeyboardInterrupt:
                print(f"stopped waiting; background cell {bg.name} still runs", file=sys.stderr)
                return None
            if bg.followed:
                stream()
            bg.refresh()  # the cell that started it shows the end now, while this cell runs
            if bg.error is not None:
                raise bg.error
            result = bg.result
            assert result is not None
            if args.out and (len(result.values) or not result.failures):
                self._ns[args.out] = result.values
            if result.values:
                show_values(result)
            conclude(result, bg.world_size)
        return None

    @magic_arguments()
    @argument(
        "names",
        nargs="+",
        type=identifier(),
        help="notebook variables to send (to every rank, or to --ranks)",
    )
    @rank_selection
    @on_cluster
    @line_magic
    def gpu_push(self, line: str) -> None:
        """Send notebook variables to the workers' namespaces.

        Examples
        --------
        In [1]: lr, batch = 0.1, 64
        In [2]: %gpu_push lr batch
        In [3]: %gpu_push batch --ranks 0
        In [4]: %gpu_push batch --cluster eval
        """
        args = parse(self.gpu_push, line)
        with reported(self.gpu_push, strip_quotes=True):
            missing = [n for n in args.names if n not in self._ns]
            if missing:
                raise MagicError(f"not defined in the notebook: {', '.join(missing)}")
            cluster = target_cluster(args)
            if cluster.running:  # (a stopped one says so in push)
                with usage_errors(ValueError):  # a bad --ranks selection
                    parse_ranks(args.ranks, cluster.world_size)
            try:
                cluster.push(ranks=args.ranks, **{n: self._ns[n] for n in args.names})
            except TypeError as exc:  # WorkerGroup.push: "cannot send variable 'x' ...: it cannot be pickled"
                raise MagicError(str(exc)) from None
            print(f"pushed {', '.join(args.names)} to ranks {args.ranks}")
        return None

    @magic_arguments()
    @argument("name", type=identifier(), help="the worker variable to bring back")
    @argument(
        "--rank",
        "-r",
        type=rank_number(),
        default=0,
        help="from this rank (default 0)",
    )
    @argument(
        "--as",
        "--out",
        "-o",
        dest="as_name",
        type=identifier(),
        metavar="NAME",
        help="store it in the notebook under this name (default: the same name)",
    )
    @argument(
        "--device",
        action="store_true",
        help="keep tensors on the rank's device (default: they come to the CPU, as a cell's values do)",
    )
    @on_cluster
    @line_magic
    def gpu_pull(self, line: str) -> None:
        """Bring a variable back from one worker into the notebook's namespace.

        Its tensors (in lists, tuples and dicts too: a state_dict) come to the CPU, as a cell's values do: the
        notebook may have no GPU. ``--device`` keeps them on the rank's device.

        Examples
        --------
        In [1]: %gpu_pull model --rank 0
        In [2]: %gpu_pull losses --rank 1 --as losses_rank1
        In [3]: %gpu_pull batch --device
        In [4]: %gpu_pull losses --cluster eval
        """
        args = parse(self.gpu_pull, line)
        with reported(self.gpu_pull, strip_quotes=True):
            cluster = target_cluster(args)
            if cluster.running and not 0 <= args.rank < cluster.world_size:
                raise UsageError(
                    f"rank {args.rank} out of range: this cluster has ranks 0-{cluster.world_size - 1}"
                )
            try:
                value = cluster.pull(args.name, rank=args.rank, keep_device=args.device)
            except (NameError, TypeError) as exc:  # WorkerGroup.pull: not defined on the rank; not picklable
                raise MagicError(str(exc)) from None
            target = args.as_name or args.name
            self._ns[target] = value
            print(f"pulled {args.name!r} from rank {args.rank} into {target!r} ({type(value).__name__})")
        return None
