"""Cloud cluster state on disk, so ``stop``, ``status`` and ``list`` work after a kernel restart.

One JSON file per cluster: ``~/.config/gpu_notebook/clusters/<name>.json`` (the folder is
``$GPU_NOTEBOOK_CONFIG_DIR/clusters`` when that variable is set, else ``$XDG_CONFIG_HOME/gpu_notebook``).
Files are written atomically with mode 0600; credentials that a config may carry are never saved.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpu_notebook import _settings

#: Provider keys that may hold secrets: dropped before a config is written to disk.
_SECRET_KEYS = ("aws_credentials", "gcp_credentials", "azure_credentials", "credentials")


def config_dir() -> Path:
    """The user's gpu_notebook config folder."""
    env = _settings.config_dir()
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "gpu_notebook"


def clusters_dir() -> Path:
    """Where cluster state files live."""
    return config_dir() / "clusters"


def scrub(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of ``config`` without provider credential blocks."""
    if config is None:
        return None
    out = copy.deepcopy(config)
    prov = out.get("provider")
    if isinstance(prov, dict):
        for key in _SECRET_KEYS:
            prov.pop(key, None)
    return out


@dataclass
class ClusterState:
    """What we know about one cloud cluster we launched.

    Attributes
    ----------
    name, cloud, region : str
    status : str
        ``"launching"``, ``"running"``, ``"failed"``, ``"stopping"`` or ``"stopped"``.
    spec : dict
        The :class:`~gpu_notebook.cloud.ClusterSpec` as a dict.
    config : dict
        The rendered Ray config (or KubeRay manifest) used for launch and teardown.
    head_ip : str, optional
    address : str, optional
        The Ray GCS address ``<head_ip>:6379`` (for a notebook inside the cluster's network).
    client_address : str, optional
        ``ray://...:10001`` (Ray Client; through an SSH tunnel from outside).
    created_at : float
    hourly_usd : float, optional
        Estimated cost per hour of the launched nodes.
    gpus_per_node, world_size : int
        GPUs per worker node, and ranks for one rank per GPU (``workers * gpus_per_node``).
    events : list of dict
        Progress stages with elapsed seconds.
    """

    name: str
    cloud: str
    region: str | None
    status: str = "launching"
    spec: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    head_ip: str | None = None
    address: str | None = None
    client_address: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    hourly_usd: float | None = None
    tunnel_pid: int | None = None
    ssh_key: str | None = None
    gpus_per_node: int = 0
    world_size: int = 0
    error: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """The state file."""
        return clusters_dir() / f"{self.name}.json"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = scrub(self.config) or {}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterState:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self) -> Path:
        """Write the state file atomically (mode 0600)."""
        self.updated_at = time.time()
        folder = clusters_dir()
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_dict(), f, indent=1, sort_keys=True)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return self.path

    def __repr__(self) -> str:
        where = self.head_ip or "-"
        return f"ClusterState({self.name!r}, {self.cloud}/{self.region}, {self.status}, head={where})"

    def _repr_html_(self) -> str:
        from html import escape

        rows = [
            ("name", self.name),
            ("cloud", f"{self.cloud} / {self.region}"),
            ("status", self.status),
            ("head", self.head_ip or "-"),
            ("address", self.client_address or self.address or "-"),
            ("est. $/h", "-" if self.hourly_usd is None else f"{self.hourly_usd:.2f}"),
            ("created", time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created_at))),
        ]
        body = "".join(
            f"<tr><th style='text-align:left'>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows
        )
        return f"<table>{body}</table>"


def load_state(name: str) -> ClusterState:
    """Read the state of cluster ``name``.

    Raises
    ------
    KeyError
        No state file for ``name``; the message lists the known clusters.
    """
    path = clusters_dir() / f"{name}.json"
    if not path.exists():
        known = [s.name for s in list_states()]
        raise KeyError(f"no saved cloud cluster {name!r}; known: {', '.join(known) or 'none'}")
    return ClusterState.from_dict(json.loads(path.read_text()))


def list_states() -> list[ClusterState]:
    """Every saved cluster, oldest first (unreadable files are skipped)."""
    folder = clusters_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in folder.glob("*.json"):
        try:
            out.append(ClusterState.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda s: s.created_at)


def active_states() -> list[ClusterState]:
    """Saved clusters not yet torn down (what ``%gpu_cluster list`` shows from earlier kernels); never raises."""
    try:
        return [st for st in list_states() if st.status not in ("terminated", "stopped")]
    except Exception:  # noqa: BLE001 - an unreadable config folder must not break list
        return []


def delete_state(name: str) -> bool:
    """Remove the state file of ``name``; True if there was one."""
    path = clusters_dir() / f"{name}.json"
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
