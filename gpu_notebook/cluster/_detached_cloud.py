"""A detached cloud cluster: what differs from a local or ``--address`` one (see :mod:`._detached`).

- **the start** is refused on Kubernetes (in this version), and on a VM cloud without a guard (``--budget`` or
  ``--idle-stop``): nothing detached may bill with no kernel to stop it;
- **the keeper** lives on the head node (it reads the head's launcher config there): when its guards fire it ends
  the workers and tears the whole cluster down with ``ray down`` from the head's own config
  (``~/ray_bootstrap_config.yaml``, what Ray's launcher leaves on every head), as the head's idle watch does;
- **the reaper** on the laptop is handed over (:func:`gpu_notebook.cloud._reaper.hand_over`): when the kernel
  dies it leaves the cluster to the guards and keeps its saved state for the next kernel;
- **attach by name** finds the cluster in this machine's saved cloud states, and reopens the SSH tunnel to the
  head when the one the gone kernel opened is closed.
"""

from __future__ import annotations

from typing import Any

from gpu_notebook import cloud
from gpu_notebook._display import Progress
from gpu_notebook.cloud import CloudLauncher, _reaper
from gpu_notebook.cluster._errors import ClusterError
from gpu_notebook.cluster.providers.cloud import CloudProvider

__all__ = ["HEAD_CONFIG", "KEEPER_OPTIONS", "check_start", "find", "guards_text", "hand_over", "keeper_info"]

#: where Ray's launcher leaves the cluster's config on the head (what ``ray down`` there needs)
HEAD_CONFIG = "~/ray_bootstrap_config.yaml"
#: the keeper of a cloud cluster runs on the head node: its config is there, and the head is the last to go
KEEPER_OPTIONS: dict[str, Any] = {"resources": {"node:__internal_head__": 0.001}}


def check_start(cloud: str, budget: float | None, idle_stop: float | None) -> None:
    """Refuse a detached cloud start that nothing would stop once its kernel is gone."""
    if cloud == "kubernetes":
        raise ClusterError(
            "--detach is not available on Kubernetes in this version (its guards could not delete the "
            "RayCluster from inside it): start it without --detach, or use a VM cloud (aws, gcp, azure)"
        )
    if not budget and not idle_stop:
        raise ClusterError(
            f"a detached {cloud} cluster keeps billing while no kernel is attached, so it needs a guard: give "
            f"--budget USD and/or --idle-stop MINUTES (they run on the cluster's head, not in this kernel, and "
            f"tear the cluster down when they fire). Nothing was launched."
        )


def guards_text(budget: float | None, idle_stop: float | None) -> str:
    """The guards in words: ``"budget $20, idle stop 30 min"``."""
    parts = [f"budget ${budget:g}"] if budget else []
    parts += [f"idle stop {idle_stop:g} min"] if idle_stop else []
    return ", ".join(parts) or "none"


def keeper_info(cloud: str) -> dict[str, Any]:
    """What the keeper needs to tear the cluster down from the head."""
    return {"cloud": {"cloud": cloud, "head_config": HEAD_CONFIG}}


def hand_over(name: str, guards: str | None, say: Progress) -> None:
    """Tell the reaper (if the kernel has one) to leave the cluster to its guards at the kernel's end
    (``guards`` None: take it back, this kernel tears the cluster down itself now)."""
    if not _reaper.hand_over(name, guards) and guards is not None:
        say(
            f"note: no reaper watches {name} from this machine; its guards on the head still stop it "
            f"({guards})"
        )


def find(name: str, say: Progress) -> tuple[str, CloudProvider] | None:
    """A cloud cluster ``name`` saved on this machine: the address to reach its Ray, and its provider (which
    can tear it down, verified, from here); None when there is no such saved cluster."""
    try:
        state = cloud.load_state(name)
    except KeyError:
        return None
    if state.status in ("stopped", "terminated"):
        return None
    provider = CloudProvider(state.cloud)
    provider.state = state
    return _address(state, say), provider


def _address(state: Any, say: Progress) -> str:
    """The saved address; the SSH tunnel reopened when the one recorded is closed (its kernel is gone)."""
    if state.client_address and state.tunnel_pid and not _alive(int(state.tunnel_pid)):
        say(f"reopening the SSH tunnel to {state.name}'s head ({state.head_ip})")
        try:
            return str(CloudLauncher.open_tunnel(state))
        except Exception as exc:  # noqa: BLE001 - said, with what to do
            raise ClusterError(
                f"could not reopen the SSH tunnel to cloud cluster {state.name!r} ({exc}); check your network "
                f"and SSH key, then attach again"
            ) from None
    address = state.client_address or state.address
    if not address:
        raise ClusterError(f"cloud cluster {state.name!r} has no saved address (its launch did not finish)")
    return str(address)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
