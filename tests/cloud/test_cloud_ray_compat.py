"""Contract tests for the one module that uses Ray's cluster-launcher internals (run them on every Ray upgrade).

Each test names the Ray API it pins, so a failure says exactly what moved.
"""

from __future__ import annotations

import inspect

import pytest

from gpu_notebook import _settings
from gpu_notebook.cloud import _ray_compat as rc

pytest.importorskip("ray")


def test_installed_ray_is_in_the_supported_range():
    assert rc.check_ray_version() == rc.ray_version()


@pytest.mark.parametrize("version", ["2.49.9", "2.70.0", "3.0.0", "1.13.1"])
def test_versions_outside_the_range_are_refused(version, monkeypatch):
    monkeypatch.delenv(_settings.SKIP_RAY_VERSION_CHECK_VAR, raising=False)
    with pytest.raises(rc.RayVersionError, match="outside the range"):
        rc.check_ray_version(version)
    monkeypatch.setenv(_settings.SKIP_RAY_VERSION_CHECK_VAR, "1")
    assert rc.check_ray_version(version) == version


@pytest.mark.parametrize("version", ["2.50.0", "2.60.0", "2.69.3", "2.61.0rc1"])
def test_versions_inside_the_range_pass(version):
    assert rc.check_ray_version(version) == version


def test_sdk_functions_take_the_arguments_we_pass():
    from ray.autoscaler import sdk

    assert "no_config_cache" in inspect.signature(sdk.create_or_update_cluster).parameters
    assert "workers_only" in inspect.signature(sdk.teardown_cluster).parameters
    assert "no_config_cache" in inspect.signature(sdk.bootstrap_config).parameters
    for name in ("get_head_node_ip", "get_worker_node_ips", "register_callback_handler", "configure_logging"):
        assert callable(getattr(sdk, name))
    params = inspect.signature(sdk.configure_logging).parameters
    assert {"log_style", "color_mode", "verbosity"} <= set(params)


def test_event_names_exist():
    from ray.autoscaler._private.event_system import CreateClusterEvent

    for name in rc.EVENT_STAGES:
        assert hasattr(CreateClusterEvent, name), name


def test_launcher_events_reach_listeners_and_stop_after_the_block():
    from ray.autoscaler._private.event_system import CreateClusterEvent, global_event_system

    seen = []
    with rc.launcher_events(lambda name, data: seen.append(name)):
        global_event_system.execute_callback(CreateClusterEvent.acquiring_new_head_node)
        global_event_system.execute_callback(CreateClusterEvent.start_ray_runtime)
    global_event_system.execute_callback(CreateClusterEvent.start_ray_runtime)
    assert seen == ["acquiring_new_head_node", "start_ray_runtime"]


def test_tag_names_match_rays():
    from ray.autoscaler import tags

    assert rc.TAG_CLUSTER_NAME == tags.TAG_RAY_CLUSTER_NAME
    assert rc.TAG_NODE_KIND == tags.TAG_RAY_NODE_KIND
    assert rc.TAG_NODE_STATUS == tags.TAG_RAY_NODE_STATUS


def test_private_seams_exist():
    from ray.autoscaler._private import commands, providers
    from ray.autoscaler._private.aws import config as aws_config
    from ray.autoscaler._private.aws import node_provider as aws_np
    from ray.autoscaler._private.aws import utils as aws_utils
    from ray.autoscaler.node_provider import NodeProvider

    assert isinstance(commands.POLL_INTERVAL, int | float)
    assert "use_cache" in inspect.signature(providers._get_node_provider).parameters
    assert callable(providers._clear_provider_cache)
    assert hasattr(aws_config, "time") and callable(aws_np.list_ec2_instances)
    assert hasattr(aws_utils.resource_cache, "cache_clear") and hasattr(aws_utils.client_cache, "cache_clear")
    params = list(inspect.signature(NodeProvider.get_command_runner).parameters)
    assert params == [
        "self",
        "log_prefix",
        "node_id",
        "auth_config",
        "cluster_name",
        "process_runner",
        "use_internal_ip",
        "docker_config",
    ]


def test_validation_has_teeth():
    """Ray's validation rejects what `ray up` would reject (so passing it means something)."""
    import jsonschema

    good = {
        "cluster_name": "gnb-c",
        "max_workers": 1,
        "provider": {"type": "aws", "region": "us-east-1"},
        "available_node_types": {
            "head": {"resources": {"CPU": 2}, "node_config": {"InstanceType": "m5.large"}},
            "w": {
                "resources": {"CPU": 2},
                "node_config": {"InstanceType": "m5.large"},
                "min_workers": 1,
                "max_workers": 1,
            },
        },
        "head_node_type": "head",
    }
    rc.prepare_and_validate(good)
    with pytest.raises(jsonschema.ValidationError):
        rc.prepare_and_validate({**good, "not_a_ray_key": 1})
    bad_resources = {
        **good,
        "available_node_types": {
            **good["available_node_types"],
            "w": {"resources": {"GPU": 0.5}, "node_config": {}},
        },
    }
    with pytest.raises(jsonschema.ValidationError):
        rc.prepare_and_validate(bad_resources)
    with pytest.raises(ValueError, match="max_workers"):
        rc.prepare_and_validate({**good, "max_workers": 0})


def test_fast_launcher_restores_everything():
    from ray.autoscaler._private import commands
    from ray.autoscaler._private.aws import config as aws_config
    from ray.autoscaler._private.aws import node_provider as aws_np

    before = (commands.POLL_INTERVAL, aws_config.time, aws_np.list_ec2_instances)
    with rc.fast_launcher():
        assert commands.POLL_INTERVAL == 0
        assert aws_config.time is not before[1]
    assert (commands.POLL_INTERVAL, aws_config.time, aws_np.list_ec2_instances) == before


def test_substitute_process_runner_uses_rays_real_command_runner():
    from ray.autoscaler.node_provider import NodeProvider

    from gpu_notebook.testing.cloud import RecordingProcessRunner

    class _Provider(NodeProvider):
        def external_ip(self, node_id):
            return "203.0.113.7"

        def internal_ip(self, node_id):
            return "10.0.0.7"

    rec = RecordingProcessRunner()
    provider = _Provider({}, "gnb-c")
    original = NodeProvider.get_command_runner
    with rc.substitute_process_runner(rec):
        runner = provider.get_command_runner(
            "x", "i-1", {"ssh_user": "ubuntu", "ssh_private_key": "/k.pem"}, "gnb-c", None, False
        )
        runner.run("echo hi")
    assert NodeProvider.get_command_runner is original
    (cmd,) = rec.commands
    assert cmd.startswith("ssh ") and "ubuntu@203.0.113.7" in cmd and "echo hi" in cmd and "-i /k.pem" in cmd
