"""A rank's effective settings, as ``%gpu_cluster env`` shows them, with secrets masked on the rank itself.

The values that matter when training misbehaves: the torchrun variables, ``CUDA_VISIBLE_DEVICES``, the NCCL
settings, ``OMP_NUM_THREADS``, the variables the user set for the workers (``--env``), the working directory
and the Python and torch versions. A value is masked before it leaves the rank (it never reaches the notebook)
when the user gave it (``--env``, ``--env-file``: a token typed there is a secret even under a plain name) or
when its name looks secret (:func:`is_secret_name`).

It also holds the notebook-side settings of rank output (:func:`output_lines`, :func:`log_lines`): how much of
what the ranks print the kernel keeps, so a cell that prints for hours does not grow the kernel's memory.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable

__all__ = [
    "LOG_LINES_VAR",
    "MASK",
    "MAX_LINE_CHARS",
    "OUTPUT_LINES_VAR",
    "SHOWN_VARIABLES",
    "STALL_REPORT_VAR",
    "is_secret_name",
    "log_lines",
    "output_lines",
    "rank_settings",
    "stall_report_s",
]

MASK = "****"

#: The variables shown for every rank when set (in this order), besides the ``NCCL_*``, ``TORCHELASTIC_*`` and
#: the user's own.
SHOWN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "ACCELERATE_TORCH_DEVICE",
    "OMP_NUM_THREADS",
)
_PREFIXES = ("TORCHELASTIC_", "NCCL_")
_ALWAYS = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")  # shown as "(not set)" when unset: that is news too
_SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|PRIVATE|SESSION|COOKIE")
_SECRET_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCP_", "HF_", "HUGGING", "WANDB_", "OPENAI_", "ANTHROPIC_")


def is_secret_name(name: str) -> bool:
    """Whether a variable's name says its value is a secret (shown as ``****``).

    >>> [n for n in ("HF_TOKEN", "AWS_REGION", "db_password", "NCCL_DEBUG", "MY_API_KEY") if is_secret_name(n)]
    ['HF_TOKEN', 'AWS_REGION', 'db_password', 'MY_API_KEY']
    """
    upper = name.upper()
    return bool(_SECRET.search(upper)) or upper.startswith(_SECRET_PREFIXES)


def _masked(name: str, value: str, given: frozenset[str]) -> str:
    return MASK if name in given or is_secret_name(name) else value


def rank_settings(user_names: Iterable[str] = ()) -> dict[str, str]:
    """This process's effective settings, name -> value (secrets masked): runs on a rank through ``call``."""
    given = frozenset(user_names)
    env = os.environ
    names = [n for n in SHOWN_VARIABLES if n in env or n in _ALWAYS]
    names += sorted(n for n in env if n.startswith(_PREFIXES) and n not in names)
    names += [n for n in sorted(given) if n not in names]
    out = {
        "cwd": os.getcwd(),
        "python": f"{sys.version.split()[0]} ({sys.executable})",
        "torch": _torch_version(),
    }
    for name in names:
        out[name] = _masked(name, env[name], given) if name in env else "(not set)"
    return out


def _torch_version() -> str:
    try:
        import torch
    except ImportError:
        return "(not installed)"
    return str(torch.__version__)


# ---- how much rank output the kernel keeps ---------------------------------------------------------------------
#: The environment variable that sets how many lines of each rank's output a cell keeps in the kernel (its
#: first half and its last half, with a "... N lines dropped ..." line between): read when a cell starts.
OUTPUT_LINES_VAR = "GPU_NOTEBOOK_OUTPUT_LINES"
DEFAULT_OUTPUT_LINES = 2000
#: The environment variable that sets how many recent lines of each rank ``%gpu_cluster logs`` keeps (a ring:
#: the oldest go first): read when a cluster starts.
LOG_LINES_VAR = "GPU_NOTEBOOK_LOG_LINES"
DEFAULT_LOG_LINES = 5000
#: A longer line is kept cut to this many characters, saying how many were dropped.
MAX_LINE_CHARS = 10_000


def output_lines() -> int:
    """How many lines of each rank's output a cell keeps: ``$GPU_NOTEBOOK_OUTPUT_LINES``, else 2000."""
    return _lines_setting(OUTPUT_LINES_VAR, DEFAULT_OUTPUT_LINES)


def log_lines() -> int:
    """How many recent lines of each rank the cluster's log keeps: ``$GPU_NOTEBOOK_LOG_LINES``, else 5000."""
    return _lines_setting(LOG_LINES_VAR, DEFAULT_LOG_LINES)


#: The environment variable that sets how long, in seconds, an interrupted cell's ranks get to stop before the
#: group gives up on them and rebuilds (every worker's state is lost then): read when a cluster starts.
INTERRUPT_GRACE_VAR = "GPU_NOTEBOOK_INTERRUPT_GRACE"
DEFAULT_INTERRUPT_GRACE = 5.0


def interrupt_grace() -> float:
    """Seconds an interrupted rank gets to stop before the group is rebuilt: ``$GPU_NOTEBOOK_INTERRUPT_GRACE``,
    else 5."""
    return _seconds_setting(
        INTERRUPT_GRACE_VAR, DEFAULT_INTERRUPT_GRACE, "a number of seconds above 0", zero=False
    )


#: The environment variable that sets after how many seconds without collective progress, with the ranks'
#: sequence numbers apart, a running cell shows every rank's stack once (0: never): read when a cell starts.
STALL_REPORT_VAR = "GPU_NOTEBOOK_STALL_REPORT"
DEFAULT_STALL_REPORT = 120.0


def stall_report_s() -> float:
    """Seconds without collective progress before a cell's hang report (0: off): ``$GPU_NOTEBOOK_STALL_REPORT``,
    else 120."""
    return _seconds_setting(
        STALL_REPORT_VAR, DEFAULT_STALL_REPORT, "a number of seconds, 0 to turn the report off", zero=True
    )


def _seconds_setting(name: str, default: float, what: str, zero: bool) -> float:
    """``$name`` as a finite number of seconds (above 0, or 0 too with ``zero``); ``default`` when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise ValueError(f"{name} must be {what} (got {raw!r})")
    return value


def _lines_setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value < 2:
        raise ValueError(f"{name} must be a whole number of lines, at least 2 (got {raw!r})")
    return value
