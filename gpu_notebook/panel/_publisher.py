"""The kernel's side of the JupyterLab panel: a thread that writes each cluster's card and live feed to the feed
folder and carries out what the panel asks (stop, scale).

It runs on a thread of its own, so the feed keeps flowing and a stop from the panel lands while a blocking cell
runs on the kernel's main thread. Layout and shapes: ``docs/dev/panel-protocol.md`` and :mod:`gpu_notebook._feed`.

Costs: with nobody looking (no browser polled the server in the last :data:`WATCH_S` seconds) it writes a card
when something on it changed and otherwise only looks for commands; while someone looks it refreshes each
cluster's file once per :data:`INTERVAL_S` from the shared monitor and cost meter (started on first demand, the
same ones ``%gpu_monitor`` and ``%gpu_cost`` use: no second sampler on the nodes).
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any

from gpu_notebook import _feed, _registry, _settings
from gpu_notebook.monitor import monitor_for, running_monitor

from . import _card

INTERVAL_S = 1.0  # a live refresh per second while someone looks (the pane's target: at least 1 per second)
COMMAND_POLL_S = 0.25  # how often the command folder is looked at (a stop lands within this)
WATCH_S = 10.0  # a browser that polled within this long is "looking"
COST_POLL_S = 10.0  # how often the cost meter re-learns the cluster's nodes (a Ray call)
STOP_REASON = "from the JupyterLab panel"


class Publisher:
    """Publishes this kernel's clusters to the feed folder ``root`` (see the module docstring)."""

    def __init__(self, kernel: dict[str, Any], root: Path) -> None:
        self.kernel = kernel
        self.root = root
        self.kdir = _feed.kernel_dir(root, kernel["kernel_id"])
        _feed.write_json(self.kdir / _feed.KERNEL_FILE, kernel)
        self._lock = threading.RLock()
        self._clusters: dict[str, weakref.ref[Any]] = {}
        self._cards: dict[str, dict[str, Any]] = {}  # the last card written, per cluster name
        self._kept: set[str] = set()  # cloud clusters handed to the reaper: their cards stay (orphan rows)
        self._monitor_tried: weakref.WeakSet[Any] = weakref.WeakSet()
        self._cost_polled: dict[str, float] = {}
        self._charted: set[str] = set()  # clusters whose series file is written (a pane asks for it)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.ticks = 0
        self.last_error: str | None = (
            None  # the last thing that kept a figure from the panel, shown on its row
        )
        self._thread = threading.Thread(target=self._run, name="gpu_notebook-panel", daemon=True)
        self._thread.start()

    # ---- what the cluster manager tells us --------------------------------------------------------------------
    def add(self, cluster: Any) -> None:
        with self._lock:
            self._clusters[cluster.name] = weakref.ref(cluster)
            self._kept.discard(cluster.name)
        # seen at once, not a tick later
        self._write(cluster, _feed.watched_within(self.root, WATCH_S), _feed.env_secrets())
        self._wake.set()

    def remove(self, cluster: Any) -> None:
        """A cluster left the kernel: its file goes, unless its cloud nodes were handed to the reaper (its card then
        stays, saying so, for the panel's orphan row)."""
        name = cluster.name
        with self._lock:
            ref = self._clusters.get(name)
            if ref is not None and ref() is cluster:
                del self._clusters[name]
            self._cards.pop(name, None)
        path, *extra = _feed.cluster_files(self.kdir, cluster.name)
        for p in extra:  # the series and its watch mark go in any case
            _feed.unlink(p)
        handed = str(cluster.kind).startswith("cloud:") and cluster.state not in ("stopped", "failed", "new")
        if handed:
            card = _card.card(cluster, self.kernel)
            card["state"] = "handed to the reaper"
            _feed.write_json(path, _feed.clean({"card": card, "live": {"t": time.time()}}))
            self._kept.add(cluster.name)
            return
        _feed.unlink(path)

    def clusters(self) -> list[Any]:
        with self._lock:
            return [c for c in (r() for r in self._clusters.values()) if c is not None]

    # ---- the thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = 0.0
        while not self._stop.is_set():
            for command in _feed.take_commands(self.kdir):
                threading.Thread(
                    target=self._do, args=(command,), name="gpu_notebook-panel-command", daemon=True
                ).start()
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + INTERVAL_S
                try:
                    self.tick()
                except Exception as exc:  # noqa: BLE001 - the feed must outlive one bad reading
                    self.last_error = repr(exc)
            self._wake.wait(COMMAND_POLL_S)
            self._wake.clear()

    def tick(self) -> None:
        watched = _feed.watched_within(self.root, WATCH_S)
        secrets = _feed.env_secrets()
        for cluster in self.clusters():
            self._write(cluster, watched, secrets)
        self.ticks += 1

    def _write(self, cluster: Any, watched: bool, secrets: list[str]) -> None:
        card = _card.card(cluster, self.kernel)
        name = cluster.name
        path, series_path, watch_path = _feed.cluster_files(self.kdir, name)
        # the series (the bulk of the feed) only while a dashboard pane asks for this cluster's
        charted = watched and cluster.running and _feed.touched_within(watch_path, WATCH_S)
        if not charted and name in self._charted:
            self._charted.discard(name)
            _feed.unlink(series_path)  # a pane opened later never sees an old series, only "none yet"
        if not watched and self._cards.get(name) == card:
            return  # nobody looks and nothing changed: no write
        data: dict[str, Any] = {"card": card, "live": {"t": time.time(), "state": cluster.state}}
        if watched and cluster.running:
            self._ensure_monitor(cluster)
            meter = self._meter(cluster)
            data["live"] = _card.live(cluster, meter)
            data["live"]["problem"] = self.last_error
            if charted:
                series = _card.series(cluster, meter)
                series["updated"] = data["live"].get("t")
                _feed.write_json(series_path, _feed.clean(series, secrets))
                self._charted.add(name)
        _feed.write_json(path, _feed.clean(data, secrets))
        self._cards[name] = card

    def _ensure_monitor(self, cluster: Any) -> None:
        """Start the cluster's shared monitor once, off this thread (a start takes seconds on a cloud cluster)."""
        if running_monitor(cluster) is not None or cluster in self._monitor_tried:
            return
        self._monitor_tried.add(cluster)

        def start() -> None:
            try:
                monitor_for(cluster)
            except Exception as exc:  # noqa: BLE001 - no monitor: the row shows no utilisation
                self.last_error = f"monitor: {exc}"

        threading.Thread(target=start, name="gpu_notebook-panel-monitor", daemon=True).start()

    def _meter(self, cluster: Any) -> Any:
        try:
            meter = _card.cost_meter(cluster)
            now = time.monotonic()
            if now - self._cost_polled.get(cluster.name, 0.0) >= COST_POLL_S:
                self._cost_polled[cluster.name] = now
                meter.poll()
            return meter
        except Exception:  # noqa: BLE001 - no Ray to ask: no cost figures
            return None

    # ---- commands from the panel ------------------------------------------------------------------------------
    def _do(self, command: dict[str, Any]) -> None:
        cid = str(command.get("id", ""))
        try:
            ok, message = self._carry_out(command)
        except Exception as exc:  # noqa: BLE001 - the panel shows what went wrong, the kernel goes on
            ok, message = False, str(exc) or type(exc).__name__
        _feed.write_reply(self.kdir, cid, ok, message)
        self._wake.set()

    def _carry_out(self, command: dict[str, Any]) -> tuple[bool, str]:
        name = str(command.get("cluster", ""))
        with self._lock:
            ref = self._clusters.get(name)
        cluster = ref() if ref is not None else None
        if cluster is None:
            return False, f"cluster {name!r} is no longer running in this kernel"
        action = command.get("action")
        if action == "stop":
            return True, cluster.stop(STOP_REASON)
        if action == "scale":
            workers = command.get("workers")
            if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
                return False, f"scale needs a whole number of workers, at least 1 (got {workers!r})"
            return True, cluster.scale(workers)
        return False, f"unknown action {action!r}: the panel can stop or scale a cluster"

    def close(self) -> None:
        """Stop the thread and remove this kernel's files, but for the cards of clusters handed to the reaper."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            kept = set(self._kept)
        keep = {_feed.KERNEL_FILE, *(_feed.cluster_file(self.kdir, n).name for n in kept)}
        for path in self.kdir.glob("*"):  # cards, series and watch marks (commands/ and replies/ are folders)
            if path.name not in keep and path.is_file():
                _feed.unlink(path)
        if not kept:
            _feed.remove_kernel_dir(self.kdir)


def _on_cluster(event: str, cluster: Any) -> None:
    pub = _registry.panel_publisher.get()
    if event == "added":
        if pub is None:
            pub = start()
        if pub is not None:
            pub.add(cluster)
    elif event == "removed" and pub is not None:
        pub.remove(cluster)


def start(root: Path | None = None) -> Publisher | None:
    """This kernel's publisher, started on first use; None outside a Jupyter kernel or with the panel off."""
    with _registry.panel_publisher.lock:
        pub = _registry.panel_publisher.get()
        if pub is not None:
            return pub  # type: ignore[no-any-return]
        if not _settings.panel_enabled():
            return None
        kernel = _card.kernel_identity()
        if kernel is None:
            return None
        try:
            pub = Publisher(kernel, root or _feed.feed_root())
        except OSError:  # a read-only runtime dir: no panel, no failure
            return None
        _registry.panel_publisher.set(pub)
        _registry.stop_at_exit(pub, Publisher.close)
        return pub


def listen() -> None:
    """Hear of every cluster this kernel adds or removes (once)."""
    listeners = _registry.get_manager().listeners
    if _on_cluster not in listeners:
        listeners.append(_on_cluster)
