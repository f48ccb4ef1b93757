"""Cloud GPU clusters (AWS, GCP, Azure through Ray's cluster launcher; Kubernetes through KubeRay).

Typical use, what ``%gpu_cluster start --cloud ...`` does::

    from gpu_notebook.cloud import CloudLauncher, ClusterSpec
    spec = ClusterSpec(cloud="aws", region="us-east-1", gpu="A100:8", workers=2, spot=True, idle_stop_minutes=60)
    launcher = CloudLauncher()
    print(launcher.plan(spec).text())          # --dry-run: full config, instances, $/h; launches nothing
    state = launcher.launch(spec, progress=print)
    ...                                        # connect: state.client_address / state.address
    launcher.teardown(state.name)              # terminates everything and verifies via the cloud API

Nothing here imports Ray, boto3 or kubernetes at import time.
"""

from ._credentials import CredentialsError, CredentialsInfo, check_credentials
from ._launcher import CloudLauncher, LaunchError, plan_cluster, spec_from_options
from ._plan import Plan
from ._pricing import CloudNodePricing, node_pricing_for
from ._ray_compat import RayVersionError, check_ray_version
from ._render import render_kuberay_manifest, render_ray_config, to_yaml
from ._spec import CloudRequestError, ClusterSpec, InstanceChoice, Resolved, default_image, resolve
from ._state import (
    ClusterState,
    active_states,
    clusters_dir,
    config_dir,
    delete_state,
    list_states,
    load_state,
)
from ._teardown import TeardownReport

__all__ = [
    "CloudLauncher",
    "CloudNodePricing",
    "CloudRequestError",
    "ClusterSpec",
    "ClusterState",
    "CredentialsError",
    "CredentialsInfo",
    "InstanceChoice",
    "LaunchError",
    "Plan",
    "RayVersionError",
    "Resolved",
    "TeardownReport",
    "check_credentials",
    "check_ray_version",
    "clusters_dir",
    "config_dir",
    "default_image",
    "delete_state",
    "list_states",
    "active_states",
    "load_state",
    "node_pricing_for",
    "plan_cluster",
    "render_kuberay_manifest",
    "render_ray_config",
    "resolve",
    "spec_from_options",
    "to_yaml",
]
