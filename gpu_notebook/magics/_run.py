"""``%gpu_run``: run a script or module on every rank as torchrun would (thin over
:func:`gpu_notebook.cluster.run_script`)."""

from __future__ import annotations

import argparse

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpu_notebook.cluster import run_script
from gpu_notebook.magics._args import path
from gpu_notebook.magics._common import parse, progress_printer, reported, usage_errors
from gpu_notebook.magics._distributed import conclude, print_buffered, rank_args, target_cluster


@magics_class
class RunMagics(Magics):
    """The ``%gpu_run`` magic."""

    @magic_arguments()
    @rank_args
    @argument("-m", "--module", action="store_true", help="run a module (as python -m / torchrun -m)")
    @argument(
        "target",
        type=path("script or module"),
        help="the script file (relative to the notebook's directory), or the module with -m",
    )
    @argument("args", nargs=argparse.REMAINDER, help="the script's own arguments (its sys.argv[1:])")
    @line_magic
    def gpu_run(self, line: str) -> None:
        """Run a training script on every worker, as ``torchrun`` would run it.

        The script gets ``sys.argv``, ``__file__``, ``__name__ == "__main__"``, the torchrun variables and the
        working directory as under torchrun; its output, errors and the stop button work as in a
        ``%%distributed`` cell. Options before the script are gpu_run's; everything after it is the script's.
        A script not on a worker's node is sent with the call (up to 1 MiB); larger ones go in the workers'
        ``--working-dir``.

        Examples
        --------
        In [1]: %gpu_run train.py --lr 0.1 --epochs 2
        In [2]: %gpu_run -m mypkg.train --config small.yaml
        In [3]: %gpu_run --ranks 0 --timeout 600 eval.py
        """
        args = parse(self.gpu_run, line)
        with reported(self.gpu_run):
            # the line was split as a shell splits it (quotes removed): the script gets its arguments as from one
            script_args = list(args.args)
            target = args.target
            cluster = target_cluster(args)
            with usage_errors(ValueError):  # a bad --ranks selection
                result = run_script(
                    cluster,
                    target,
                    script_args,
                    module=args.module,
                    ranks=args.ranks,
                    timeout=args.timeout,
                    stream=not args.no_stream,
                    progress=progress_printer(),
                )
            if args.no_stream:
                print_buffered(result)
            conclude(result, cluster.world_size)
        return None
