"""Spot preemption notices: the fake metadata services (checked against each cloud's documented behaviour), the
watcher, and the checkpointer saving at once on a notice (alone, and agreed across real gloo ranks)."""

from __future__ import annotations

import email.utils
import json
import os
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
import torch
from _poll import wait_for

from gpu_notebook.checkpoint import Checkpointer
from gpu_notebook.checkpoint._preemption import (
    PreemptionNotice,
    PreemptionWatcher,
    detect_cloud,
    poll_once,
)
from gpu_notebook.testing.cloud_metadata import FakeMetadataServer

pytestmark = pytest.mark.timeout(120)


def _req(
    url: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    r = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(r, timeout=5) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()


# ------------------------------------------------------------------------------------------- the fakes
def test_fake_aws_requires_imdsv2_tokens_and_announces_the_interruption() -> None:
    with FakeMetadataServer("aws") as md:
        action = f"{md.url}/latest/meta-data/spot/instance-action"
        assert _req(action)[0] == 401  # IMDSv2 required: no token, no answer
        assert _req(f"{md.url}/latest/api/token", method="PUT")[0] == 400  # the TTL header is mandatory
        assert (
            _req(f"{md.url}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "0"}, "PUT")[0] == 400
        )
        code, _, token = _req(
            f"{md.url}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "PUT"
        )
        assert code == 200 and len(token) > 20
        auth = {"X-aws-ec2-metadata-token": token.decode()}
        assert _req(action, {"X-aws-ec2-metadata-token": "forged"})[0] == 401
        assert _req(action, auth)[0] == 404  # no interruption scheduled
        md.preempt(in_s=120, action="stop")
        code, _, body = _req(action, auth)
        doc = json.loads(body)
        assert code == 200 and doc["action"] == "stop"
        at = datetime.fromisoformat(doc["time"].replace("Z", "+00:00")).timestamp()
        assert abs(at - (time.time() + 120)) < 3 and doc["time"].endswith("Z")
        md.clear()
        assert _req(action, auth)[0] == 404
        md.preempt(in_s=120, after_s=0.5)  # a notice that shows up later
        assert _req(action, auth)[0] == 404
        wait_for(lambda: _req(action, auth)[0] == 200, what="the later notice")


def test_fake_gcp_needs_the_flavor_header_and_flips_preempted() -> None:
    with FakeMetadataServer("gcp") as md:
        url = f"{md.url}/computeMetadata/v1/instance/preempted"
        assert _req(url)[0] == 403
        assert _req(url, {"Metadata-Flavor": "Google", "X-Forwarded-For": "10.0.0.1"})[0] == 403
        code, headers, body = _req(url, {"Metadata-Flavor": "Google"})
        assert code == 200 and body == b"FALSE" and headers.get("Metadata-Flavor") == "Google"
        md.preempt()
        assert _req(url, {"Metadata-Flavor": "Google"})[2] == b"TRUE"


def test_fake_azure_scheduled_events() -> None:
    with FakeMetadataServer("azure", vm_name="vm-7") as md:
        url = f"{md.url}/metadata/scheduledevents?api-version=2020-07-01"
        assert _req(url)[0] == 400  # the Metadata header is mandatory
        assert _req(f"{md.url}/metadata/scheduledevents", {"Metadata": "true"})[0] == 400  # so is api-version
        code, _, body = _req(url, {"Metadata": "true"})
        first = json.loads(body)
        assert code == 200 and first["Events"] == []
        md.preempt(in_s=30)
        doc = json.loads(_req(url, {"Metadata": "true"})[2])
        (ev,) = doc["Events"]
        assert doc["DocumentIncarnation"] > first["DocumentIncarnation"]
        assert (
            ev["EventType"] == "Preempt" and ev["Resources"] == ["vm-7"] and ev["EventStatus"] == "Scheduled"
        )
        at = email.utils.parsedate_to_datetime(ev["NotBefore"]).timestamp()
        assert abs(at - (time.time() + 30)) < 3 and ev["NotBefore"].endswith("GMT")


# ------------------------------------------------------------------------------------------- polling
@pytest.mark.parametrize("cloud,in_s", [("aws", 120.0), ("gcp", 30.0), ("azure", 45.0)])
def test_poll_once_reads_each_cloud(cloud: str, in_s: float) -> None:
    with FakeMetadataServer(cloud) as md:
        assert poll_once(cloud, md.url) is None
        md.preempt(in_s=in_s)
        n = poll_once(cloud, md.url)
        assert isinstance(n, PreemptionNotice) and n.cloud == cloud
        # AWS and Azure say when; GCP's notice means "about 30 s from now"
        assert abs(n.seconds_left() - in_s) < 3
        assert cloud in str(n)


def test_azure_events_for_other_vms_are_ignored() -> None:
    with FakeMetadataServer("azure", vm_name="someone-else") as md:
        md.preempt()
        assert poll_once("azure", md.url, vm_name="me") is None
        assert poll_once("azure", md.url, vm_name="someone-else") is not None


def test_unreachable_service_is_an_oserror() -> None:
    md = FakeMetadataServer("aws").start()
    url = md.url
    md.stop()
    with pytest.raises(OSError):
        poll_once("aws", url, timeout=0.5)
    with pytest.raises(ValueError, match="unknown cloud"):
        poll_once("ibm", url)


def test_detect_cloud_from_dmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_NOTEBOOK_CLOUD", raising=False)

    def dmi(**files: str) -> Path:
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        for k, v in files.items():
            (d / k).write_text(v + "\n")
        return d

    assert detect_cloud(dmi(sys_vendor="Amazon EC2", product_name="g5.xlarge")) == "aws"
    assert detect_cloud(dmi(sys_vendor="Google", product_name="Google Compute Engine")) == "gcp"
    hyperv = dmi(sys_vendor="Microsoft Corporation", product_name="Virtual Machine")
    assert detect_cloud(hyperv) is None  # any Hyper-V VM: no Azure chassis asset tag
    assert detect_cloud(dmi(chassis_asset_tag="7783-7084-3265-9085-8269-3286-77")) == "azure"
    assert detect_cloud(dmi(sys_vendor="LENOVO", product_name="ThinkPad")) is None
    assert detect_cloud(tmp_path / "missing") is None  # no DMI at all (containers, macOS)
    monkeypatch.setenv("GPU_NOTEBOOK_CLOUD", "gcp")
    assert detect_cloud(tmp_path / "missing") == "gcp"


def test_watcher_thread_reports_one_notice() -> None:
    seen: list[PreemptionNotice] = []
    with FakeMetadataServer("gcp") as md:
        w = PreemptionWatcher("gcp", url=md.url, interval_s=0.05, on_notice=seen.append)
        try:
            assert w.active and w.notice is None
            wait_for(lambda: len(md.requests) >= 3, what="three polls")
            assert w.notice is None and not seen
            md.preempt()
            wait_for(lambda: w.notice is not None, timeout=10, what="the notice")
            assert len(seen) == 1
            wait_for(lambda: not w.active, timeout=10, what="the watcher's thread to end")
            assert len(seen) == 1  # one notice; the thread is done
        finally:
            w.stop()


def test_watcher_without_a_cloud_polls_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_NOTEBOOK_CLOUD", raising=False)
    monkeypatch.setattr("gpu_notebook.checkpoint._preemption._DMI", Path("/nonexistent"))
    monkeypatch.setattr("gpu_notebook.checkpoint._preemption._HYPERVISOR_UUID", Path("/nonexistent"))
    w = PreemptionWatcher("auto")
    assert w.cloud is None and not w.active and w.check() is None
    assert "no cloud" in repr(w)
    with pytest.raises(ValueError, match="unknown cloud"):
        PreemptionWatcher("ibm")


def test_watcher_keeps_polling_while_the_service_is_down() -> None:
    md = FakeMetadataServer("aws").start()
    url = md.url
    md.stop()
    w = PreemptionWatcher("aws", url=url, interval_s=0.05, timeout_s=0.2)
    try:
        wait_for(lambda: w.errors >= 2, what="two failed polls")
        assert w.active and w.notice is None
    finally:
        w.stop()


# ------------------------------------------------------------------------------------------- the checkpointer
def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))


def _step(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = m(torch.randn(16, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_notice_saves_at_once_then_stops(tmp_path: Path) -> None:
    with FakeMetadataServer("aws") as md:
        w = PreemptionWatcher("aws", url=md.url, interval_s=0.05)
        ck = Checkpointer(tmp_path, every_steps=1000, preemption=w, progress=False)
        try:
            m = _model()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
            state = {"model": m, "optim": opt}
            assert ck.maybe_save(state, 0) is not None  # the policy's first save
            saved_at = None
            for step in range(1, 200):
                _step(m, opt)
                if step == 5:
                    md.preempt(in_s=120)
                    while w.notice is None:
                        time.sleep(0.02)
                h = ck.maybe_save(state, step)
                if h is not None:
                    assert saved_at is None, "saved twice after the notice"
                    saved_at = step
                    assert h.done()  # blocking: committed before maybe_save returned
                if ck.preempted is not None:
                    break
            assert saved_at == 5 and step == 5
            assert ck.maybe_save(state, 6) is None  # no more saves on a machine that is going away
            latest = ck.latest()
            assert latest is not None and latest.step == 5
            assert latest.is_base  # two minutes left and a full save takes milliseconds here: a full base
            got = ck.restore()
            for k, v in m.state_dict().items():
                assert torch.equal(got["model"][k], v)
        finally:
            ck.close()


def test_full_or_delta_depends_on_the_time_left(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, preemption=None, progress=False)
    try:
        now = time.time()
        notice = PreemptionNotice("gcp", "preempt", now + 30, now)

        def full(n: PreemptionNotice) -> bool:
            return ck._preemption.full_save(n, ck._lineage.rates.get(True), ck._lineage.last_raw)

        assert full(notice) is False  # nothing measured yet and only 30 s: a delta
        assert full(PreemptionNotice("aws", "terminate", now + 120, now)) is True
        ck._lineage.rates[True], ck._lineage.last_raw = 1e9, 10 * 10**9  # a full save would take 10 s
        assert full(notice) is True  # 10 s <= half of 30 s
        ck._lineage.rates[True] = 0.5e9  # 20 s
        assert full(notice) is False
        ck.on_preemption = "full"
        assert full(notice) is True
        with pytest.raises(ValueError, match="on_preemption"):
            Checkpointer(tmp_path, on_preemption="later")
    finally:
        ck.close()


def test_delta_on_notice_when_asked(tmp_path: Path) -> None:
    with FakeMetadataServer("azure") as md:
        w = PreemptionWatcher("azure", url=md.url, interval_s=0.05)
        ck = Checkpointer(tmp_path, every_steps=1000, preemption=w, on_preemption="delta", progress=False)
        try:
            m = _model()
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            state = {"model": m}
            ck.maybe_save(state, 0)
            _step(m, opt)
            md.preempt(in_s=30)
            assert w.check() is not None
            h = ck.maybe_save(state, 1)
            assert h is not None
            info = h.result()
            assert info is not None and not info.is_base and info.parent == ck.list()[0].id
        finally:
            ck.close()


def test_save_full_forces_a_base(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, full_every=10, preemption=None, progress=False)
    try:
        m = _model()
        ck.save({"model": m}, 0, block=True)
        with torch.no_grad():
            m[0].weight.add_(1e-3)
        a = ck.save({"model": m}, 1, block=True).result()
        with torch.no_grad():
            m[0].weight.add_(1e-3)
        b = ck.save({"model": m}, 2, block=True, full=True).result()
        assert a is not None and not a.is_base and b is not None and b.is_base
        assert ck.show(b.id).restore["max_depth"] == 0
    finally:
        ck.close()


def _rank_main(rank: int, world: int, init: str, store: str, urls: list[str], out: str) -> None:
    import datetime

    import torch.distributed as dist

    # a short timeout: ranks that disagree on the collectives fail the test in seconds instead of hanging
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
    )
    try:
        # an empty URL: this rank's node was not recognised as a cloud VM, so it has no watcher
        w = PreemptionWatcher("aws", url=urls[rank], interval_s=3600, start=False) if urls[rank] else None
        ck = Checkpointer(store, every_steps=1000, preemption=w, rank=rank, world_size=world, progress=False)
        m = _model()
        state = {"model": m}
        saved = []
        for step in range(6):
            if step == 3 and w is not None:
                w.check()  # rank 1's node got the notice; rank 0's did not
            h = ck.maybe_save(state, step)
            if h is not None:
                saved.append(step)
            if ck.preempted is not None:
                break
        notice = ck.preempted
        Path(out, f"rank{rank}.json").write_text(
            json.dumps({"saved": saved, "stopped_at": step, "action": notice.action if notice else None})
        )
        ck.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("rank0_watches", [True, False], ids=["both-watch", "rank0-not-a-cloud-vm"])
def test_a_notice_on_one_rank_stops_and_saves_all_ranks(tmp_path: Path, rank0_watches: bool) -> None:
    """Rank 1 sees the notice, rank 0 (which writes replicated state) does not: they agree through an
    all-reduce in maybe_save, rank 0 writes the checkpoint, and both leave the loop at the same step. Also when
    rank 0 has no watcher at all (its node was not recognised as a cloud VM): it still takes part in the
    agreement (it used to skip it, and rank 1 waited in an all-reduce rank 0 never joined)."""
    import socket

    import torch.multiprocessing as mp

    with FakeMetadataServer("aws") as quiet, FakeMetadataServer("aws") as noisy:
        noisy.preempt(in_s=120)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env_before = dict(os.environ)
        try:
            mp.spawn(
                _rank_main,
                args=(
                    2,
                    f"tcp://127.0.0.1:{port}",
                    str(tmp_path / "store"),
                    [quiet.url if rank0_watches else "", noisy.url],
                    str(tmp_path),
                ),
                nprocs=2,
                join=True,
            )
        finally:
            os.environ.clear()
            os.environ.update(env_before)
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["stopped_at"] == r1["stopped_at"] == 3
    assert r0["action"] == "peer" and r1["action"] == "terminate"
    assert r0["saved"] == [0, 3]  # the policy's first save, then the one for the notice
    ck = Checkpointer(tmp_path / "store", preemption=None, progress=False)
    try:
        assert [c.step for c in ck.list()] == [0, 3]
    finally:
        ck.close()


def test_checkpointer_auto_watcher_on_a_laptop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_NOTEBOOK_CLOUD", raising=False)
    monkeypatch.setattr("gpu_notebook.checkpoint._preemption._DMI", Path("/nonexistent"))
    monkeypatch.setattr("gpu_notebook.checkpoint._preemption._HYPERVISOR_UUID", Path("/nonexistent"))
    ck = Checkpointer(tmp_path, progress=False)
    try:
        assert (
            ck._preemption.watcher is not None
            and ck._preemption.watcher.cloud is None
            and not ck._preemption.watcher.active
        )
        assert ck.maybe_save({"x": torch.zeros(3)}, 0) is not None and ck.preempted is None
    finally:
        ck.close()


# ------------------------------------------------------------------------------------------- audit regressions
def test_detect_cloud_xen_ec2_and_plain_hyperv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Xen-based EC2 instances (p2, p3, g3: GPU instances) say "Xen" in their vendor strings and "amazon" only in
    the BIOS version (or /sys/hypervisor/uuid); a Hyper-V VM on a laptop or on premises has Azure's vendor strings
    but not its chassis asset tag, and is no Azure VM (it must not poll a metadata service)."""
    monkeypatch.delenv("GPU_NOTEBOOK_CLOUD", raising=False)

    def dmi(**files: str) -> Path:
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        for k, v in files.items():
            (d / k).write_text(v + "\n")
        return d

    xen = dmi(sys_vendor="Xen", product_name="HVM domU", bios_vendor="Xen", bios_version="4.11.amazon")
    assert detect_cloud(xen) == "aws"
    plain_xen = dmi(sys_vendor="Xen", product_name="HVM domU", bios_vendor="Xen", bios_version="4.2")
    assert detect_cloud(plain_xen) is None
    (tmp_path / "hv-uuid").write_text("ec2e1916-9099-7caf-fd21-012345abcdef\n")  # a paravirtual EC2 guest
    assert detect_cloud(plain_xen, hypervisor_uuid=tmp_path / "hv-uuid") == "aws"
    hyperv = dmi(sys_vendor="Microsoft Corporation", product_name="Virtual Machine", chassis_asset_tag="None")
    assert detect_cloud(hyperv) is None
    azure = dmi(
        sys_vendor="Microsoft Corporation",
        product_name="Virtual Machine",
        chassis_asset_tag="7783-7084-3265-9085-8269-3286-77",
    )
    assert detect_cloud(azure) == "azure"


def test_fake_azure_names_this_vm() -> None:
    with FakeMetadataServer("azure", vm_name="vm-7") as md:
        url = f"{md.url}/metadata/instance/compute/name?api-version=2021-02-01&format=text"
        assert _req(url)[0] == 400  # the Metadata header is mandatory
        code, _, body = _req(url, {"Metadata": "true"})
        assert code == 200 and body == b"vm-7"


def test_azure_event_for_another_vm_of_the_scale_set_is_no_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scheduled events of an availability set or scale set placement group are delivered to every VM in it;
    only an event whose Resources name this VM (its name from the instance metadata) is a notice for it."""
    monkeypatch.delenv("GPU_NOTEBOOK_VM_NAME", raising=False)
    with FakeMetadataServer("azure", vm_name="gpu-node-0") as md:
        md.preempt(in_s=30, resources=["gpu-node-1"])  # the neighbour is evicted
        assert poll_once("azure", md.url) is None
        w = PreemptionWatcher("azure", url=md.url, start=False)
        assert w.check() is None and w.notice is None
        md.preempt(in_s=30)  # now this VM
        assert poll_once("azure", md.url) is not None
        assert w.check() is not None


def test_notice_saves_even_while_a_skipped_save_would_be_uploading(tmp_path: Path) -> None:
    """on_busy="skip" skips a policy save while the previous one uploads, but never the save for a preemption
    notice: it waits for the upload in flight, then saves and commits."""
    import threading

    with FakeMetadataServer("gcp") as md:
        w = PreemptionWatcher("gcp", url=md.url, start=False)
        ck = Checkpointer(tmp_path, on_busy="skip", preemption=w, progress=False, retries=0)
        gate = threading.Event()
        put = ck.store.put

        def slow_put(key: str, data: bytes, **kw: object) -> bool:
            if key.startswith("manifests/"):
                gate.wait(10)
            return put(key, data, **kw)  # type: ignore[arg-type]

        ck.store.put = slow_put  # type: ignore[method-assign]
        try:
            m = _model()
            state = {"model": m}
            first = ck.maybe_save(state, 0)
            assert first is not None and not first.done()  # uploading
            md.preempt(in_s=30)
            assert w.check() is not None
            timer = threading.Timer(0.3, gate.set)
            timer.start()
            h = ck.maybe_save(state, 1)
            timer.join()
            assert h is not None and not h.skipped and h.done()
            assert ck.preempted is not None
            assert [c.step for c in ck.list()] == [0, 1]
        finally:
            gate.set()
            ck.close()


def test_a_notice_save_that_raises_is_tried_again(tmp_path: Path) -> None:
    """A save on a notice that raises (here: the error of an earlier background save that failed for good, which
    the next save raises) has saved nothing: the next maybe_save tries again instead of saving no more."""
    from gpu_notebook.checkpoint import CheckpointSaveError

    with FakeMetadataServer("gcp") as md:
        w = PreemptionWatcher("gcp", url=md.url, start=False)
        ck = Checkpointer(tmp_path, every_steps=1000, preemption=w, progress=False, retries=0)
        put = ck.store.put
        broken = [True]

        def flaky_put(key: str, data: bytes, **kw: object) -> bool:
            if broken[0] and key.startswith("manifests/"):
                raise OSError("disk full")
            return put(key, data, **kw)  # type: ignore[arg-type]

        ck.store.put = flaky_put  # type: ignore[method-assign]
        try:
            state = {"model": _model()}
            with pytest.warns(RuntimeWarning):
                h = ck.maybe_save(state, 0)
                assert h is not None and h.exception() is not None  # failed for good, in the background
            broken[0] = False
            md.preempt(in_s=30)
            assert w.check() is not None
            with pytest.raises(CheckpointSaveError):
                ck.maybe_save(state, 1)  # the earlier failure is raised; nothing saved for the notice yet
            h = ck.maybe_save(state, 2)
            assert h is not None and h.done() and h.result() is not None
            assert [c.step for c in ck.list()] == [2]
            assert ck.maybe_save(state, 3) is None  # and then no more
        finally:
            ck.close()
