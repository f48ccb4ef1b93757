"""The files through which a kernel shows its clusters to the Jupyter server (the JupyterLab panel's data path).

A kernel that owns a cluster writes one JSON file per cluster into a folder of the Jupyter runtime directory, and
rewrites it about once a second from a thread of its own (so it keeps flowing while a blocking cell runs). The
server extension (:mod:`gpu_notebook.labpanel`) reads those files and serves them over the Jupyter server's own
HTTP API, behind its authentication and base URL: no new TCP port is opened, and the folder and its files are the
user's alone (modes 0700 and 0600). Actions go the other way as command files the kernel's thread picks up::

    <runtime dir>/gpu_notebook/             0700
        watching                            touched by the server while a browser polls (mtime: the last poll)
        <kernel id>/                        0700, one per kernel
            kernel.json                     {"kernel_id", "pid", "host", "session", "started"}
            <quoted cluster name>.json      {"card": {...}, "live": {...}}: what the sidebar lists
            <quoted cluster name>.series    {"t": [...], "gpus": ..., "updated": ...}: the dashboard's series,
                                            written only while a pane asks for it (JSON, served as it is)
            <quoted cluster name>.watch     touched by the server while a dashboard pane polls that series
            commands/<uuid>.json            server -> kernel: {"action": "stop" | "scale", "cluster", ...}
            replies/<uuid>.json             kernel -> server: {"ok": bool, "message": str}

Every write is atomic (a temporary file renamed over the old one), so a reader never sees half a file. This
module is the one place both sides agree on that layout; it imports only the standard library, because the
Jupyter server process imports it and must never import Ray, torch or NVML.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

__all__ = [
    "FOLDER",
    "KERNEL_FILE",
    "clean",
    "cluster_file",
    "cluster_files",
    "series_file",
    "series_watch_file",
    "feed_root",
    "kernel_dir",
    "kernel_alive",
    "post_command",
    "read_json",
    "read_reply",
    "remove_kernel_dir",
    "take_commands",
    "touch",
    "unlink",
    "touch_watching",
    "env_secrets",
    "touched_within",
    "watched_within",
    "write_json",
    "write_reply",
]

FOLDER = "gpu_notebook"
KERNEL_FILE = "kernel.json"
WATCHING = "watching"
_SUFFIX = ".json"
_SERIES_SUFFIX = ".series"
_WATCH_SUFFIX = ".watch"

#: Keys whose values never leave the kernel, at any depth of a card (a credential in a policy or a label).
_SECRET_KEY = re.compile(
    r"(secret|token|password|passwd|credential|private|session_key|api_key|access_key)", re.I
)
#: Values that look like credentials wherever they appear: AWS access key ids, PEM private keys.
_SECRET_VALUE = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b|-----BEGIN [A-Z ]*PRIVATE KEY-----")
#: Environment variables whose values are credentials (besides any name the key pattern above matches).
_SECRET_ENV = re.compile(r"^(AWS_|AZURE_|GOOGLE_|GCP_|GCLOUD_|ARM_CLIENT|KUBE).*", re.I)


def env_secrets() -> list[str]:
    """The values of the credential variables of this process's environment (at least 8 characters long),
    longest first: what :func:`clean` hides (made once per publisher tick, not once per file: reading the
    environment was a sixth of the tick)."""
    return sorted(
        {
            v
            for k, v in os.environ.items()
            if len(v) >= 8
            and (_SECRET_KEY.search(k) or (_SECRET_ENV.match(k) and _SECRET_KEY.search(k + "_key")))
        },
        key=len,
        reverse=True,
    )


def feed_root(runtime_dir: str | os.PathLike[str] | None = None) -> Path:
    """The feed folder: ``gpu_notebook/`` in the Jupyter runtime directory (``$JUPYTER_RUNTIME_DIR`` when set)."""
    if runtime_dir is None:
        try:
            from jupyter_core.paths import jupyter_runtime_dir

            runtime_dir = jupyter_runtime_dir()
        except ImportError:  # a bare IPython: jupyter_core's own default
            runtime_dir = os.environ.get("JUPYTER_RUNTIME_DIR") or os.path.join(
                os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "jupyter", "runtime"
            )
    return Path(runtime_dir) / FOLDER


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def kernel_dir(root: Path, kernel_id: str, make: bool = True) -> Path:
    """The kernel's own folder (made, user-only, unless ``make`` is false). ``kernel_id`` is a Jupyter kernel id
    or ``pid-<n>``; anything else (a path, ``..``) is a ValueError."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", kernel_id) or kernel_id.startswith("."):
        raise ValueError(f"not a kernel id: {kernel_id!r}")
    if not make:
        return root / kernel_id
    _private_dir(root)
    return _private_dir(root / kernel_id)


def cluster_file(kdir: Path, name: str) -> Path:
    """The file of cluster ``name`` in a kernel's folder (the name quoted, so any name is one safe file name)."""
    return kdir / (quote(name, safe="") + _SUFFIX)


def cluster_name(path: Path) -> str:
    return unquote(path.name[: -len(_SUFFIX)])


def series_file(kdir: Path, name: str) -> Path:
    """The dashboard series of cluster ``name`` (a file of its own: the list route never reads it)."""
    return kdir / (quote(name, safe="") + _SERIES_SUFFIX)


def series_watch_file(kdir: Path, name: str) -> Path:
    """Touched by the server each time a dashboard pane asks for the series of cluster ``name``."""
    return kdir / (quote(name, safe="") + _WATCH_SUFFIX)


def cluster_files(kdir: Path, name: str) -> tuple[Path, Path, Path]:
    """Every file of cluster ``name`` in a kernel's folder: its card, its series, its watch mark."""
    return cluster_file(kdir, name), series_file(kdir, name), series_watch_file(kdir, name)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically, readable by the user only."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp's file is 0600 already
            # dumps, not dump: dump to a file runs the pure-Python encoder (it was half the publisher's time)
            f.write(json.dumps(data, separators=(",", ":"), allow_nan=False, default=str))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing or (being replaced) unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def clean(value: Any, secrets: list[str] | None = None) -> Any:
    """``value`` with every credential replaced by ``"***"``: the values of keys named like one (``secret``,
    ``token``, ``password`` ...), AWS key ids and PEM keys anywhere, and the value of every credential variable of
    this process's environment wherever it appears. NaN and inf become None (JSON has neither). Cards and feed
    messages pass through this before they are written."""
    if secrets is None:
        secrets = env_secrets()
    if isinstance(value, dict):
        return {
            str(k): (
                "***" if _SECRET_KEY.search(str(k)) and v not in (None, "", False) else clean(v, secrets)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        # a series is mostly numbers: those are checked here, without a call each
        return [
            v
            if type(v) is int or (type(v) is float and v - v == 0.0)  # v - v is nan for nan and inf
            else None
            if type(v) is float
            else clean(v, secrets)
            for v in value
        ]
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, str):
        for s in secrets:
            if s in value:
                value = value.replace(s, "***")
        return _SECRET_VALUE.sub("***", value)
    return value


def kernel_record(kernel_id: str) -> dict[str, Any]:
    return {
        "kernel_id": kernel_id,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "session": os.environ.get("JPY_SESSION_NAME") or None,  # the notebook's path, set by jupyter_server
        "started": time.time(),
    }


def kernel_alive(record: dict[str, Any] | None) -> bool:
    """Whether the kernel that wrote ``record`` (its kernel.json) still runs on this host."""
    if not record or record.get("host") != socket.gethostname():
        return bool(record)  # another host's kernel (a shared runtime dir): cannot tell, assume alive
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return True
    return True


# ---- commands: server -> kernel, replies: kernel -> server -------------------------------------------------------
def post_command(kdir: Path, command: dict[str, Any]) -> str:
    """Leave ``command`` for the kernel's thread; returns its id (the name of the reply to wait for)."""
    cid = uuid.uuid4().hex
    write_json(_private_dir(kdir / "commands") / f"{cid}{_SUFFIX}", dict(command, id=cid, posted=time.time()))
    return cid


def take_commands(kdir: Path) -> list[dict[str, Any]]:
    """The commands waiting for this kernel, oldest first, each removed as it is taken."""
    folder = kdir / "commands"
    try:  # (four times a second: a plain listdir, not a glob, while there is none)
        names = [n for n in os.listdir(folder) if n.endswith(_SUFFIX)]
        paths = sorted((folder / n for n in names), key=lambda p: p.stat().st_mtime) if names else []
    except OSError:
        return []
    out = []
    for p in paths:
        data = read_json(p)
        try:
            p.unlink()
        except OSError:
            continue  # another taker (none should exist) or gone
        if isinstance(data, dict):
            out.append(data)
    return out


def write_reply(kdir: Path, cid: str, ok: bool, message: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{32}", cid):
        return
    write_json(
        _private_dir(kdir / "replies") / f"{cid}{_SUFFIX}", {"ok": ok, "message": message, "t": time.time()}
    )


def read_reply(kdir: Path, cid: str) -> dict[str, Any] | None:
    """The kernel's reply to command ``cid`` (removed once read), or None while there is none."""
    path = kdir / "replies" / f"{cid}{_SUFFIX}"
    data = read_json(path)
    if data is not None:
        try:
            path.unlink()
        except OSError:
            pass
    return data if isinstance(data, dict) else None


# ---- demand: the kernel publishes the live feed while someone looks ---------------------------------------------
def touch_watching(root: Path) -> None:
    _private_dir(root)
    touch(root / WATCHING)


def watched_within(root: Path, seconds: float) -> bool:
    return touched_within(root / WATCHING, seconds)


def touch(path: Path) -> None:
    """Set ``path``'s mtime to now (made, readable by the user only, if missing); nothing on an OSError."""
    try:
        path.touch(mode=0o600)
        os.utime(path)
    except OSError:
        pass


def touched_within(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime <= seconds
    except OSError:
        return False


def unlink(path: Path) -> None:
    """Remove the file ``path``; nothing when it is gone already or cannot be removed."""
    try:
        path.unlink()
    except OSError:
        pass


def remove_kernel_dir(kdir: Path) -> None:
    """Remove a kernel's folder and what is in it (its kernel.json, commands and replies), as far as possible."""
    for sub in ("commands", "replies"):
        for p in (kdir / sub).glob("*"):
            try:
                p.unlink()
            except OSError:
                pass
        try:
            (kdir / sub).rmdir()
        except OSError:
            pass
    for p in kdir.glob("*"):
        try:
            p.unlink()
        except OSError:
            pass
    try:
        kdir.rmdir()
    except OSError:
        pass
