"""Run a script file or module on a cluster's ranks as torchrun would (what ``%gpu_run`` does), and a cell in
the background (what ``%%distributed --noblock`` does).

The script is found in the notebook's filesystem, sent with the call when a worker may not have it (see
:mod:`gpu_notebook.distributed._script`), and run on every selected rank through the worker group's ``call``,
so its output streams with rank prefixes and its failures, exits and interrupts are reported as a
``%%distributed`` cell's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook.cluster._errors import not_running
from gpu_notebook.cluster._runtime_env import working_dir_of
from gpu_notebook.distributed import (
    BackgroundCell,
    CellResult,
    ScriptError,
    debug_ranks,
    parse_ranks,
    refuse_second,
    running_on,
    script_for,
    too_large,
)
from gpu_notebook.distributed import run_script as _run_on_rank

__all__ = ["debug", "run_following", "run_in_background", "run_script"]


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run_script(
    cluster: Any,
    target: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    ranks: str | Sequence[int] | None = None,
    timeout: float | None = None,
    stream: bool = True,
    sink: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> CellResult:
    """Run the file ``target`` (relative to this process's working directory), or the module ``target`` with
    ``module=True``, with ``args`` on the selected ranks of ``cluster`` (all by default).

    Output streams to ``sink`` (default: stdout) as for :meth:`Cluster.run`; the result's failures name each
    rank's error. The workers run in their ``--working-dir`` copy when they have one, else in this process's
    working directory (their shared filesystem on a local cluster).

    Raises
    ------
    ScriptError
        The file does not exist, or it is too large to send to a cluster whose nodes may not have it.
    ClusterError
        The cluster is not running.
    """
    if not cluster.running or cluster.group is None:
        raise not_running(cluster.name)
    script = script_for(
        target,
        tuple(args),
        module=module,
        working_dir=working_dir_of(
            cluster.settings.runtime.worker_setup, cluster.settings.runtime.runtime_env
        ),
        cwd=os.getcwd(),
    )
    refuse_second(cluster.group, "running a script")
    if not module and script.source is None and script.relpath is None and cluster.kind != "local":
        raise ScriptError(too_large(script))
    try:
        return cluster.group.call(  # type: ignore[no-any-return]
            _run_on_rank,
            (script,),
            ranks=ranks,
            timeout=timeout,
            sink=(sink or _stdout) if stream else None,
            progress=progress,
        )
    finally:
        cluster.touch()


def run_in_background(
    cluster: Any,
    code: str,
    *,
    ranks: str | Sequence[int] | None = None,
    timeout: float | None = None,
    label: str,
    name: str,
    header: str | None = None,
    max_result_bytes: int | None = None,
    live: bool = False,
    sink: Callable[[str], None] | None = None,
    on_done: Callable[[BackgroundCell], None] | None = None,
) -> BackgroundCell:
    """Start ``code`` on the selected ranks in a thread of this process and return its handle at once (what
    ``%%distributed --noblock`` and ``Cluster.run(block=False)`` do; see :mod:`gpu_notebook.distributed._background`).

    The run is the group's blocking one (output, failures and recovery as a blocking cell's); ``sink`` gets
    its output when not ``live`` (default: stdout).
    """
    group = cluster.group
    selected = parse_ranks(ranks, cluster.world_size)  # a bad selection fails here, not in the thread

    def start(write: Callable[[str], None]) -> CellResult:
        try:
            return group.run(  # type: ignore[no-any-return]
                code,
                ranks=selected,
                timeout=timeout,
                sink=write,
                label=label,
                progress=lambda msg: write(f"{msg}\n"),
                header=header,
                max_result_bytes=max_result_bytes,
            )
        finally:
            cluster.touch()

    return BackgroundCell(
        name, group, selected, cluster.world_size, start, live=live, sink=sink, on_done=on_done
    )


def run_following(
    cluster: Any,
    label: str,
    *,
    name: str,
    live: bool = False,
    sink: Callable[[str], None] | None = None,
    on_done: Callable[[BackgroundCell], None] | None = None,
) -> BackgroundCell:
    """Follow the cell ``label`` that ``cluster``'s ranks run, or ran, for a kernel that is gone, as a background
    cell of this one: its output since the last drain, then the rest as it comes, then each rank's value."""
    group = cluster.group

    def start(write: Callable[[str], None]) -> CellResult:
        try:
            return group.follow(label, sink=write, progress=lambda msg: write(f"{msg}\n"))  # type: ignore[no-any-return]
        finally:
            cluster.touch()

    selected = list(range(cluster.world_size))
    return BackgroundCell(
        name, group, selected, cluster.world_size, start, live=live, sink=sink, on_done=on_done, followed=True
    )


def debug(
    cluster: Any,
    rank: int | None = None,
    read: Callable[[str], str] | None = None,
    write: Callable[[str], None] | None = None,
) -> None:
    """What ``%gpu_debug`` does on ``cluster`` (see :func:`gpu_notebook.distributed.debug_ranks`); the stop
    button at the prompt of a background cell's breakpoint interrupts that cell, as its ``cancel()``."""
    if not cluster.running or cluster.group is None:
        raise not_running(cluster.name)
    try:
        debug_ranks(cluster.group, rank, read, write)
    except KeyboardInterrupt:
        bg = running_on(cluster.group)
        if bg is None or not bg.cancel():
            raise
        (write or _stdout)(
            f"background cell {bg.name}: its ranks were interrupted (the workers keep their state)\n"
        )
