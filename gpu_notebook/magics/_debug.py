"""``%gpu_debug``: pdb on a rank, in the notebook (thin over :meth:`gpu_notebook.Cluster.debug`)."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpu_notebook.magics._args import rank_number
from gpu_notebook.magics._common import parse, reported
from gpu_notebook.magics._distributed import on_cluster, target_cluster


@magics_class
class DebugMagics(Magics):
    """The ``%gpu_debug`` magic."""

    @magic_arguments()
    @argument(
        "--rank",
        "-r",
        type=rank_number(),
        default=None,
        help="debug this rank (default: the first paused at a breakpoint, else the lowest that failed)",
    )
    @on_cluster
    @line_magic
    def gpu_debug(self, line: str) -> None:
        """Open pdb on a rank, as ``%debug`` does locally: post-mortem after a failed cell, or at a breakpoint.

        After a ``%%distributed`` cell or ``%gpu_run`` failed, pdb opens on the failed rank's traceback (the
        lowest failed rank by default; the prompt names the ranks that failed alike). While ranks of a
        ``--noblock`` cell wait at a ``breakpoint()``, it attaches to them. Commands are typed in the notebook's
        input box: any pdb command, ``rank N`` to switch rank, ``all CMD`` for every paused rank, ``q`` to end a
        post-mortem, ``c`` to let a paused rank run on.

        Examples
        --------
        In [1]: %gpu_debug
        (Pdb rank 1) p loss
        (Pdb rank 1) u
        (Pdb rank 1) q

        In [2]: %gpu_debug --rank 3
        """
        args = parse(self.gpu_debug, line)
        with reported(self.gpu_debug):
            cluster = target_cluster(args)
            if args.rank is not None and cluster.running and not 0 <= args.rank < cluster.world_size:
                raise UsageError(
                    f"rank {args.rank} out of range: this cluster has ranks 0-{cluster.world_size - 1}"
                )
            cluster.debug(args.rank)
        return None
