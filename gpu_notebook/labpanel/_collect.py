"""What the server extension reads from the feed folder: every kernel's clusters as the panel's entries.

Runs in the Jupyter server process, off its event loop (the handlers call it through a thread). It reads small
JSON files and never imports Ray, torch or NVML (an import-linter contract checks it).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from gpu_notebook import _feed

#: an orphan row that reached "gone" stays this long, so the user sees how it ended
GONE_KEEP_S = 3600.0


def reaper_state(reaper: dict[str, Any] | None) -> dict[str, Any] | None:
    """What became of an orphaned cloud cluster, from its reaper's lease and log (see ``cloud/_reaper.py``).

    ``tearing down``: the lease is there and the log's last word is a teardown in progress; ``gone``: the lease
    is released and the log says the teardown is done or there was nothing to do; else ``up and costing`` (the
    reaper failed or is not running: "tear down now" runs its teardown).
    """
    if not reaper:
        return None
    lease, log = Path(str(reaper.get("lease", ""))), Path(str(reaper.get("log", "")))
    try:
        with open(log, errors="replace") as f:
            lines = f.read()[-8000:].splitlines()
    except OSError:
        lines = []
    tail = [ln for ln in lines if ln.strip()][-6:]
    text = "\n".join(tail)
    last = tail[-1] if tail else ""
    if lease.exists():
        if "tearing it down" in text and "teardown done" not in last and "FAILED" not in last:
            state = "tearing down" if _reaper_alive(lines) else "up and costing"
        elif "watching kernel" in last or not tail:
            state = "tearing down" if _reaper_alive(lines) else "up and costing"
        else:
            state = "up and costing"
    elif "teardown done" in last or "already" in last or "nothing" in last or "released" in last:
        state = "gone"
    else:
        state = "up and costing"
    return {"state": state, "log": tail}


def _reaper_alive(lines: list[str]) -> bool:
    for line in reversed(lines):
        m = re.search(r"reaper (\d+):", line)
        if m:
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                return False
            except (PermissionError, ValueError):
                return True
            return True
    return False


def collect(root: Path, sessions: dict[str, str]) -> list[dict[str, Any]]:
    """Every published cluster under ``root`` as a panel entry (``docs/dev/panel-protocol.md``). ``sessions``:
    kernel id -> the path of the notebook this server runs it for. A dead kernel's local or address clusters are
    dropped and its folder removed (their workers ended with it); its cloud clusters stay as orphan rows."""
    entries: list[dict[str, Any]] = []
    try:
        kdirs = [p for p in root.iterdir() if p.is_dir()]
    except OSError:
        return entries
    now = time.time()
    for kdir in kdirs:
        record = _feed.read_json(kdir / _feed.KERNEL_FILE)
        if not isinstance(record, dict):
            continue
        alive = _feed.kernel_alive(record)
        kept = 0
        for path in kdir.glob("*.json"):
            if path.name == _feed.KERNEL_FILE:
                continue
            data = _feed.read_json(path)
            if not isinstance(data, dict) or not isinstance(data.get("card"), dict):
                continue
            card, live = data["card"], data.get("live") or {}
            orphan = not alive or card.get("state") == "handed to the reaper"
            if orphan and card.get("kind") != "cloud":
                for p in _feed.cluster_files(kdir, _feed.cluster_name(path)):
                    _feed.unlink(p)
                continue
            reaper = reaper_state(card.get("reaper")) if orphan else None
            if reaper is not None and reaper["state"] == "gone" and now - path.stat().st_mtime > GONE_KEEP_S:
                _feed.unlink(path)
                continue
            kept += 1
            entry = {**card, **{k: v for k, v in live.items() if k != "state" or not orphan}}
            entry.update(
                id=f"{record['kernel_id']}/{quote(str(card.get('name', '')), safe='')}",
                kernel_id=record["kernel_id"],
                kernel_alive=alive,
                notebook=sessions.get(record["kernel_id"]) or card.get("notebook"),
                orphan=orphan,
                reaper=reaper,
                updated=live.get("t"),
            )
            entry.pop("reaper_lease", None)
            entries.append(entry)
        if not alive and not kept:
            shutil.rmtree(kdir, ignore_errors=True)
    entries.sort(key=lambda e: (e.get("started_at") or 0.0, e["id"]))
    return entries


def find(root: Path, kernel_id: str, name: str) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
    """The kernel folder, kernel record and cluster file data of one cluster, or None when it is not published."""
    try:
        kdir = _feed.kernel_dir(root, kernel_id, make=False)
    except ValueError:
        return None
    record = _feed.read_json(kdir / _feed.KERNEL_FILE)
    data = _feed.read_json(_feed.cluster_file(kdir, name))
    if not isinstance(record, dict) or not isinstance(data, dict):
        return None
    return kdir, record, data


def series(root: Path, kernel_id: str, name: str) -> bytes | dict[str, Any] | None:
    """The dashboard series of one cluster, for its pane: the kernel's series file as it is (bytes), or, before
    the kernel wrote one, ``{"t": [], "updated": ...}``; None when the cluster is not published. Marks the series
    as asked for, so the kernel writes it (within a second) while the pane polls."""
    try:
        kdir = _feed.kernel_dir(root, kernel_id, make=False)
    except ValueError:
        return None
    path, series_path, watch_path = _feed.cluster_files(kdir, name)
    if not path.exists():
        return None
    _feed.touch_watching(root)
    _feed.touch(watch_path)
    try:
        return series_path.read_bytes()
    except OSError:
        data = _feed.read_json(path)
        live = data.get("live") if isinstance(data, dict) else None
        return {"t": [], "updated": live.get("t") if isinstance(live, dict) else None}


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def proxied_path(dashboard_url: str | None, proxy_loaded: bool) -> str | None:
    """``proxy/<port>/`` for a dashboard on this machine when jupyter-server-proxy runs in the server (its route,
    relative to the base URL: the Ray dashboard then opens behind JupyterHub or Binder too), else None."""
    if not proxy_loaded or not dashboard_url:
        return None
    try:
        parts = urlsplit(dashboard_url if "://" in dashboard_url else f"http://{dashboard_url}")
        port = parts.port
    except ValueError:
        return None
    if port is None or (parts.hostname or "") not in (*_LOCAL_HOSTS, os.uname().nodename):
        return None
    return f"proxy/{port}/"
