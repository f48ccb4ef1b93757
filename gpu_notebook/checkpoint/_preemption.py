"""Spot preemption notices from the cloud's instance metadata service, so a checkpoint goes out before the node does.

* AWS: ``GET /latest/meta-data/spot/instance-action`` (IMDSv2: a session token from ``PUT /latest/api/token``) is
  404 until EC2 schedules the interruption, then ``{"action": "terminate"|"stop"|"hibernate", "time": ...}``,
  about two minutes ahead. AWS recommends polling every 5 seconds.
* GCP: ``GET /computeMetadata/v1/instance/preempted`` (header ``Metadata-Flavor: Google``) turns from ``FALSE`` to
  ``TRUE`` when the preemption starts; the VM gets about 30 seconds.
* Azure: ``GET /metadata/scheduledevents?api-version=2020-07-01`` (header ``Metadata: true``) lists a ``Preempt``
  event with its ``NotBefore`` time, at least 30 seconds ahead. The events of every VM of an availability set or
  scale set placement group reach all of them: an event is this VM's when its ``Resources`` name it
  (``GPU_NOTEBOOK_VM_NAME``, else ``/metadata/instance/compute/name``, asked only when there is an event).

All three answer at ``http://169.254.169.254``. The cloud is recognised from the machine's DMI strings (no
network probe, so a laptop never waits on a metadata timeout): "amazon" in the vendor strings or BIOS version (Xen
instances say it only there) or ``/sys/hypervisor/uuid`` starting with ``ec2``; "google"; Azure's chassis asset
tag (a Hyper-V VM elsewhere has Azure's vendor strings but not the tag). ``GPU_NOTEBOOK_CLOUD`` names the cloud;
``GPU_NOTEBOOK_METADATA_URL`` points the watcher at another endpoint (a test server, a proxy).
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpu_notebook import _settings

log = logging.getLogger("gpu_notebook.checkpoint")

__all__ = ["PreemptionNotice", "PreemptionWatcher", "detect_cloud", "poll_once", "METADATA_URL"]

METADATA_URL = "http://169.254.169.254"
CLOUDS = ("aws", "gcp", "azure")
#: seconds of warning each cloud promises when a notice carries no time of its own
DEFAULT_WARNING_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
_DMI = Path("/sys/class/dmi/id")
_HYPERVISOR_UUID = Path("/sys/hypervisor/uuid")  # Xen guests; "ec2..." on EC2's paravirtual instances
#: the chassis asset tag of every Azure VM ("MSFT AZURE VM" in ASCII codes)
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


@dataclass
class PreemptionNotice:
    """A notice that this machine will be taken away.

    ``deadline`` is the epoch time the cloud will act (from the notice, else its promised warning after
    ``received_at``); ``seconds_left()`` counts down to it.
    """

    cloud: str
    action: str
    deadline: float
    received_at: float = field(default_factory=time.time)
    detail: dict[str, Any] = field(default_factory=dict)

    def seconds_left(self, now: float | None = None) -> float:
        return self.deadline - (time.time() if now is None else now)

    def __str__(self) -> str:
        left = f"{max(0.0, self.seconds_left()):.0f} s"
        if (
            self.cloud == "guard"
        ):  # a detached cluster's guard (see gpu_notebook.checkpoint.policy.guard_notice)
            return f"the cluster stops in {left} ({self.action})"
        return f"{self.cloud} spot {self.action} in {left}"


def detect_cloud(dmi: Path | None = None, hypervisor_uuid: Path | None = None) -> str | None:
    """``aws``, ``gcp``, ``azure`` or None, from ``GPU_NOTEBOOK_CLOUD`` or the DMI strings (and the Xen hypervisor
    UUID). ``dmi``, ``hypervisor_uuid``: where to read them (default: this machine's; only the DMI folder given,
    no hypervisor UUID)."""
    if dmi is None:
        dmi = _DMI
        hypervisor_uuid = _HYPERVISOR_UUID if hypervisor_uuid is None else hypervisor_uuid
    env = _settings.cloud()
    if env:
        return env if env in CLOUDS else None
    texts = []
    # (world-readable ones only: product_uuid and product_serial need root)
    names = ("sys_vendor", "product_name", "product_version", "bios_vendor", "bios_version", "board_vendor")
    for name in (*names, "chassis_asset_tag"):
        try:
            texts.append((dmi / name).read_text(errors="replace").strip().lower())
        except OSError:
            pass
    blob = " ".join(texts)
    # Nitro: "Amazon EC2"; Xen (p2, p3, g3, ...): sys_vendor "Xen", bios_version "4.11.amazon"
    if "amazon" in blob:
        return "aws"
    try:
        if hypervisor_uuid and hypervisor_uuid.read_text(errors="replace").strip().lower().startswith("ec2"):
            return "aws"
    except OSError:
        pass
    if "google" in blob:
        return "gcp"
    # Azure VMs carry this chassis asset tag; "Microsoft Corporation" / "Virtual Machine" alone is any Hyper-V VM
    if AZURE_ASSET_TAG in blob:
        return "azure"
    return None


def _request(url: str, headers: dict[str, str], timeout: float, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP proxy
    try:
        with opener.open(req, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read() if e.fp is not None else b""


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()  # RFC 1123, Azure's NotBefore
    except (TypeError, ValueError):
        return None


def poll_once(
    cloud: str, url: str = METADATA_URL, timeout: float = 1.0, vm_name: str | None = None
) -> PreemptionNotice | None:
    """Ask the metadata service once; a notice, or None. Raises ``OSError`` when the service does not answer.

    ``vm_name`` (Azure): this VM's name in the events' ``Resources``; None: asked of the metadata service.
    """
    url = url.rstrip("/")
    now = time.time()
    if cloud == "aws":
        code, token = _request(
            f"{url}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout, method="PUT"
        )
        headers = {"X-aws-ec2-metadata-token": token.decode()} if code == 200 else {}  # IMDSv1 as a fallback
        code, body = _request(f"{url}/latest/meta-data/spot/instance-action", headers, timeout)
        if code == 404:
            return None
        if code != 200:
            raise OSError(f"instance metadata answered HTTP {code}")
        doc = json.loads(body)
        deadline = _parse_time(doc.get("time")) or now + DEFAULT_WARNING_S["aws"]
        return PreemptionNotice("aws", str(doc.get("action", "terminate")), deadline, now, doc)
    if cloud == "gcp":
        code, body = _request(
            f"{url}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"}, timeout
        )
        if code != 200:
            raise OSError(f"metadata server answered HTTP {code}")
        if body.strip().upper() != b"TRUE":
            return None
        return PreemptionNotice("gcp", "preempt", now + DEFAULT_WARNING_S["gcp"], now, {"preempted": True})
    if cloud == "azure":
        code, body = _request(
            f"{url}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"}, timeout
        )
        if code != 200:
            raise OSError(f"instance metadata answered HTTP {code}")
        doc = json.loads(body)
        for ev in doc.get("Events", []):
            if ev.get("EventType") not in ("Preempt", "Terminate"):
                continue
            res = ev.get("Resources") or []
            if res and vm_name is None:
                try:  # asked only now: events are rare (unknown: every event counts, rather than none)
                    vm_name = azure_vm_name(url, timeout) or ""
                except OSError:
                    vm_name = ""
            if vm_name and res and vm_name not in res:
                continue  # an event for another VM of the availability set or scale set
            deadline = _parse_time(ev.get("NotBefore")) or now + DEFAULT_WARNING_S["azure"]
            return PreemptionNotice("azure", str(ev["EventType"]).lower(), deadline, now, ev)
        return None
    raise ValueError(f"unknown cloud {cloud!r}: one of {', '.join(CLOUDS)}")


def azure_vm_name(url: str = METADATA_URL, timeout: float = 1.0) -> str | None:
    """This Azure VM's name, as scheduled events list it in ``Resources`` (None when the service does not say)."""
    code, body = _request(
        f"{url.rstrip('/')}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
        {"Metadata": "true"},
        timeout,
    )
    name = body.decode(errors="replace").strip() if code == 200 else ""
    return name or None


class PreemptionWatcher:
    """Polls the metadata service in a daemon thread and remembers the first notice.

    Parameters
    ----------
    cloud
        ``"auto"`` (:func:`detect_cloud`; on a machine that is not a cloud VM nothing is polled), or a name.
    url
        The metadata endpoint (default ``GPU_NOTEBOOK_METADATA_URL``, else ``http://169.254.169.254``).
    interval_s
        Seconds between polls (AWS recommends 5).
    on_notice
        Called once, from the watcher thread, with the :class:`PreemptionNotice`.
    """

    def __init__(
        self,
        cloud: str | None = "auto",
        *,
        url: str | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 1.0,
        on_notice: Callable[[PreemptionNotice], None] | None = None,
        start: bool = True,
    ) -> None:
        self.cloud = detect_cloud() if cloud == "auto" else cloud
        if self.cloud is not None and self.cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {self.cloud!r}: one of {', '.join(CLOUDS)}, or 'auto'")
        self.url = url or _settings.metadata_url() or METADATA_URL
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.on_notice = on_notice
        self.notice: PreemptionNotice | None = None
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> PreemptionWatcher:
        if self.cloud is None or self.active:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gnb-preemption-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1.0)
        self._thread = None

    def check(self) -> PreemptionNotice | None:
        """Poll now (also used by the thread); the notice, once there is one."""
        if self.notice is not None or self.cloud is None:
            return self.notice
        try:
            notice = poll_once(self.cloud, self.url, self.timeout_s, vm_name=_settings.vm_name())
        except (OSError, ValueError) as e:  # the service is down or answered nonsense: keep trying
            self.errors += 1
            if self.errors in (1, 10, 100):
                log.warning("preemption watcher: %s metadata service at %s: %s", self.cloud, self.url, e)
            return None
        if notice is not None:
            self.notice = notice
            log.warning("preemption notice: %s", notice)
            if self.on_notice is not None:
                try:
                    self.on_notice(notice)
                except Exception:  # noqa: BLE001 - a callback must not kill the watcher
                    log.exception("preemption watcher: on_notice failed")
        return notice

    def _run(self) -> None:
        while not self._stop.is_set() and self.notice is None:
            self.check()
            self._stop.wait(self.interval_s)

    def __repr__(self) -> str:
        state = str(self.notice) if self.notice else ("watching" if self.active else "idle")
        return f"<PreemptionWatcher {self.cloud or 'no cloud'} {state}>"
