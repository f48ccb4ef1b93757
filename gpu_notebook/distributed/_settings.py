"""A rank's effective settings, as ``%gpu_cluster env`` shows them, with secrets masked on the rank itself.

The values that matter when training misbehaves: the torchrun variables, ``CUDA_VISIBLE_DEVICES``, the NCCL
settings, ``OMP_NUM_THREADS``, the variables the user set for the workers (``--env``), the working directory
and the Python and torch versions. A value is masked before it leaves the rank (it never reaches the notebook)
when the user gave it (``--env``, ``--env-file``: a token typed there is a secret even under a plain name) or
when its name looks secret (:func:`is_secret_name`).

How many lines of rank output the kernel keeps (so a cell that prints for hours does not grow the kernel's
memory) is set by environment variables read in :mod:`gpu_notebook._settings`; only the longest kept line is
fixed here (:data:`MAX_LINE_CHARS`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

__all__ = ["MASK", "MAX_LINE_CHARS", "SHOWN_VARIABLES", "is_secret_name", "rank_settings"]

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
# (how many lines: gpu_notebook._settings, with every other environment variable of ours)
#: A longer line is kept cut to this many characters, saying how many were dropped.
MAX_LINE_CHARS = 10_000
