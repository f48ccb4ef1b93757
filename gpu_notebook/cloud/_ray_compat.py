"""The only module of gpu_notebook that touches Ray's cluster-launcher internals.

Ray's cluster launcher SDK (``ray.autoscaler.sdk``) is a ``DeveloperAPI`` ("experimental, not stable") and the
config validation that ``ray up`` runs lives in ``ray.autoscaler._private``. Every use of those names is kept
here, behind small functions, so a Ray upgrade breaks exactly one file, and ``tests/cloud/test_cloud_ray_compat.py``
(the contract tests) says which name moved.

Nothing here imports Ray at module import time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from gpu_notebook import _registry, _settings
from gpu_notebook.errors import GpuNotebookError

#: Ray versions this module was written and contract-tested against: ``[MIN, MAX)``.
RAY_MIN_VERSION = (2, 50)
RAY_MAX_VERSION = (2, 70)

#: Ray's own tag names (``ray.autoscaler.tags``); every node the launcher creates carries them.
TAG_CLUSTER_NAME = "ray-cluster-name"
TAG_NODE_KIND = "ray-node-type"
TAG_NODE_STATUS = "ray-node-status"


class RayVersionError(GpuNotebookError, RuntimeError):
    """The installed Ray is outside the range the cloud launcher supports."""


def _parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def ray_version() -> str:
    """The installed Ray version (without importing Ray)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise RayVersionError(
            'The cloud launcher needs Ray: pip install "gpu_notebook[ray]" (ray[default]).'
        ) from exc


def check_ray_version(version: str | None = None) -> str:
    """Check that ``version`` (default: the installed Ray) is in the supported range.

    Returns
    -------
    str
        The version checked.

    Raises
    ------
    RayVersionError
        When it is outside ``[RAY_MIN_VERSION, RAY_MAX_VERSION)`` and ``GPU_NOTEBOOK_SKIP_RAY_VERSION_CHECK``
        is not set to ``1``.
    """
    ver = version or ray_version()
    parsed = _parse_version(ver)[:2]
    if RAY_MIN_VERSION <= parsed < RAY_MAX_VERSION:
        return ver
    if _settings.skip_ray_version_check():
        return ver
    lo = ".".join(map(str, RAY_MIN_VERSION))
    hi = ".".join(map(str, RAY_MAX_VERSION))
    raise RayVersionError(
        f"Ray {ver} is outside the range the gpu_notebook cloud launcher is tested with (>={lo}, <{hi}). "
        f'Install a supported Ray (pip install "ray[default]>={lo},<{hi}") or set '
        f"{_settings.SKIP_RAY_VERSION_CHECK_VAR}=1 to try anyway."
    )


# ---------------------------------------------------------------------------------------------------------
# Config validation (what `ray up` runs before touching a cloud)
# ---------------------------------------------------------------------------------------------------------


def prepare_config(config: dict[str, Any]) -> dict[str, Any]:
    """Merge Ray's provider defaults into ``config`` (``ray.autoscaler._private.util.prepare_config``)."""
    import copy
    import logging

    from ray.autoscaler._private.util import prepare_config as _prepare

    log = logging.getLogger("ray.autoscaler._private.util")  # "setting max workers for head node type to 0"
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        return _prepare(copy.deepcopy(config))
    finally:
        log.setLevel(level)


def validate_config(config: dict[str, Any]) -> None:
    """Validate a prepared config against Ray's ``ray-schema.json`` and its extra rules.

    Raises ``jsonschema.ValidationError`` or ``ValueError`` exactly as ``ray up`` would.
    """
    from ray.autoscaler._private.util import validate_config as _validate

    _validate(config)


def prepare_and_validate(config: dict[str, Any]) -> dict[str, Any]:
    """``prepare_config`` then ``validate_config``; returns the prepared config."""
    prepared = prepare_config(config)
    validate_config(prepared)
    return prepared


# ---------------------------------------------------------------------------------------------------------
# The launcher SDK
# ---------------------------------------------------------------------------------------------------------


def _quiet_launcher() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.autoscaler import sdk

    sdk.configure_logging(log_style="record", color_mode="false", verbosity=0)


def create_or_update_cluster(config: dict[str, Any]) -> dict[str, Any]:
    """``ray.autoscaler.sdk.create_or_update_cluster`` without the config cache; returns the bootstrapped config."""
    from ray.autoscaler import sdk

    _quiet_launcher()
    return sdk.create_or_update_cluster(config, no_config_cache=True)


def teardown_cluster(config: dict[str, Any], workers_only: bool = False) -> None:
    """``ray.autoscaler.sdk.teardown_cluster`` (``ray down -y``)."""
    from ray.autoscaler import sdk

    _quiet_launcher()
    sdk.teardown_cluster(config, workers_only=workers_only)


def get_head_node_ip(config: dict[str, Any]) -> str:
    """The head node's IP (external unless ``use_internal_ips``); ``RuntimeError`` when there is none."""
    from ray.autoscaler import sdk

    _quiet_launcher()
    return str(sdk.get_head_node_ip(config))


def get_worker_node_ips(config: dict[str, Any]) -> list[str]:
    """IPs of the cluster's worker nodes."""
    from ray.autoscaler import sdk

    _quiet_launcher()
    return [str(ip) for ip in sdk.get_worker_node_ips(config)]


def launcher_errors() -> tuple[type[BaseException], ...]:
    """Exception types the launcher raises instead of returning (``cli_logger.abort``, ``sys.exit``)."""
    import click

    return (click.exceptions.ClickException, SystemExit)


def bootstrap_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate and fill provider specifics (IAM role, key pair, subnets, security groups) like ``ray up`` does."""
    from ray.autoscaler import sdk

    _quiet_launcher()
    return sdk.bootstrap_config(config, no_config_cache=True)


def get_node_provider(provider_config: dict[str, Any], cluster_name: str) -> Any:
    """An (uncached) Ray ``NodeProvider`` for ``provider_config``: ``non_terminated_nodes``, ``node_tags``..."""
    from ray.autoscaler._private.providers import _get_node_provider

    return _get_node_provider(provider_config, cluster_name, use_cache=False)


def clear_provider_cache() -> None:
    """Forget Ray's per-process cached node providers and (AWS) boto3 resources/clients."""
    from ray.autoscaler._private.providers import _clear_provider_cache

    _clear_provider_cache()
    with contextlib.suppress(ImportError):
        from ray.autoscaler._private.aws import utils as aws_utils

        aws_utils.resource_cache.cache_clear()
        aws_utils.client_cache.cache_clear()


def set_poll_interval(seconds: float) -> float:
    """Set the launcher's poll interval (5 s in Ray) and return the previous value (tests shorten it)."""
    from ray.autoscaler._private import commands

    old = float(commands.POLL_INTERVAL)
    commands.POLL_INTERVAL = seconds  # type: ignore[assignment]
    return old


# ---------------------------------------------------------------------------------------------------------
# Progress events
# ---------------------------------------------------------------------------------------------------------

#: Ray's CreateClusterEvent names, mapped to our stage names.
EVENT_STAGES: dict[str, str] = {
    "up_started": "validating config",
    "cluster_booting_started": "checking for an existing head",
    "acquiring_new_head_node": "launching head",
    "head_node_acquired": "waiting for SSH",
    "ssh_control_acquired": "SSH ready",
    "run_initialization_cmd": "installing",
    "run_setup_cmd": "installing",
    "start_ray_runtime": "starting Ray",
    "start_ray_runtime_completed": "Ray started",
    "cluster_booting_completed": "head ready",
}
# who listens now is kernel state: _registry.launcher_listeners (and whether Ray knows our dispatcher:
# _registry.launcher_hooked)


def _dispatch(event_data: dict[str, Any]) -> None:
    event = event_data.get("event_name")
    name = getattr(event, "name", str(event))
    for fn in _registry.launcher_listeners.items():
        fn(name, event_data)


def _register_once() -> None:
    if _registry.launcher_hooked.get():
        return
    from ray.autoscaler import sdk
    from ray.autoscaler._private.event_system import CreateClusterEvent

    for name in EVENT_STAGES:
        sdk.register_callback_handler(getattr(CreateClusterEvent, name), _dispatch)
    _registry.launcher_hooked.set(True)


@contextlib.contextmanager
def launcher_events(listener: Callable[[str, dict[str, Any]], None]) -> Iterator[None]:
    """Call ``listener(event_name, event_data)`` for each launcher event while the block runs.

    Ray's event system is global and only grows, so one dispatcher per event is registered once and
    listeners are added and removed here.
    """
    _register_once()
    _registry.launcher_listeners.add(listener)
    try:
        yield
    finally:
        _registry.launcher_listeners.remove(listener)


# ---------------------------------------------------------------------------------------------------------
# Test seams (used by tests and by gpu_notebook.testing.cloud; never by a real launch)
# ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def substitute_process_runner(process_runner: Any) -> Iterator[None]:
    """Run every SSH/rsync/docker command of the launcher through ``process_runner`` instead of ``subprocess``.

    Ray's real ``SSHCommandRunner``/``DockerCommandRunner`` still build the commands; only the process
    execution (``check_call``/``check_output``) is replaced, e.g. by a recorder.
    """
    from ray.autoscaler.node_provider import NodeProvider

    original = NodeProvider.get_command_runner

    def get_command_runner(
        self: Any,
        log_prefix: str,
        node_id: str,
        auth_config: dict[str, Any],
        cluster_name: str,
        _process_runner: Any,
        use_internal_ip: bool,
        docker_config: dict[str, Any] | None = None,
    ) -> Any:
        return original(
            self,
            log_prefix,
            node_id,
            auth_config,
            cluster_name,
            process_runner,
            use_internal_ip,
            docker_config,
        )

    NodeProvider.get_command_runner = get_command_runner  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        NodeProvider.get_command_runner = original  # type: ignore[method-assign]


_instance_type_memo: dict[Any, Any] = {}


@contextlib.contextmanager
def fast_launcher() -> Iterator[None]:
    """For tests: no launcher sleeps (5 s polls, 15 s IAM waits), fresh provider/boto3 caches, and Ray's
    ``describe_instance_types`` scan of every EC2 type (seconds against an emulator) done once per process."""
    import types

    from ray.autoscaler._private.aws import config as aws_config
    from ray.autoscaler._private.aws import node_provider as aws_np

    original_list = aws_np.list_ec2_instances

    def list_ec2_instances(region: str, aws_credentials: Any = None) -> Any:
        key = (region, repr(sorted((aws_credentials or {}).items())))
        if key not in _instance_type_memo:
            _instance_type_memo[key] = original_list(region, aws_credentials)
        return _instance_type_memo[key]

    old_poll = set_poll_interval(0.0)
    old_time = aws_config.time
    aws_config.time = types.SimpleNamespace(sleep=lambda s: None, time=old_time.time)  # type: ignore[assignment]
    aws_np.list_ec2_instances = list_ec2_instances
    clear_provider_cache()
    try:
        yield
    finally:
        set_poll_interval(old_poll)
        aws_config.time = old_time  # type: ignore[assignment]
        aws_np.list_ec2_instances = original_list
        clear_provider_cache()
