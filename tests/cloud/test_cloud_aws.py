"""The AWS path against moto's EC2 server on loopback: Ray's real node provider, launcher and teardown.

Nothing here reaches AWS: :class:`~gpu_notebook.testing.cloud.MotoEC2` serves EC2/IAM/STS on 127.0.0.1 and
SSH/rsync/docker commands go to a :class:`~gpu_notebook.testing.cloud.RecordingProcessRunner`.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")

from gpu_notebook.cloud import (  # noqa: E402
    CloudLauncher,
    CloudRequestError,
    ClusterSpec,
    CredentialsError,
    LaunchError,
    check_credentials,
    list_states,
    load_state,
    render_ray_config,
    resolve,
)
from gpu_notebook.cloud import _ray_compat as rc  # noqa: E402
from gpu_notebook.cloud._render import OWNER_TAG, WORKER_ONDEMAND_TYPE, WORKER_SPOT_TYPE  # noqa: E402
from gpu_notebook.cloud._verify import aws_leftovers  # noqa: E402
from gpu_notebook.testing.cloud import MotoEC2, RecordingProcessRunner  # noqa: E402

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_ec2():
    with MotoEC2(REGION) as server:
        yield server


@pytest.fixture
def aws(moto_ec2, tmp_path, monkeypatch):
    """The fake AWS account (shared by the module: every test uses its own cluster name), a private HOME
    (Ray writes ~/.ssh keys there) and config folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path / "cfg"))
    (tmp_path / "home").mkdir()
    with rc.fast_launcher():
        yield moto_ec2


def _spec(**kw):
    base = dict(
        cloud="aws",
        region=REGION,
        gpu="A100:8",
        workers=2,
        spot=True,
        idle_stop_minutes=60,
        name="gnb-moto",
        pip_packages=["torch==2.13.0"],
        image="rayproject/ray:2.60.0-py311-gpu",
        connect="direct",
    )
    base.update(kw)
    return ClusterSpec(**base)


def _instances(ec2, name=None):
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]
    if name:
        filters.append({"Name": "tag:ray-cluster-name", "Values": [name]})
    out = []
    for res in ec2.describe_instances(Filters=filters)["Reservations"]:
        out.extend(res["Instances"])
    return out


def _tags(inst):
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def test_moto_server_is_on_loopback_with_fake_credentials(aws):
    assert aws.endpoint.startswith("http://127.0.0.1:")
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
    ec2 = aws.client()
    (inst,) = ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "gnb-raw"}]}
        ],
    )["Instances"]
    assert [i["InstanceId"] for i in _instances(ec2, "gnb-raw")] == [inst["InstanceId"]]
    assert aws_leftovers("gnb-raw", REGION)[0]["id"] == inst["InstanceId"]
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    assert _instances(ec2, "gnb-raw") == []


def test_node_provider_spot_and_on_demand_create_list_terminate(aws):
    spec = _spec()
    config = rc.bootstrap_config(render_ray_config(spec, resolve(spec)))
    provider = rc.get_node_provider(config["provider"], spec.name)
    types = config["available_node_types"]
    base_tags = {"ray-node-type": "worker", "ray-node-status": "uninitialized"}
    # one node per call: Ray asks for MinCount=1, MaxCount=n and moto launches MinCount
    for _ in range(2):
        provider.create_node(
            types[WORKER_SPOT_TYPE]["node_config"], {**base_tags, "ray-user-node-type": WORKER_SPOT_TYPE}, 1
        )
    provider.create_node(
        types[WORKER_ONDEMAND_TYPE]["node_config"],
        {**base_tags, "ray-user-node-type": WORKER_ONDEMAND_TYPE},
        1,
    )

    ec2 = aws.client()
    insts = _instances(ec2, spec.name)
    assert len(insts) == 3
    spot = [i for i in insts if i.get("InstanceLifecycle") == "spot"]
    on_demand = [i for i in insts if i.get("InstanceLifecycle") != "spot"]
    assert len(spot) == 2 and len(on_demand) == 1
    for inst in insts:
        tags = _tags(inst)
        assert inst["InstanceType"] == "p4d.24xlarge"
        assert tags["ray-cluster-name"] == spec.name
        assert tags[OWNER_TAG] == spec.name
        assert tags["ray-node-type"] == "worker"
    assert {_tags(i)["ray-user-node-type"] for i in spot} == {WORKER_SPOT_TYPE}

    listed = provider.non_terminated_nodes({"ray-node-type": "worker"})
    assert sorted(listed) == sorted(i["InstanceId"] for i in insts)
    assert len(provider.non_terminated_nodes({"ray-user-node-type": WORKER_SPOT_TYPE})) == 2

    # "workers joining" counts workers the head's autoscaler marked up-to-date
    from gpu_notebook.cloud._progress import Stages

    ec2.create_tags(Resources=listed[:2], Tags=[{"Key": "ray-node-status", "Value": "up-to-date"}])
    seen = []
    assert CloudLauncher()._wait_workers(config, 2, 5.0, 0.0, Stages(seen.append)) == 2
    assert seen[-1].endswith("workers joining: 2/2 up")
    assert CloudLauncher()._wait_workers(config, 4, 0.01, 0.0, Stages(seen.append)) == 2
    assert "only 2/4 up" in seen[-1] and "monitor" in seen[-1]

    provider.terminate_nodes(listed)
    assert _instances(ec2, spec.name) == []
    assert [x for x in aws_leftovers(spec.name, REGION) if x["kind"] == "instance"] == []


def test_cache_stopped_nodes_false_terminates_instead_of_stopping(aws):
    spec = _spec(spot=False)
    config = rc.bootstrap_config(render_ray_config(spec, resolve(spec)))
    assert config["provider"]["cache_stopped_nodes"] is False
    provider = rc.get_node_provider(config["provider"], spec.name)
    node_config = config["available_node_types"]["ray.worker.gpu"]["node_config"]
    assert "InstanceMarketOptions" not in node_config
    provider.create_node(node_config, {"ray-node-type": "worker"}, 1)
    (node,) = provider.non_terminated_nodes({})
    provider.terminate_node(node)
    state = aws.client().describe_instances(InstanceIds=[node])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] in ("terminated", "shutting-down")  # not "stopped": a stopped node bills its disk


def test_launch_and_teardown_end_to_end_with_recorded_ssh(aws, capsys, tmp_path):
    from gpu_notebook.testing.cloud import write_fake_ssh

    rec = RecordingProcessRunner()
    ssh_log = tmp_path / "tunnel_args"
    launcher = CloudLauncher(check_tools=False, ssh=write_fake_ssh(tmp_path / "fake_ssh", ssh_log))
    spec = _spec(connect="tunnel")
    with rc.substitute_process_runner(rec):
        state = launcher.launch(spec, progress=print, wait_for_workers_s=0)
    console = capsys.readouterr()
    stages = [ln for ln in console.out.splitlines() if ln.startswith("[")]
    # Ray's launcher chatter goes to the log next to the state; the console shows only our stages
    assert "Useful commands" not in console.out + console.err
    assert "Useful commands" in state.path.with_suffix(".log").read_text()

    # the head exists in the fake cloud, tagged, on demand, with the address saved
    ec2 = aws.client()
    (head,) = _instances(ec2, spec.name)
    assert _tags(head)["ray-node-type"] == "head"
    assert head["InstanceType"] == "m5.xlarge" and head.get("InstanceLifecycle") != "spot"
    assert state.status == "running"
    assert (state.gpus_per_node, state.world_size) == (8, 16)
    assert state.head_ip == head["PublicIpAddress"]
    assert state.address == f"{head['PublicIpAddress']}:6379"
    # the notebook reaches Ray Client through an SSH tunnel with the key Ray created
    assert state.client_address.startswith("ray://127.0.0.1:") and state.tunnel_pid
    tunnel = ssh_log.read_text()
    assert f"ubuntu@{head['PublicIpAddress']}" in tunnel and ":localhost:10001" in tunnel
    assert "/.ssh/ray-autoscaler" in tunnel and state.ssh_key in tunnel

    # progress stages in order
    names = [s.split("] ", 1)[1] for s in stages]
    order = [
        "checking credentials",
        "launching head",
        "waiting for SSH",
        "installing",
        "starting Ray",
        "head ready",
        "opening an SSH tunnel to the head's Ray Client port",
        "workers joining",
        "ready",
    ]
    positions = [names.index(n) for n in order]
    assert positions == sorted(positions), names

    # the commands the launcher ran over SSH, on the head's IP
    cmds = rec.commands
    ip = head["PublicIpAddress"]
    assert all(ip in c for c in cmds if c.startswith("ssh "))
    assert rec.matching(r"uptime"), "waits for SSH with `uptime`"
    assert rec.matching(r"docker pull rayproject/ray:2\.60\.0-py311-gpu")
    (docker_run,) = rec.matching(r"docker run .*--net=host.*rayproject/ray:2\.60\.0-py311-gpu")
    assert "--gpus" not in docker_run and "--runtime=nvidia" not in docker_run  # the head is a CPU node
    assert rec.matching(r"pip install -q -U torch==2\.13\.0")
    # our own package is this kernel's copy, sent with the launch (never fetched from an index by name)
    assert not rec.matching(r"gpu_notebook==")
    # the sdist's folder rsynced to the host (its contents: both paths end in "/"), that folder mounted into the
    # container at ~ (/home/ray), the sdist installed from it
    folder = r"gpu_notebook_dist/[0-9a-f]{16}"
    sdist = rf"{folder}/gpu_notebook-0\.1\.0\.tar\.gz"
    local = r"\S+/0\.1\.0-[0-9a-f]{16}/sdist/"
    assert rec.matching(rf"^rsync .* -avz {local} \S+:/tmp/ray_tmp_mount/gnb-moto/~/{folder}/$")
    assert rec.matching(rf"docker run .*-v /tmp/ray_tmp_mount/gnb-moto/~/{folder}:/home/ray/{folder} ")
    assert rec.matching(
        rf"pip install -q --force-reinstall --no-deps /home/ray/{sdist} && pip install -q /home/ray/{sdist}"
    )
    assert rec.matching(r"ray start --head --port=6379 .*--ray-client-server-port=10001")
    assert rec.matching(r"python -m gpu_notebook\.cloud\._idle_watch --minutes 60 ")
    assert rec.matching(r"^rsync .*ray_bootstrap_config\.yaml")
    installs = [i for i, c in enumerate(cmds) if "gpu_notebook_dist" in c and "pip install" in c]
    starts = [i for i, c in enumerate(cmds) if "ray start --head" in c]
    assert installs[0] < starts[0]

    # status asks the EC2 API what runs under the cluster's tag
    status = launcher.status(spec.name)
    assert [n["id"] for n in status["nodes"] if n["kind"] == "instance"] == [head["InstanceId"]]

    # state survives a "kernel restart": read back from disk, without credentials
    saved = load_state(spec.name)
    assert saved.head_ip == state.head_ip and saved.status == "running"
    raw = saved.path.read_text()
    assert "testing" not in raw and "aws_secret_access_key" not in raw
    assert oct(saved.path.stat().st_mode & 0o777) == "0o600"
    assert [s.name for s in list_states()] == [spec.name]

    assert json.loads(raw)["config"]["cluster_name"] == spec.name

    # teardown by name from a fresh launcher (a new kernel), verified through the EC2 API
    rec2 = RecordingProcessRunner()
    with rc.substitute_process_runner(rec2):
        report = CloudLauncher(check_tools=False).teardown(spec.name, poll_s=0.05)
    assert report.clean, report.message()
    import os as _os

    for _ in range(100):  # the tunnel was ended
        try:
            _os.waitpid(state.tunnel_pid, _os.WNOHANG)
            _os.kill(state.tunnel_pid, 0)
        except (ProcessLookupError, ChildProcessError):
            break
        __import__("time").sleep(0.05)
    else:
        raise AssertionError("tunnel still running after teardown")
    assert [i["kind"] for i in report.found_before].count("instance") == 1
    assert "nothing tagged ray-cluster-name=gnb-moto is left" in report.message()
    assert rec2.matching(r"ray stop")
    assert _instances(ec2, spec.name) == []
    assert aws_leftovers(spec.name, REGION) == []
    assert list_states() == []


def test_failed_start_cleans_up_what_it_created(aws):
    rec = RecordingProcessRunner(fail_on=r"ray start --head")
    launcher = CloudLauncher(check_tools=False)
    spec = _spec(name="gnb-fail")
    with rc.substitute_process_runner(rec), pytest.raises(LaunchError) as err:
        launcher.launch(spec, wait_for_workers_s=0)
    report = err.value.teardown
    assert report is not None and report.clean
    assert [i["kind"] for i in report.found_before].count("instance") == 1  # the head had been created...
    assert _instances(aws.client(), "gnb-fail") == []  # ...and is gone
    assert "Cleanup:" in str(err.value) and "nothing tagged" in str(err.value)
    assert "Launcher log:" in str(err.value) and "  | " in str(err.value)  # the log's tail is quoted
    assert list_states() == []


class _HTTP:
    status_code = 200
    headers: dict = {}


@pytest.fixture
def default_session_hooks():
    """Register botocore hooks on boto3's default session (which Ray's AWS provider uses); undone after."""
    import boto3

    boto3.setup_default_session()
    rc.clear_provider_cache()
    yield boto3.DEFAULT_SESSION.events
    boto3.DEFAULT_SESSION = None
    rc.clear_provider_cache()


def test_quota_too_low_is_refused_before_launch_with_alternatives(aws, default_session_hooks):
    asked = []

    def quota(params, **kwargs):  # the Service Quotas API answering "32 vCPUs of P spot"
        code = json.loads(params["body"])["QuotaCode"]
        asked.append(code)
        return _HTTP(), {"Quota": {"QuotaCode": code, "Value": 32.0}}

    default_session_hooks.register("before-call.service-quotas.GetServiceQuota", quota)
    rec = RecordingProcessRunner()
    with rc.substitute_process_runner(rec), pytest.raises(CloudRequestError) as err:
        CloudLauncher(check_tools=False).launch(_spec(name="gnb-quota"), wait_for_workers_s=0)
    msg = str(err.value)
    assert asked == ["L-7212CCBC"]  # spot P-instance vCPUs
    assert "needs 192 vCPUs" in msg and "allows 32" in msg and "Nothing was launched" in msg
    assert "Alternatives:" in msg and "p4d.24xlarge in " in msg and "servicequotas" in msg
    assert "us-east-1 ($" not in msg  # alternatives are OTHER regions
    assert rec.commands == []
    assert _instances(aws.client(), "gnb-quota") == []
    assert list_states() == []


def test_capacity_error_from_the_api_during_launch(aws, default_session_hooks):
    from botocore.exceptions import ClientError

    def refuse(params, **kwargs):
        raise ClientError(
            {
                "Error": {
                    "Code": "InsufficientInstanceCapacity",
                    "Message": "We currently do not have sufficient capacity",
                }
            },
            "RunInstances",
        )

    default_session_hooks.register("provide-client-params.ec2.RunInstances", refuse)
    rec = RecordingProcessRunner()
    with rc.substitute_process_runner(rec), pytest.raises(LaunchError) as err:
        CloudLauncher(check_tools=False).launch(_spec(name="gnb-cap"), wait_for_workers_s=0)
    msg = str(err.value)
    assert "InsufficientInstanceCapacity" in msg
    assert "no capacity or quota" in msg and "Alternatives:" in msg and "--spot off" in msg
    assert err.value.teardown is not None and err.value.teardown.clean
    assert rec.commands == []  # nothing came up, so nothing was run over SSH
    assert _instances(aws.client(), "gnb-cap") == []
    assert list_states() == []


def test_credentials_check_reads_the_chain_and_never_prints_secrets(aws, monkeypatch):
    info = check_credentials("aws", REGION, tools=False)
    assert "account 123456789012" in str(info)
    assert "testing" not in str(info)

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-never-shown")
    import boto3
    from botocore.exceptions import ClientError

    def expired(params, **kwargs):
        raise ClientError(
            {
                "Error": {
                    "Code": "ExpiredToken",
                    "Message": "The security token included in the request is expired",
                }
            },
            "GetCallerIdentity",
        )

    boto3.setup_default_session()
    try:
        session_cls = boto3.session.Session
        orig_init = session_cls.__init__

        def init(self, *a, **k):
            orig_init(self, *a, **k)
            self.events.register("provide-client-params.sts.GetCallerIdentity", expired)

        monkeypatch.setattr(session_cls, "__init__", init)
        with pytest.raises(CredentialsError) as err:
            check_credentials("aws", REGION, tools=False)
        assert "expired" in str(err.value) and "ExpiredToken" in str(err.value)
        assert "s3cr3t" not in str(err.value)
    finally:
        boto3.DEFAULT_SESSION = None


def test_missing_credentials_stop_the_launch_before_anything_exists(aws, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    rec = RecordingProcessRunner()
    with rc.substitute_process_runner(rec), pytest.raises(CredentialsError) as err:
        CloudLauncher(check_tools=False).launch(_spec(name="gnb-nocreds"), wait_for_workers_s=0)
    assert "no credentials found" in str(err.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert _instances(aws.client(), "gnb-nocreds") == []
    assert list_states() == []


def test_missing_ssh_tools_are_reported(aws, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh, no rsync
    with pytest.raises(CredentialsError) as err:
        check_credentials("aws", REGION, verify=False)
    assert "ssh" in str(err.value) and "rsync" in str(err.value)
