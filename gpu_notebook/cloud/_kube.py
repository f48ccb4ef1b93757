"""Apply, watch and delete a KubeRay ``RayCluster`` through the Kubernetes API.

The ``kubernetes`` package is optional: it is imported only when a manifest is really applied. Every
function takes ``api`` (a ``CustomObjectsApi``-like object) and ``core`` (a ``CoreV1Api``-like object) so
tests can pass fakes; by default they are built from the kube config.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"


def make_clients() -> tuple[Any, Any]:
    """``(CustomObjectsApi, CoreV1Api)`` from the kube config (or the in-cluster service account)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise RuntimeError(
            "applying a RayCluster needs the kubernetes client: pip install kubernetes"
        ) from None
    try:
        config.load_kube_config()
    except (config.ConfigException, OSError):  # no kube config file: try the pod's service account
        config.load_incluster_config()
    return client.CustomObjectsApi(), client.CoreV1Api()


def _status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def apply_raycluster(manifest: dict[str, Any], api: Any) -> str:
    """Create the RayCluster, or replace its spec when one with that name exists; returns ``"created"``/``"updated"``."""
    meta = manifest["metadata"]
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, manifest)
        return "created"
    # the client's ApiException (or a stand-in) carries the HTTP status; every other error is re-raised
    except Exception as exc:  # noqa: BLE001
        if _status_code(exc) != 409:
            raise
    api.patch_namespaced_custom_object(
        GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], {"spec": manifest["spec"]}
    )
    return "updated"


def get_raycluster(name: str, namespace: str, api: Any) -> dict[str, Any] | None:
    """The RayCluster object, or None when it does not exist."""
    try:
        return dict(api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    # the client's ApiException (or a stand-in) carries the HTTP status; every other error is re-raised
    except Exception as exc:  # noqa: BLE001
        if _status_code(exc) == 404:
            return None
        raise


def cluster_pods(name: str, namespace: str, core: Any) -> list[str]:
    """Names of the pods KubeRay runs for cluster ``name`` (label ``ray.io/cluster``)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={name}")
    return [p.metadata.name for p in getattr(pods, "items", [])]


def wait_head_ready(
    name: str,
    namespace: str,
    api: Any,
    timeout_s: float = 900.0,
    poll_s: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Poll the RayCluster's ``status`` until KubeRay reports it ready (``state: ready`` or ``HeadPodReady``)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        obj = get_raycluster(name, namespace, api) or {}
        status = obj.get("status") or {}
        state = status.get("state")
        conds = {c.get("type"): c.get("status") for c in status.get("conditions", []) or []}
        if state != last and progress:
            progress(f"RayCluster state: {state or 'pending'}")
        last = state
        if state == "ready" or conds.get("HeadPodReady") == "True":
            return status
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"RayCluster {namespace}/{name} not ready after {timeout_s:.0f} s (state {state})"
            )
        time.sleep(poll_s)


def delete_raycluster(name: str, namespace: str, api: Any) -> bool:
    """Delete the RayCluster (KubeRay deletes its pods); False if it was already gone."""
    try:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return True
    # the client's ApiException (or a stand-in) carries the HTTP status; every other error is re-raised
    except Exception as exc:  # noqa: BLE001
        if _status_code(exc) == 404:
            return False
        raise


def head_service_address(name: str, namespace: str) -> str:
    """In-cluster Ray Client address of the head service KubeRay creates (``<name>-head-svc``)."""
    return f"ray://{name}-head-svc.{namespace}.svc.cluster.local:10001"
