"""Every ``GPU_NOTEBOOK_*`` environment variable the library reads: its name, default, meaning and when it is read.

Rule 6 of the house: environment variables are read in one place. Each variable has a typed accessor here that
reads ``os.environ`` when it is called, never at this module's import, and parses the value as its one caller
always did (the same defaults, the same errors for a bad value). *When* a variable takes effect is the caller's
choice and stays as it was: the codec asks :func:`native_switched_off` at its own import, a cluster asks
:func:`log_lines` when it starts, a cell asks :func:`output_lines` when it starts, and so on; :data:`VARIABLES`
says which for each, and ``docs/settings.md`` shows the same table to users (a test keeps the two in step).

What stays outside, on purpose: code that runs where gpu_notebook may not be importable reads no variable of
ours (``checkpoint/reader.py``, a standalone file; the node probe of ``cluster/_package_check.py``, sent by
value), and the build and development tools read their own (``setup.py``: ``GPU_NOTEBOOK_BUILD_NATIVE``; the
example notebooks: ``GPU_NOTEBOOK_EXAMPLE_SIZE``; ``scripts/``: ``GPU_NOTEBOOK_TEST_WORKERS``,
``GPU_NOTEBOOK_NO_UV``). Variables of other programs (``XDG_*``, ``GOOGLE_API_KEY``, ``RAY_ADDRESS``, the
torchrun ones) are read where they are used.

This module imports nothing of ours and nothing heavy: it is a bottom layer every package may ask (rank code
too), and ``import gpu_notebook`` stays cheap.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "CACHE_DIR_VAR",
    "CLOUD_VAR",
    "CONFIG_DIR_VAR",
    "GCP_API_KEY_VAR",
    "INTERRUPTIBLE_WAITS_VAR",
    "INTERRUPT_GRACE_VAR",
    "LOG_LINES_VAR",
    "METADATA_URL_VAR",
    "NATIVE_VAR",
    "NO_C_EXT_VAR",
    "OUTPUT_LINES_VAR",
    "GUARDED_VAR",
    "PANEL_VAR",
    "PROXY_PREFIX_VAR",
    "SKIP_RAY_VERSION_CHECK_VAR",
    "STALL_REPORT_VAR",
    "VARIABLES",
    "VM_NAME_VAR",
    "Variable",
    "cache_dir",
    "cloud",
    "config_dir",
    "gcp_api_key",
    "guarded",
    "interrupt_grace",
    "interruptible_waits",
    "log_lines",
    "metadata_url",
    "native_switched_off",
    "output_lines",
    "panel_enabled",
    "proxy_prefix",
    "skip_ray_version_check",
    "stall_report_s",
    "vm_name",
]


@dataclass(frozen=True)
class Variable:
    """One environment variable of ours, as ``docs/settings.md`` lists it."""

    name: str  # the variable, e.g. "GPU_NOTEBOOK_LOG_LINES"
    default: str  # what holds when it is unset, in words or as the value
    what: str  # one line: what it changes
    read: str  # when the library reads it (so when a change takes effect)


# ---- the checkpoint codec's C kernels ------------------------------------------------------------------------
NO_C_EXT_VAR = "GPU_NOTEBOOK_NO_C_EXT"
NATIVE_VAR = "GPU_NOTEBOOK_NATIVE"
_FALSE = ("0", "false", "no", "off")


def native_switched_off() -> str | None:
    """``NAME=value`` of the setting that turns the codec's C kernels off (tests and CI runs of the numpy path),
    or None: ``$GPU_NOTEBOOK_NO_C_EXT`` set to anything but a false word, or ``$GPU_NOTEBOOK_NATIVE`` set to one
    (``0``, ``false``, ``no``, ``off``, any case)."""
    if os.environ.get(NO_C_EXT_VAR, "").strip().lower() not in ("", *_FALSE):
        return f"{NO_C_EXT_VAR}=" + os.environ[NO_C_EXT_VAR]
    if os.environ.get(NATIVE_VAR, "1").strip().lower() in _FALSE:
        return f"{NATIVE_VAR}=" + os.environ[NATIVE_VAR]
    return None


# ---- spot preemption notices (checkpoint/_preemption.py) -------------------------------------------------------
CLOUD_VAR = "GPU_NOTEBOOK_CLOUD"
METADATA_URL_VAR = "GPU_NOTEBOOK_METADATA_URL"
VM_NAME_VAR = "GPU_NOTEBOOK_VM_NAME"


def cloud() -> str:
    """``$GPU_NOTEBOOK_CLOUD`` stripped and in lower case (``aws``, ``gcp``, ``azure``, or another word, which the
    caller treats as no cloud); ``""`` when unset: the cloud is detected."""
    return os.environ.get(CLOUD_VAR, "").strip().lower()


def metadata_url() -> str | None:
    """``$GPU_NOTEBOOK_METADATA_URL`` (another metadata endpoint: a test server, a proxy), or None when unset or
    empty."""
    return os.environ.get(METADATA_URL_VAR) or None


def vm_name() -> str | None:
    """``$GPU_NOTEBOOK_VM_NAME`` (the Azure VM's name in scheduled events), or None when unset or empty: the
    metadata service is asked."""
    return os.environ.get(VM_NAME_VAR) or None


# ---- the price catalog -----------------------------------------------------------------------------------------
CACHE_DIR_VAR = "GPU_NOTEBOOK_CACHE_DIR"
GCP_API_KEY_VAR = "GPU_NOTEBOOK_GCP_API_KEY"


def cache_dir() -> str | None:
    """``$GPU_NOTEBOOK_CACHE_DIR``, the folder of refreshed prices, or None when unset or empty (the caller falls
    back to ``$XDG_CACHE_HOME/gpu_notebook``)."""
    return os.environ.get(CACHE_DIR_VAR) or None


def gcp_api_key() -> str | None:
    """``$GPU_NOTEBOOK_GCP_API_KEY``, the Cloud Billing API key of a price refresh, or None when unset or empty
    (the caller falls back to ``$GOOGLE_API_KEY``)."""
    return os.environ.get(GCP_API_KEY_VAR) or None


# ---- cloud clusters --------------------------------------------------------------------------------------------
CONFIG_DIR_VAR = "GPU_NOTEBOOK_CONFIG_DIR"
SKIP_RAY_VERSION_CHECK_VAR = "GPU_NOTEBOOK_SKIP_RAY_VERSION_CHECK"


def config_dir() -> str | None:
    """``$GPU_NOTEBOOK_CONFIG_DIR``, the config folder (cloud cluster state in its ``clusters/``), or None when
    unset or empty (the caller falls back to ``$XDG_CONFIG_HOME/gpu_notebook``)."""
    return os.environ.get(CONFIG_DIR_VAR) or None


def skip_ray_version_check() -> bool:
    """Whether ``$GPU_NOTEBOOK_SKIP_RAY_VERSION_CHECK`` is exactly ``1``: use a Ray outside the tested range."""
    return os.environ.get(SKIP_RAY_VERSION_CHECK_VAR) == "1"


# ---- dashboard links -------------------------------------------------------------------------------------------
PROXY_PREFIX_VAR = "GPU_NOTEBOOK_PROXY_PREFIX"


def proxy_prefix(environ: Mapping[str, str] | None = None) -> str:
    """``$GPU_NOTEBOOK_PROXY_PREFIX`` stripped (a path, or ``off``), ``""`` when unset; ``environ``: where to read
    it (default this process's environment: tests pass their own)."""
    env = os.environ if environ is None else environ
    return env.get(PROXY_PREFIX_VAR, "").strip()


# ---- rank output, interrupts and hang reports (distributed/) ---------------------------------------------------
#: Lines of each rank's output a cell keeps in the kernel (its first half and its last half, with a
#: "... N lines dropped ..." line between).
OUTPUT_LINES_VAR = "GPU_NOTEBOOK_OUTPUT_LINES"
DEFAULT_OUTPUT_LINES = 2000
#: Recent lines of each rank ``%gpu_cluster logs`` keeps (a ring: the oldest go first).
LOG_LINES_VAR = "GPU_NOTEBOOK_LOG_LINES"
DEFAULT_LOG_LINES = 5000
#: Seconds an interrupted cell's ranks get to stop before the group gives up on them and rebuilds (every
#: worker's state is lost then).
INTERRUPT_GRACE_VAR = "GPU_NOTEBOOK_INTERRUPT_GRACE"
DEFAULT_INTERRUPT_GRACE = 5.0
#: Seconds without collective progress, with the ranks' sequence numbers apart, before a running cell shows every
#: rank's stack once (0: never).
STALL_REPORT_VAR = "GPU_NOTEBOOK_STALL_REPORT"
DEFAULT_STALL_REPORT = 120.0
#: ``0`` in the workers' environment (``--env``) leaves a cell's blocking waits unsliced.
INTERRUPTIBLE_WAITS_VAR = "GPU_NOTEBOOK_INTERRUPTIBLE_WAITS"


def output_lines() -> int:
    """How many lines of each rank's output a cell keeps: ``$GPU_NOTEBOOK_OUTPUT_LINES``, else 2000."""
    return _lines_setting(OUTPUT_LINES_VAR, DEFAULT_OUTPUT_LINES)


def log_lines() -> int:
    """How many recent lines of each rank the cluster's log keeps: ``$GPU_NOTEBOOK_LOG_LINES``, else 5000."""
    return _lines_setting(LOG_LINES_VAR, DEFAULT_LOG_LINES)


def interrupt_grace() -> float:
    """Seconds an interrupted rank gets to stop before the group is rebuilt: ``$GPU_NOTEBOOK_INTERRUPT_GRACE``,
    else 5."""
    return _seconds_setting(
        INTERRUPT_GRACE_VAR, DEFAULT_INTERRUPT_GRACE, "a number of seconds above 0", zero=False
    )


def stall_report_s() -> float:
    """Seconds without collective progress before a cell's hang report (0: off): ``$GPU_NOTEBOOK_STALL_REPORT``,
    else 120."""
    return _seconds_setting(
        STALL_REPORT_VAR, DEFAULT_STALL_REPORT, "a number of seconds, 0 to turn the report off", zero=True
    )


PANEL_VAR = "GPU_NOTEBOOK_PANEL"


def panel_enabled() -> bool:
    """Whether a kernel publishes its clusters to the JupyterLab panel: unless ``$GPU_NOTEBOOK_PANEL`` is ``0``."""
    return os.environ.get(PANEL_VAR, "").strip().lower() not in _FALSE


GUARDED_VAR = "GPU_NOTEBOOK_GUARDED"


def guarded() -> bool:
    """Whether this process is a rank of a detached cluster whose guards (idle stop, budget) may ask a
    Checkpointer to save before they stop it: ``$GPU_NOTEBOOK_GUARDED`` is ``1`` (set by gpu_notebook on those
    workers; read on the rank when a Checkpointer is created)."""
    return os.environ.get(GUARDED_VAR, "").strip() == "1"


def interruptible_waits() -> bool:
    """Whether a cell's blocking waits are sliced so the stop button reaches them: unless
    ``$GPU_NOTEBOOK_INTERRUPTIBLE_WAITS`` is ``0`` (read on the rank)."""
    return os.environ.get(INTERRUPTIBLE_WAITS_VAR, "").strip() != "0"


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


#: Every variable the library reads, in the order of ``docs/settings.md``.
VARIABLES: tuple[Variable, ...] = (
    Variable(
        OUTPUT_LINES_VAR,
        "`2000`",
        "lines of each rank's output a cell keeps (the first and last halves, the middle dropped)",
        "when a cell starts",
    ),
    Variable(
        LOG_LINES_VAR,
        "`5000`",
        "recent lines of each rank `%gpu_cluster logs` keeps (a ring)",
        "when a cluster starts",
    ),
    Variable(
        INTERRUPT_GRACE_VAR,
        "`5`",
        "seconds an interrupted rank gets to stop before the worker group is rebuilt (its state lost)",
        "when a cluster starts",
    ),
    Variable(
        STALL_REPORT_VAR,
        "`120`",
        "seconds without collective progress before a cell shows every rank's stack once; `0`: never",
        "when a cell starts",
    ),
    Variable(
        INTERRUPTIBLE_WAITS_VAR,
        "on",
        "`0` in the workers' environment (`--env`) leaves a cell's sleeps and lock waits unsliced "
        "(the stop button then cannot end them)",
        "on each rank, when its worker starts",
    ),
    Variable(
        PANEL_VAR,
        "on",
        "`0` stops the kernel publishing its clusters to the JupyterLab panel (the sidebar, dashboards and "
        "status-bar item then do not see them)",
        "when a cluster starts",
    ),
    Variable(
        GUARDED_VAR,
        "set on a detached cluster's workers",
        "`1` (gpu_notebook sets it on the workers of a `--detach` cluster): a Checkpointer there saves when the "
        "cluster's idle stop or budget fires, before the workers stop",
        "on each rank, when a `Checkpointer` is created",
    ),
    Variable(
        PROXY_PREFIX_VAR,
        "found (JupyterHub, the parent Jupyter server)",
        "base path of the Jupyter server's proxy for dashboard links (`/user/me/`), or `off` for direct links",
        "each time a link is made",
    ),
    Variable(
        NO_C_EXT_VAR,
        "unset",
        "`1` turns the checkpoint codec's C kernels off (the numpy path: the same bytes, slower)",
        "at import of the codec (first save or restore)",
    ),
    Variable(
        NATIVE_VAR,
        "`1`",
        "`0` turns the checkpoint codec's C kernels off, as `GPU_NOTEBOOK_NO_C_EXT=1`",
        "at import of the codec (first save or restore)",
    ),
    Variable(
        CLOUD_VAR,
        "detected (DMI strings)",
        "`aws`, `gcp` or `azure`: the cloud whose metadata service a Checkpointer watches for spot notices",
        "when a `Checkpointer` is created (it starts the preemption watcher)",
    ),
    Variable(
        METADATA_URL_VAR,
        "`http://169.254.169.254`",
        "the metadata endpoint the preemption watcher polls (a test server, a proxy)",
        "when a `Checkpointer` is created (it starts the preemption watcher)",
    ),
    Variable(
        VM_NAME_VAR,
        "asked of the metadata service",
        "this Azure VM's name, to pick its own scheduled events",
        "at each poll of the metadata service",
    ),
    Variable(
        CACHE_DIR_VAR,
        "`$XDG_CACHE_HOME/gpu_notebook` (`~/.cache/gpu_notebook`)",
        "folder of the refreshed GPU prices (`gpu_catalog.json`)",
        "when the catalog is first loaded (or reloaded) and at each `Catalog.refresh`",
    ),
    Variable(
        GCP_API_KEY_VAR,
        "`$GOOGLE_API_KEY`",
        "Cloud Billing Catalog API key for refreshing GCP prices",
        "at each `Catalog.refresh`",
    ),
    Variable(
        CONFIG_DIR_VAR,
        "`$XDG_CONFIG_HOME/gpu_notebook` (`~/.config/gpu_notebook`)",
        "config folder: cloud cluster state lives in its `clusters/`",
        "each time cluster state is read or written",
    ),
    Variable(
        SKIP_RAY_VERSION_CHECK_VAR,
        "unset",
        "`1` launches cloud clusters with a Ray outside the tested range (at your own risk)",
        "when a cloud cluster is planned (each start or plan)",
    ),
)
