"""The server extension's REST routes under ``{base_url}gpu-notebook/api/`` (``docs/dev/panel-protocol.md``).

Every route is a jupyter_server ``APIHandler`` behind ``@tornado.web.authenticated``: the server's own token or
cookie login, and its XSRF check on each POST. File reads run off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from gpu_notebook import _feed

from . import _collect

REPLY_WAIT_S = 10.0  # how long a POST waits for the kernel's reply before answering "sent"
ACTIONS = ("stop", "scale", "teardown")
_ID = r"(?P<kernel_id>[A-Za-z0-9_.-]+)/(?P<name>[^/]+)"


class _Base(APIHandler):
    @property
    def feed_root(self) -> Path:
        return Path(self.settings["gpu_notebook_feed_root"])

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(_feed.clean(data), allow_nan=False))

    async def sessions(self) -> dict[str, str]:
        """kernel id -> notebook path, for the kernels this server runs."""
        manager = self.settings.get("session_manager")
        if manager is None:
            return {}
        try:
            found = await manager.list_sessions()
        except Exception:  # noqa: BLE001 - no sessions to name the owners by: rows show the card's own path
            return {}
        return {s["kernel"]["id"]: s.get("path") or "" for s in found if s.get("kernel")}


class ClustersHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        root = self.feed_root
        sessions = await self.sessions()
        await asyncio.to_thread(_feed.touch_watching, root)  # kernels refresh their live feed while we look
        entries = await asyncio.to_thread(_collect.collect, root, sessions)
        proxy = "jupyter_server_proxy" in sys.modules  # loaded as a server extension of this server
        for e in entries:
            e["proxied_dashboard_path"] = _collect.proxied_path(e.get("dashboard_url"), proxy)
        self.write_json({"now": time.time(), "clusters": entries})


class SeriesHandler(_Base):
    @tornado.web.authenticated
    async def get(self, kernel_id: str, name: str) -> None:
        found = await asyncio.to_thread(_collect.series, self.feed_root, kernel_id, unquote(name))
        if found is None:
            raise tornado.web.HTTPError(404, reason="no such cluster: it stopped, or its kernel is gone")
        if isinstance(found, bytes):  # the kernel's series file, written clean: sent as it is, unparsed
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.finish(found)
            return
        self.write_json(found)


class ActionHandler(_Base):
    @tornado.web.authenticated
    async def post(self, kernel_id: str, name: str, action: str) -> None:
        name = unquote(name)
        if action not in ACTIONS:
            raise tornado.web.HTTPError(404, reason=f"unknown action {action!r}")
        found = await asyncio.to_thread(_collect.find, self.feed_root, kernel_id, name)
        if found is None:
            raise tornado.web.HTTPError(404, reason="no such cluster: it stopped, or its kernel is gone")
        kdir, record, data = found
        if action == "teardown":
            self.write_json(await asyncio.to_thread(_teardown, record, data["card"]))
            return
        if not _feed.kernel_alive(record):
            self.write_json({"ok": False, "message": "the kernel that owns this cluster is gone"}, 409)
            return
        command: dict[str, Any] = {"action": action, "cluster": name}
        if action == "scale":
            try:
                body = json.loads(self.request.body or b"{}")
            except ValueError:
                body = {}
            command["workers"] = body.get("workers") if isinstance(body, dict) else None
        cid = await asyncio.to_thread(_feed.post_command, kdir, command)
        deadline = time.monotonic() + REPLY_WAIT_S
        while time.monotonic() < deadline:
            reply = await asyncio.to_thread(_feed.read_reply, kdir, cid)
            if reply is not None:
                self.write_json({"ok": bool(reply.get("ok")), "message": str(reply.get("message", ""))})
                return
            await asyncio.sleep(0.1)
        self.write_json({"ok": True, "message": f"{action} sent; the kernel is still working on it"}, 202)


def _teardown(record: dict[str, Any], card: dict[str, Any]) -> dict[str, Any]:
    """Run the reaper's teardown now for an orphaned cloud cluster (as a process of its own, in a new session:
    ``ray down`` takes minutes and must not die with a server restart)."""
    reaper = card.get("reaper") or {}
    if card.get("kind") != "cloud" or not reaper.get("lease"):
        return {"ok": False, "message": "only a cloud cluster whose kernel is gone is torn down from here"}
    if _feed.kernel_alive(record) and card.get("state") != "handed to the reaper":
        return {"ok": False, "message": "its kernel still runs: stop it from there, or with the stop button"}
    lease = Path(str(reaper["lease"]))
    env = dict(os.environ)
    env["GPU_NOTEBOOK_CONFIG_DIR"] = str(lease.parent.parent)  # the kernel's config folder (clusters/ inside)
    argv = [sys.executable, "-m", "gpu_notebook.cloud._reaper", "--now", "--name", str(card["name"])]
    argv += ["--kernel-pid", str(record.get("pid", 0)), "--lease", str(lease)]
    with open(str(reaper["log"]), "ab") as out:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return {"ok": True, "message": f"tearing down cloud cluster {card['name']!r} (the reaper's teardown)"}


def handlers(base_url: str) -> list[tuple[str, type[APIHandler]]]:
    api = url_path_join(base_url, "gpu-notebook", "api")
    return [
        (url_path_join(api, "clusters"), ClustersHandler),
        (url_path_join(api, "clusters", _ID, "series"), SeriesHandler),
        (url_path_join(api, "clusters", _ID, r"(?P<action>[a-z]+)"), ActionHandler),
    ]
