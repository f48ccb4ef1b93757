"""What the JupyterLab panel's feed costs in CPU: in the kernel (the publisher thread) and in the Jupyter server (the
server extension answering the panel's polls), with two clusters open, next to the monitor alone.

This process plays the kernel: a local Ray with two clusters (``a`` and ``b``, one light worker each), each with
its shared monitor sampling (what ``%gpu_monitor`` runs; the panel adds no sampler of its own). A real
``jupyter server`` with the panel's server extension reads the same feed folder. The front end is played by a
client that polls as the built extension does while a person looks: ``GET clusters`` once a second (the sidebar
and the status item) and each cluster's ``series`` once a second (two dashboard panes open).

Phases, alternated ``--rounds`` times, each ``--seconds`` long:

- **monitor alone**: the two monitors, no publisher, nobody polling;
- **panel, nobody looking**: the publisher too, the server up, no poll (it then writes a card only when it changes);
- **panel, looked at**: the publisher refreshing both clusters' files every second and the client polling.

CPU is read from ``/proc`` (user + system time): the publisher's own thread, this whole process, and the server
process. Targets: the feed under 0.5% of a core in the kernel and under 1% in the server.

Run: ``python benchmarks/panel_feed.py [--seconds 20] [--rounds 2]`` (about 3 minutes on 2 cores at the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(stat_path: str) -> float:
    """utime + stime of a process or thread, in seconds, from its /proc stat file."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A real ``jupyter server`` with the panel's extension, on the feed folder under ``runtime``."""

    def __init__(self, runtime: Path, log: Path) -> None:
        self.port, self.token = _free_port(), secrets.token_hex(16)
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime))
        self._log = open(log, "w")  # noqa: SIM115 - open for the server's life
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                "server",
                "--no-browser",
                "--ip=127.0.0.1",
                f"--port={self.port}",
                f"--IdentityProvider.token={self.token}",
                "--ServerApp.port_retries=0",
                "--ServerApp.jpserver_extensions={'gpu_notebook.labpanel': True}",
                *(["--allow-root"] if os.geteuid() == 0 else []),
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=str(runtime),
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                self.get("api/status")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"jupyter server did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.5)

    def get(self, path: str) -> object:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path}", headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)

    def cpu_s(self) -> float:
        return _cpu_s(f"/proc/{self.proc.pid}/stat")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


class Looker(threading.Thread):
    """Polls as the front end does while a person looks: the list, and both clusters' series, once a second."""

    def __init__(self, server: Server, kernel_id: str, names: list[str]) -> None:
        super().__init__(daemon=True, name="bench-looker")
        self.server, self.kernel_id, self.names = server, kernel_id, names
        self.stop = threading.Event()
        self.polls = 0
        self.entries: list[dict] = []
        self.series_points = 0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            listed = self.server.get("gpu-notebook/api/clusters")
            self.entries = list(listed["clusters"])  # type: ignore[index]
            for name in self.names:
                s = self.server.get(
                    f"gpu-notebook/api/clusters/{self.kernel_id}/{quote(name, safe='')}/series"
                )
                t = (s or {}).get("t")  # type: ignore[union-attr]
                self.series_points = max(self.series_points, len(t) if isinstance(t, list) else 0)
            self.polls += 1
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--rounds", type=int, default=2, help="how many times the three phases alternate")
    args = ap.parse_args()

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from gpu_notebook import _feed
    from gpu_notebook.cluster import Cluster
    from gpu_notebook.monitor import monitor_for
    from gpu_notebook.panel import _publisher

    tmp = Path(tempfile.mkdtemp(prefix="gnb-panel-bench-"))
    runtime = tmp / "runtime"
    runtime.mkdir()
    root = _feed.feed_root(runtime)
    print(f"machine: {os.cpu_count()} CPUs; phases of {args.seconds:g} s, {args.rounds} rounds", flush=True)
    t0 = time.monotonic()
    clusters = [
        Cluster("a", address="local", workers=1, cpus_per_worker=0.25).start(),
        Cluster("b", workers=1, cpus_per_worker=0.25).start(),
    ]
    for c in clusters:
        monitor_for(c)
    print(f"two clusters and their monitors up in {time.monotonic() - t0:.0f} s", flush=True)
    server = Server(runtime, tmp / "server.log")
    kernel = _feed.kernel_record("bench-" + secrets.token_hex(4))
    kernel["session"] = "bench.ipynb"
    results: dict[str, dict[str, list[float]]] = {}
    pub = None
    looker: Looker | None = None
    try:
        for _ in range(args.rounds):
            for phase in ("monitor alone", "panel, nobody looking", "panel, looked at"):
                if phase == "monitor alone" and pub is not None:
                    pub.close()
                    pub = None
                if phase != "monitor alone" and pub is None:
                    pub = _publisher.Publisher(kernel, root)
                    for c in clusters:
                        pub.add(c)
                if phase == "panel, looked at":
                    looker = Looker(server, kernel["kernel_id"], [c.name for c in clusters])
                    looker.start()
                time.sleep(2.0)  # let the phase settle (a first refresh, a first poll)
                thread = pub._thread.native_id if pub is not None else None  # noqa: SLF001
                p0, s0 = _cpu_s("/proc/self/stat"), server.cpu_s()
                th0 = _cpu_s(f"/proc/self/task/{thread}/stat") if thread else 0.0
                w0 = time.monotonic()
                time.sleep(args.seconds)
                wall = time.monotonic() - w0
                row = results.setdefault(phase, {"kernel": [], "publisher": [], "server": []})
                row["kernel"].append(100 * (_cpu_s("/proc/self/stat") - p0) / wall)
                row["server"].append(100 * (server.cpu_s() - s0) / wall)
                th1 = _cpu_s(f"/proc/self/task/{thread}/stat") if thread else 0.0
                row["publisher"].append(100 * (th1 - th0) / wall)
                if looker is not None:
                    looker.stop.set()
                    looker.join(10)
                    assert looker.entries and looker.series_points, "the server served no feed"
                    got = {e["name"] for e in looker.entries}
                    assert got == {"a", "b"}, f"the server listed {got}"
                    print(
                        f"  the looker polled {looker.polls} times; series of {looker.series_points} points"
                    )
                    looker = None
                print(f"  {phase}: " + ", ".join(f"{k} {v[-1]:.2f}%" for k, v in row.items()), flush=True)
    finally:
        if pub is not None:
            pub.close()
        server.close()
        for c in clusters:
            c.stop("benchmark over")

    def med(phase: str, key: str) -> float:
        return statistics.median(results[phase][key])

    alone_k, alone_s = med("monitor alone", "kernel"), med("monitor alone", "server")
    print()
    print("CPU in % of one core, median of the rounds (the process columns include Ray's driver threads)")
    print()
    print("| phase | publisher thread | whole kernel process | over monitor alone | Jupyter server |")
    print("| --- | --- | --- | --- | --- |")
    for phase in results:
        k = med(phase, "kernel")
        print(
            f"| {phase} | {med(phase, 'publisher'):.2f} | {k:.2f} | {k - alone_k:+.2f} | "
            f"{med(phase, 'server'):.2f} |"
        )
    looked_s = med("panel, looked at", "server") - alone_s
    print()
    print(
        f"feed, looked at: kernel {med('panel, looked at', 'publisher'):.2f}% of a core (publisher thread; target "
        f"< 0.5%), server {looked_s:.2f}% over its idle (target < 1%)"
    )


if __name__ == "__main__":
    main()
