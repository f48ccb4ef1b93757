"""Plan, launch and tear down cloud GPU clusters through Ray's own cluster launcher (or KubeRay).

:class:`CloudLauncher` is what ``%gpu_cluster start --cloud ...`` and ``%gpu_cluster stop`` call:

- :meth:`CloudLauncher.plan` renders and validates the full config and prices it (``--dry-run``);
- :meth:`CloudLauncher.launch` checks credentials, saves state, runs ``ray.autoscaler.sdk.create_or_update_cluster``
  with progress stages, waits for workers, and cleans up what it created if anything fails;
- :meth:`CloudLauncher.teardown` runs ``teardown_cluster`` and then asks the cloud API whether anything tagged
  with the cluster's name is left, terminating stragglers on AWS, and reports what it found.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

from gpu_notebook.errors import GpuNotebookError

from . import _kube, _ray_compat
from ._credentials import CredentialsInfo, check_credentials
from ._render import RAY_CLIENT_PORT, render_kuberay_manifest, render_ray_config, to_yaml
from ._spec import CloudRequestError, ClusterSpec, InstanceChoice, Resolved, resolve
from ._state import ClusterState, delete_state, list_states, load_state
from ._verify import VerificationUnavailable, leftovers_for

Progress = Callable[[str], None]

#: Cloud API error codes that mean "no capacity or no quota for this request".
CAPACITY_CODES = {
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "InsufficientInstanceCapacity",
    "SpotMaxPriceTooLow",
    "Unsupported",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "QUOTA_EXCEEDED",
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "OperationNotAllowed",
    "SkuNotAvailable",
    "QuotaExceeded",
}
QUOTA_URLS = {
    "aws": "https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas",
    "gcp": "https://console.cloud.google.com/iam-admin/quotas",
    "azure": "https://portal.azure.com/#view/Microsoft_Azure_Capacity/QuotaMenuBlade",
}


#: EC2 vCPU quotas by instance family: {family: ((on-demand code, name), (spot code, name))}.
AWS_VCPU_QUOTAS = {
    "p": (("L-417A185B", "Running On-Demand P instances"), ("L-7212CCBC", "All P Spot Instance Requests")),
    "g": (
        ("L-DB2E81BA", "Running On-Demand G and VT instances"),
        ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ),
}
AWS_VCPU_QUOTAS["vt"] = AWS_VCPU_QUOTAS["g"]


def aws_vcpu_quota(region: str, instance_type: str, spot: bool) -> tuple[str, str, float] | None:
    """``(quota code, quota name, vCPUs allowed)`` for ``instance_type``'s family, or None if unknown/unreadable."""
    import re

    match = re.match(r"[a-z]+", instance_type.lower())
    family = match.group(0) if match else ""
    if family not in AWS_VCPU_QUOTAS:
        return None
    code, name = AWS_VCPU_QUOTAS[family][1 if spot else 0]
    try:
        import boto3

        resp = boto3.client("service-quotas", region_name=region).get_service_quota(
            ServiceCode="ec2", QuotaCode=code
        )
        return code, name, float(resp["Quota"]["Value"])
    except Exception:
        return None  # no permission, not supported (e.g. an emulator), offline: launch and let EC2 decide


class LaunchError(GpuNotebookError, RuntimeError):
    """A launch that failed; the message says why, what was cleaned up, and what to try instead."""

    def __init__(self, message: str, teardown: TeardownReport | None = None) -> None:
        super().__init__(message)
        self.teardown = teardown


# ---------------------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------------------


def _fmt_usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.2f}"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.2f}/h"


@dataclass
class Plan:
    """What a launch would do: the full config, the instances and their estimated cost per hour."""

    spec: ClusterSpec
    resolved: Resolved
    config: dict[str, Any]
    kind: str  # "ray" (cluster launcher YAML) or "kuberay" (RayCluster manifest)
    notes: list[str] = field(default_factory=list)

    @property
    def instances(self) -> list[InstanceChoice]:
        """Head (if any) then workers."""
        return [i for i in (self.resolved.head, self.resolved.worker) if i is not None]

    def hourly(self, market: str = "on_demand", at_max: bool = False) -> float | None:
        """Estimated USD/hour: the head on demand, workers in ``market`` (``"on_demand"`` or ``"spot"``)."""
        total = 0.0
        for inst in self.instances:
            price = (
                inst.on_demand_per_hour
                if (inst.role == "head" or market == "on_demand")
                else inst.spot_per_hour
            )
            if price is None:
                if inst.role == "head" and inst.on_demand_per_hour is None and self.kind == "ray":
                    continue  # unknown head price: leave it out, say so in notes
                return None
            total += price * (inst.max_count if at_max else inst.count)
        return total

    @property
    def gpus_per_node(self) -> int:
        """GPUs per worker node."""
        return int(self.resolved.worker.gpus_per_node)

    @property
    def world_size(self) -> int:
        """Ranks for one rank per GPU on the initial workers (``workers * gpus_per_node``)."""
        return int(self.spec.workers) * self.gpus_per_node

    @property
    def yaml(self) -> str:
        """The config (or manifest) as YAML."""
        return to_yaml(self.config)

    def summary_lines(self) -> list[str]:
        s = self.spec
        lines = [
            f"Plan for {s.cloud} cluster {s.name!r} in {s.region or s.namespace} (dry run: nothing launched)"
        ]
        for inst in self.instances:
            market = "spot" if inst.spot else "on-demand"
            gpus = f"{inst.gpus_per_node}x {inst.gpu}" if inst.gpus_per_node else "no GPU"
            count = f"{inst.count}" if inst.count == inst.max_count else f"{inst.count}..{inst.max_count}"
            lines.append(
                f"  {inst.role:6s} {count:>5s} x {inst.name:24s} {gpus:14s} {market:9s} "
                f"(per node: {_rate(inst.on_demand_per_hour)} on-demand, {_rate(inst.spot_per_hour)} spot)"
            )
        od, sp = self.hourly("on_demand"), self.hourly("spot")
        lines.append(
            f"  estimated cost: {_rate(od)} all on-demand, {_rate(sp)} with spot workers"
            + (f" (saves {100 * (1 - sp / od):.0f}%)" if od and sp else "")
        )
        if (s.max_workers or 0) > s.workers:
            lines.append(
                f"  at max_workers={s.max_workers}: {_rate(self.hourly('on_demand', True))} on-demand, "
                f"{_rate(self.hourly('spot', True))} spot"
            )
        lines.append(
            f"  chosen: {'spot' if s.spot else 'on-demand'} workers"
            + (" with on-demand fallback" if s.spot and s.spot_fallback and s.cloud != "kubernetes" else "")
            + (f"; head auto-stop after {s.idle_stop_minutes:g} idle min" if s.idle_stop_minutes else "")
        )
        lines.extend(f"  note: {n}" for n in self.notes)
        return lines

    def text(self) -> str:
        """The summary followed by the full YAML."""
        return "\n".join(self.summary_lines()) + "\n\n" + self.yaml

    def __repr__(self) -> str:
        return (
            f"Plan({self.spec.cloud}:{self.spec.name}, worker={self.resolved.worker.name} x{self.spec.workers}, "
            f"on-demand={_fmt_usd(self.hourly('on_demand'))}/h, spot={_fmt_usd(self.hourly('spot'))}/h)"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{escape(i.role)}</td><td>{i.count}..{i.max_count}</td><td>{escape(i.name)}</td>"
            f"<td>{i.gpus_per_node} {escape(i.gpu or '')}</td><td>{'spot' if i.spot else 'on-demand'}</td>"
            f"<td>{_fmt_usd(i.on_demand_per_hour)}</td><td>{_fmt_usd(i.spot_per_hour)}</td></tr>"
            for i in self.instances
        )
        head = escape(self.summary_lines()[0])
        cost = (
            f"<p>Estimated: <b>{_fmt_usd(self.hourly('on_demand'))}/h</b> on-demand, "
            f"<b>{_fmt_usd(self.hourly('spot'))}/h</b> with spot workers.</p>"
        )
        notes = "".join(f"<li>{escape(n)}</li>" for n in self.notes)
        return (
            f"<div><p>{head}</p><table><tr><th>role</th><th>nodes</th><th>instance</th><th>GPUs</th>"
            f"<th>market</th><th>on-demand $/h</th><th>spot $/h</th></tr>{rows}</table>{cost}"
            f"{'<ul>' + notes + '</ul>' if notes else ''}"
            f"<details><summary>full config</summary><pre>{escape(self.yaml)}</pre></details></div>"
        )


# ---------------------------------------------------------------------------------------------------------
# Teardown report
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TeardownReport:
    """What teardown did and what the cloud API says is left."""

    name: str
    cloud: str
    found_before: list[dict[str, Any]] = field(default_factory=list)
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    verified: bool = False
    errors: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Verified through the cloud API and nothing left."""
        return self.verified and not self.leftovers

    def message(self) -> str:
        kinds: dict[str, int] = {}
        for item in self.found_before:
            kinds[item["kind"]] = kinds.get(item["kind"], 0) + 1
        found = ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in kinds.items())
        text = f"Cluster {self.name}: " + (f"found {found}; " if found else "")
        if self.forced:
            text += f"terminated {len(self.forced)} straggler(s) directly; "
        if self.clean:
            return (
                text
                + f"terminated. Verified: nothing tagged ray-cluster-name={self.name} is left on {self.cloud}."
            )
        if not self.verified:
            why = "; ".join(self.errors) or "unknown"
            return text + (
                f"teardown requested, but it could NOT be verified through the {self.cloud} API ({why}). "
                "Check the cloud console."
            )
        left = ", ".join(f"{i['kind']} {i['id']} ({i.get('state')})" for i in self.leftovers)
        return text + f"STILL LEFT on {self.cloud}: {left}. Terminate them in the console."

    def __repr__(self) -> str:
        return f"TeardownReport({self.name!r}, clean={self.clean}, leftovers={len(self.leftovers)})"

    def __str__(self) -> str:
        return self.message()

    def _repr_html_(self) -> str:
        color = "green" if self.clean else "red"
        return f"<p style='color:{color}'>{escape(self.message())}</p>"


# ---------------------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------------------


class _LauncherOutput:
    """Sends the launcher's own console output (Ray's cli_logger, ssh/rsync output) to a log file.

    Ray's launcher prints hundreds of lines; in a notebook the progress stages are enough, and the full log is
    kept next to the cluster state (and its tail is quoted when a launch fails). ``verbose=True`` keeps it on
    the console instead.
    """

    def __init__(self, path: Any, verbose: bool) -> None:
        self.path = path
        self.verbose = verbose
        self.real_stdout: Any = None
        self._file: Any = None
        self._saved: list[Any] = []

    def __enter__(self) -> _LauncherOutput:
        import logging
        import sys

        self.real_stdout = sys.stdout
        if self.verbose:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in __exit__
        handler = logging.StreamHandler(self._file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log = logging.getLogger("ray.autoscaler")
        self._saved = [sys.stdout, sys.stderr, log.propagate, handler, log.level]
        log.addHandler(handler)
        log.propagate = False
        log.setLevel(logging.INFO)
        sys.stdout = sys.stderr = self._file
        return self

    def __exit__(self, *exc: object) -> None:
        import logging
        import sys

        if self.verbose or not self._saved:
            return
        out, err, propagate, handler, level = self._saved
        sys.stdout, sys.stderr = out, err
        log = logging.getLogger("ray.autoscaler")
        log.removeHandler(handler)
        log.propagate = propagate
        log.setLevel(level)
        self._file.close()

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class _Stages:
    """Turns launcher events into de-duplicated stage lines with elapsed time."""

    def __init__(self, progress: Progress | None, state: ClusterState | None = None) -> None:
        self.progress = progress
        self.state = state
        self.t0 = time.monotonic()
        self.last: str | None = None
        self.console: Any = None  # the real stdout while launcher output goes to a log file

    def __call__(self, stage: str) -> None:
        if stage == self.last:
            return
        self.last = stage
        elapsed = time.monotonic() - self.t0
        if self.state is not None:
            self.state.events.append({"stage": stage, "elapsed_s": round(elapsed, 2)})
        if self.progress is not None:
            if self.console is not None:
                import contextlib

                with contextlib.redirect_stdout(self.console):
                    self.progress(f"[{elapsed:6.1f}s] {stage}")
            else:
                self.progress(f"[{elapsed:6.1f}s] {stage}")

    def ray_event(self, name: str, data: dict[str, Any]) -> None:
        stage = _ray_compat.EVENT_STAGES.get(name)
        if stage:
            self(stage)


# ---------------------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------------------


def _error_code(exc: BaseException) -> tuple[str | None, str]:
    """(code, description) from a launcher exception chain (NodeLaunchException, botocore ClientError...)."""
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        category = getattr(cur, "category", None)
        if category:
            return str(category), str(getattr(cur, "description", "") or "")
        response = getattr(cur, "response", None)
        if isinstance(response, dict) and "Error" in response:
            err = response["Error"]
            return str(err.get("Code")), str(err.get("Message", ""))
        cur = cur.__cause__ or cur.__context__
    return None, str(exc)


class CloudLauncher:
    """Plans, launches, tears down and lists cloud GPU clusters.

    Parameters
    ----------
    catalog : optional
        The instance catalog (default :func:`gpu_notebook.catalog.get_catalog`).
    check_tools : bool
        Check that ``ssh`` and ``rsync`` exist before a VM launch.
    verify_credentials : bool
        AWS: verify credentials with STS before launching.
    kube_clients : tuple, optional
        ``(CustomObjectsApi, CoreV1Api)`` for ``kubernetes`` (default: from the kube config).
    ssh, kubectl : str
        Programs for the Ray Client tunnel (``ClusterSpec.connect="tunnel"``): ``ssh -N -L`` on VM clouds,
        ``kubectl port-forward`` on Kubernetes.
    verbose : bool
        Show Ray's launcher output on the console; by default it goes to ``clusters/<name>.log`` next to the
        saved state and only the progress stages are shown.
    """

    def __init__(
        self,
        catalog: Any = None,
        check_tools: bool = True,
        verify_credentials: bool = True,
        kube_clients: tuple[Any, Any] | None = None,
        verbose: bool = False,
        ssh: str = "ssh",
        kubectl: str = "kubectl",
    ) -> None:
        self.verbose = verbose
        self.ssh = ssh
        self.kubectl = kubectl
        self.catalog = catalog
        self.check_tools = check_tools
        self.verify_credentials = verify_credentials
        self._kube_clients = kube_clients

    # -- plan ---------------------------------------------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        """Resolve instances, render the config, validate it with Ray's own validation, price it.

        Raises
        ------
        CloudRequestError
            The request cannot be met (unknown GPU/instance, region without it); alternatives are listed.
        """
        resolved = resolve(spec, self.catalog)
        notes: list[str] = []
        if spec.cloud == "kubernetes":
            manifest = render_kuberay_manifest(spec)
            notes.append("Kubernetes: cost depends on your cluster's nodes; no estimate.")
            return Plan(spec, resolved, manifest, "kuberay", notes)
        _ray_compat.check_ray_version()
        config = render_ray_config(spec, resolved)
        _ray_compat.prepare_and_validate(config)
        head = resolved.head
        if head is not None and head.on_demand_per_hour is None:
            notes.append(f"head {head.name}: price not in the catalog, left out of the estimate")
        if spec.idle_stop_minutes:
            notes.append(
                "idle auto-stop runs on the head (gpu_notebook.cloud._idle_watch) and tears the whole "
                "cluster down; Ray's idle_timeout_minutes only removes extra workers"
            )
        notes.append(
            f"image {spec.image_or_default}; setup installs {', '.join(spec.pip_or_default) or 'nothing'}"
        )
        return Plan(spec, resolved, config, "ray", notes)

    # -- launch -------------------------------------------------------------------------------------------

    def check_credentials(self, spec: ClusterSpec) -> CredentialsInfo:
        """One clear :class:`CredentialsError` when ``spec``'s cloud is not usable from here."""
        if spec.cloud == "kubernetes" and self._kube_clients is not None:
            from ._credentials import check_kubernetes

            return check_kubernetes(need_client=False)
        return check_credentials(
            spec.cloud,
            spec.region,
            project=spec.project,
            verify=self.verify_credentials,
            tools=self.check_tools,
        )

    def launch(
        self,
        spec: ClusterSpec,
        progress: Progress | None = None,
        wait_for_workers_s: float = 900.0,
        poll_s: float = 10.0,
    ) -> ClusterState:
        """Create the cluster; return its saved :class:`ClusterState` (``address``/``client_address`` set).

        Stages reported through ``progress``: checking credentials, launching head, waiting for SSH,
        installing, starting Ray, workers joining. On any failure (including Ctrl-C) whatever was created is
        torn down and verified, and :class:`LaunchError` says why, what was cleaned, and what to try instead.
        """
        plan = self.plan(spec)
        self._refuse_duplicate(str(spec.name))
        state = ClusterState(
            name=str(spec.name),
            cloud=spec.cloud,
            region=spec.region,
            spec=spec.to_dict(),
            config=plan.config,
            hourly_usd=plan.hourly("spot" if spec.spot else "on_demand"),
            gpus_per_node=plan.gpus_per_node,
            world_size=plan.world_size,
        )
        stages = _Stages(progress, state)
        stages("checking credentials")
        self.check_credentials(spec)
        if spec.cloud == "aws":
            stages("checking quota")
            self._check_aws_quota(spec, plan)
        if spec.cloud == "kubernetes":
            return self._launch_kube(spec, plan, state, stages, poll_s)
        state.save()  # before anything exists, so a crashed kernel can still `stop` it
        output = _LauncherOutput(state.path.with_suffix(".log"), self.verbose)
        failure: BaseException | None = None
        with output:
            stages.console = output.real_stdout
            try:
                with _ray_compat.launcher_events(stages.ray_event):
                    booted = _ray_compat.create_or_update_cluster(plan.config)
                state.ssh_key = (booted or {}).get("auth", {}).get("ssh_private_key")
                state.head_ip = _ray_compat.get_head_node_ip(plan.config)
                state.address = f"{state.head_ip}:6379"
                state.client_address = f"ray://{state.head_ip}:{RAY_CLIENT_PORT}"
                state.save()
                if spec.connect == "tunnel":
                    stages("opening an SSH tunnel to the head's Ray Client port")
                    self.open_tunnel(state, ssh=self.ssh)
                stages("workers joining")
                self._wait_workers(plan.config, spec.workers, wait_for_workers_s, poll_s, stages)
            except BaseException as exc:
                code, desc = _error_code(exc)
                stages("launch failed: cleaning up what was created")
                self.close_tunnel(state)
                report = self._teardown_config(plan.config, stages)
                state.status, state.error = "failed", f"{code or type(exc).__name__}: {desc}"
                if report.clean:
                    delete_state(state.name)
                else:
                    state.save()
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failure = exc
            finally:
                stages.console = None
        if failure is not None:
            msg = self._failure_message(spec, plan, code, desc, report)
            if not self.verbose:
                msg += f"\nLauncher log: {output.path}\n" + "\n".join(
                    "  | " + ln for ln in output.tail().splitlines()
                )
            raise LaunchError(msg, report) from failure
        state.status = "running"
        stages("ready")
        state.save()
        return state

    @staticmethod
    def _refuse_duplicate(name: str) -> None:
        try:
            old = load_state(name)
        except KeyError:
            return
        if old.status in ("launching", "running", "stopping", "stop-incomplete"):
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(old.created_at))
            raise CloudRequestError(
                f"a {old.cloud} cluster named {name!r} already exists (status {old.status}, started {started}); "
                f"stop it first (%gpu_cluster stop {name}) or pick another name"
            )

    def _check_aws_quota(self, spec: ClusterSpec, plan: Plan) -> None:
        worker = plan.resolved.worker
        quota = aws_vcpu_quota(str(spec.region), worker.name, spec.spot)
        if quota is None or worker.vcpus is None:
            return
        code, name, allowed = quota
        need = float(worker.vcpus) * int(spec.max_workers or spec.workers)
        if allowed >= need:
            return
        alts = self.alternatives(spec, worker)
        raise CloudRequestError(
            f"aws quota too low in {spec.region}: {spec.max_workers} x {worker.name} needs {need:.0f} vCPUs of "
            f"'{name}' ({code}), the account allows {allowed:.0f}. Nothing was launched.\n"
            f"Alternatives: {'; '.join(alts)}\nOr request a quota increase: {QUOTA_URLS['aws']}"
        )

    def _wait_workers(
        self, config: dict[str, Any], want: int, timeout_s: float, poll_s: float, stages: _Stages
    ) -> int:
        if want <= 0 or timeout_s <= 0:
            stages("workers joining: not waited for (they join in the background)")
            return 0
        provider = _ray_compat.get_node_provider(config["provider"], config["cluster_name"])
        deadline = time.monotonic() + timeout_s
        ready = 0
        while True:
            nodes = provider.non_terminated_nodes({_ray_compat.TAG_NODE_KIND: "worker"})
            ready = sum(
                1 for n in nodes if provider.node_tags(n).get(_ray_compat.TAG_NODE_STATUS) == "up-to-date"
            )
            stages(f"workers joining: {ready}/{want} up")
            if ready >= want:
                return ready
            if time.monotonic() >= deadline:
                stages(
                    f"workers joining: only {ready}/{want} up after {timeout_s / 60:.0f} min; the head keeps "
                    "trying (capacity or quota?). Its autoscaler log: ray exec <config> "
                    "'tail -n 100 /tmp/ray/session_latest/logs/monitor*'"
                )
                return ready
            time.sleep(poll_s)

    def _failure_message(
        self, spec: ClusterSpec, plan: Plan, code: str | None, desc: str, report: TeardownReport
    ) -> str:
        worker = plan.resolved.worker
        lines = [
            f"Launching {spec.cloud} cluster {spec.name} failed: {code + ': ' if code else ''}{desc}".rstrip()
        ]
        if code in CAPACITY_CODES or "quota" in desc.lower() or "capacity" in desc.lower():
            lines.append(
                f"{spec.cloud} has no capacity or quota for this request in {spec.region} right now."
            )
            alts = self.alternatives(spec, worker)
            if alts:
                lines.append("Alternatives: " + "; ".join(alts))
            if spec.cloud in QUOTA_URLS:
                lines.append(f"Or request a quota increase: {QUOTA_URLS[spec.cloud]}")
        lines.append("Cleanup: " + report.message())
        return "\n".join(lines)

    def alternatives(self, spec: ClusterSpec, worker: InstanceChoice) -> list[str]:
        """Other regions with this instance type and other instance types with this GPU (cheapest first)."""
        out: list[str] = []
        try:
            cat = self.catalog
            if cat is None:
                from gpu_notebook.catalog import get_catalog

                cat = get_catalog()
            it = cat.get(spec.cloud, worker.name)
            regions = []
            for region in getattr(it, "regions", []):
                if region != spec.region:
                    try:
                        regions.append(
                            (it.price(region, market="spot" if spec.spot else "on_demand"), region)
                        )
                    except Exception:
                        continue
            if regions:
                out.append(
                    f"{worker.name} in " + ", ".join(f"{r} (${p:.2f}/h)" for p, r in sorted(regions)[:4])
                )
            if worker.gpu:
                others = [
                    o
                    for o in cat.find(spec.cloud, gpu=worker.gpu, region=spec.region)
                    if o.name != worker.name
                ]
                if others:
                    out.append(
                        f"other {worker.gpu} instances in {spec.region}: "
                        + ", ".join(f"{o.name} ({o.gpu_count}x)" for o in others[:4])
                    )
        except Exception:
            pass
        out.append("--spot off (on-demand)" if spec.spot else "--spot (a separate capacity pool)")
        return out

    def _launch_kube(
        self, spec: ClusterSpec, plan: Plan, state: ClusterState, stages: _Stages, poll_s: float = 5.0
    ) -> ClusterState:
        api, core = self._kube_clients or _kube.make_clients()
        state.save()
        try:
            stages("applying RayCluster")
            _kube.apply_raycluster(plan.config, api)
            stages("waiting for the head pod")
            _kube.wait_head_ready(str(spec.name), spec.namespace, api, poll_s=poll_s, progress=stages)
        except BaseException as exc:
            stages("launch failed: deleting the RayCluster")
            report = self._teardown_kube(state, stages, poll_s=poll_s)
            state.status, state.error = "failed", f"{type(exc).__name__}: {exc}"
            if report.clean:
                delete_state(state.name)
            else:
                state.save()
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise LaunchError(
                f"Applying RayCluster {spec.name} failed: {exc}\nCleanup: {report.message()}", report
            ) from exc
        state.client_address = _kube.head_service_address(str(spec.name), spec.namespace)
        if spec.connect == "tunnel":
            import shutil

            if shutil.which(self.kubectl):
                stages("port-forwarding the head's Ray Client port (kubectl)")
                try:
                    self.open_kube_port_forward(state, kubectl=self.kubectl)
                except Exception as exc:
                    stages(f"port-forward failed ({exc}); using the in-cluster address")
            else:
                stages(
                    "no kubectl here: using the in-cluster address (run the notebook in the cluster, or "
                    f"kubectl port-forward svc/{spec.name}-head-svc 10001)"
                )
        state.status = "running"
        stages("ready")
        state.save()
        return state

    # -- teardown -----------------------------------------------------------------------------------------

    def teardown(
        self,
        cluster: ClusterState | str,
        progress: Progress | None = None,
        verify_timeout_s: float = 300.0,
        poll_s: float = 5.0,
    ) -> TeardownReport:
        """Terminate every node of ``cluster`` (a state or a saved name) and verify through the cloud API.

        The state file is removed when nothing is left; otherwise it stays (status ``stop-incomplete``) so
        ``list`` keeps showing the cluster.
        """
        state = load_state(cluster) if isinstance(cluster, str) else cluster
        stages = _Stages(progress)
        self.close_tunnel(state)
        state.status = "stopping"
        state.save()
        if state.cloud == "kubernetes":
            report = self._teardown_kube(state, stages, verify_timeout_s, poll_s)
        else:
            output = _LauncherOutput(state.path.with_suffix(".log"), self.verbose)
            with output:
                stages.console = output.real_stdout
                try:
                    report = self._teardown_config(state.config, stages, verify_timeout_s, poll_s)
                finally:
                    stages.console = None
        if report.clean:
            state.status = "stopped"
            delete_state(state.name)
        else:
            state.status = "stop-incomplete"
            state.error = report.message()
            state.save()
        stages(report.message())
        return report

    def _leftovers(self, config: dict[str, Any], report: TeardownReport) -> list[dict[str, Any]] | None:
        try:
            return leftovers_for(config)
        except VerificationUnavailable as exc:
            report.errors.append(str(exc))
        except Exception as exc:
            report.errors.append(f"{type(exc).__name__}: {exc}")
        return None

    def _teardown_config(
        self, config: dict[str, Any], stages: _Stages, verify_timeout_s: float = 300.0, poll_s: float = 5.0
    ) -> TeardownReport:
        name = config["cluster_name"]
        report = TeardownReport(name=name, cloud=config["provider"]["type"])
        report.found_before = self._leftovers(config, report) or []
        stages("stopping Ray and terminating nodes (ray down)")
        try:
            _ray_compat.teardown_cluster(config)
        except (SystemExit, Exception) as exc:  # Ray's launcher aborts with ClickException or sys.exit
            report.errors.append(f"teardown_cluster: {type(exc).__name__}: {exc}")
        stages("verifying through the cloud API")
        deadline = time.monotonic() + verify_timeout_s
        forced_once = False
        while True:
            left = self._leftovers(config, report)
            if left is None:
                report.verified = False
                break
            report.verified = True
            report.leftovers = left
            if not left or time.monotonic() >= deadline:
                break
            live = [i for i in left if i["kind"] == "instance" and i["state"] != "shutting-down"]
            if live and not forced_once and report.cloud == "aws":
                forced_once = True
                report.forced = self._force_terminate_aws(config, [i["id"] for i in live], report)
            time.sleep(poll_s)
        return report

    def _force_terminate_aws(
        self, config: dict[str, Any], ids: list[str], report: TeardownReport
    ) -> list[str]:
        import boto3

        prov = config["provider"]
        try:
            ec2 = boto3.client("ec2", region_name=prov["region"], **(prov.get("aws_credentials") or {}))
            ec2.terminate_instances(InstanceIds=ids)
            return ids
        except Exception as exc:
            report.errors.append(f"terminate_instances: {type(exc).__name__}: {exc}")
            return []

    def _teardown_kube(
        self, state: ClusterState, stages: _Stages, verify_timeout_s: float = 300.0, poll_s: float = 5.0
    ) -> TeardownReport:
        api, core = self._kube_clients or _kube.make_clients()
        ns = state.spec.get("namespace", "default")
        report = TeardownReport(name=state.name, cloud="kubernetes")
        if _kube.get_raycluster(state.name, ns, api) is not None:
            report.found_before.append({"kind": "raycluster", "id": f"{ns}/{state.name}"})
        stages("deleting RayCluster")
        try:
            _kube.delete_raycluster(state.name, ns, api)
        except Exception as exc:
            report.errors.append(f"delete: {type(exc).__name__}: {exc}")
        deadline = time.monotonic() + verify_timeout_s
        while True:
            left: list[dict[str, Any]] = []
            if _kube.get_raycluster(state.name, ns, api) is not None:
                left.append({"kind": "raycluster", "id": f"{ns}/{state.name}", "state": "deleting"})
            left += [
                {"kind": "pod", "id": p, "state": "terminating"}
                for p in _kube.cluster_pods(state.name, ns, core)
            ]
            report.verified, report.leftovers = True, left
            if not left or time.monotonic() >= deadline:
                return report
            time.sleep(poll_s)

    # -- inspection ---------------------------------------------------------------------------------------

    def list_clusters(self) -> list[ClusterState]:
        """Saved clusters (including ones a previous kernel started)."""
        return list_states()

    def status(self, cluster: ClusterState | str) -> dict[str, Any]:
        """Saved state plus what the cloud API says is running under the cluster's tag."""
        state = load_state(cluster) if isinstance(cluster, str) else cluster
        report = TeardownReport(state.name, state.cloud)
        nodes = None
        if state.cloud == "kubernetes":
            api, core = self._kube_clients or _kube.make_clients()
            ns = state.spec.get("namespace", "default")
            nodes = [{"kind": "pod", "id": p} for p in _kube.cluster_pods(state.name, ns, core)]
        else:
            nodes = self._leftovers(state.config, report)
        return {"state": state, "nodes": nodes, "errors": report.errors}

    @classmethod
    def open_tunnel(
        cls, state: ClusterState, local_port: int | None = None, timeout_s: float = 30.0, ssh: str = "ssh"
    ) -> str:
        """Start ``ssh -N -L`` to the head in the background; return ``ray://127.0.0.1:<port>`` once it listens.

        The ssh process id is saved in the state (``tunnel_pid``) and ended by :meth:`close_tunnel` and by
        :meth:`teardown`.
        """
        port = local_port or _free_local_port()
        cmd = cls.ssh_tunnel_command(state, port)
        cmd[0] = ssh
        return _start_forward(state, cmd, port, timeout_s, f"ssh tunnel to {state.head_ip}")

    @classmethod
    def open_kube_port_forward(
        cls,
        state: ClusterState,
        local_port: int | None = None,
        timeout_s: float = 60.0,
        kubectl: str = "kubectl",
    ) -> str:
        """``kubectl port-forward`` to the RayCluster's head service; returns ``ray://127.0.0.1:<port>``."""
        port = local_port or _free_local_port()
        ns = state.spec.get("namespace", "default")
        cmd = [kubectl, "port-forward", "-n", ns, f"svc/{state.name}-head-svc", f"{port}:{RAY_CLIENT_PORT}"]
        return _start_forward(state, cmd, port, timeout_s, f"kubectl port-forward to {ns}/{state.name}")

    @staticmethod
    def close_tunnel(state: ClusterState) -> bool:
        """End the ssh tunnel :meth:`open_tunnel` started (by its saved process id); True if one was ended."""
        import os
        import signal

        pid = state.tunnel_pid
        state.tunnel_pid = None
        if not pid:
            return False
        try:
            os.kill(pid, signal.SIGTERM)
            return True
        except ProcessLookupError:
            return False

    @staticmethod
    def ssh_tunnel_command(
        state: ClusterState, local_port: int = RAY_CLIENT_PORT, key_path: str | None = None
    ) -> list[str]:
        """``ssh -N -L`` command that forwards the head's Ray Client port to ``127.0.0.1:local_port``."""
        auth = state.config.get("auth", {})
        key = key_path or state.ssh_key or auth.get("ssh_private_key")
        if key is None and state.cloud == "aws":
            key = f"~/.ssh/ray-autoscaler_{state.region}.pem"
        cmd = [
            "ssh",
            "-N",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "ServerAliveInterval=30",
            "-L",
            f"{local_port}:localhost:{RAY_CLIENT_PORT}",
        ]
        if key:
            import os

            cmd += ["-i", os.path.expanduser(key)]
        cmd.append(f"{auth.get('ssh_user', 'ubuntu')}@{state.head_ip}")
        return cmd


def _free_local_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_forward(state: ClusterState, cmd: list[str], port: int, timeout_s: float, what: str) -> str:
    """Start a port-forwarding process, wait until 127.0.0.1:port accepts, record its pid in the state."""
    import socket
    import subprocess

    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
            raise RuntimeError(f"{what} exited ({proc.returncode}): {err[-500:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if time.monotonic() >= deadline:
                proc.kill()
                raise TimeoutError(f"{what} not listening after {timeout_s:.0f} s") from None
            time.sleep(0.1)
    state.tunnel_pid = proc.pid
    state.client_address = f"ray://127.0.0.1:{port}"
    state.save()
    return state.client_address


def plan_cluster(spec: ClusterSpec, catalog: Any = None) -> Plan:
    """Shortcut for ``CloudLauncher(catalog).plan(spec)`` (``--dry-run``)."""
    return CloudLauncher(catalog).plan(spec)


def spec_from_options(
    cloud: str,
    region: str | None = None,
    gpu: str | None = None,
    instance_type: str | None = None,
    workers: int = 1,
    spot: bool = False,
    idle_stop: float | None = None,
    **extra: Any,
) -> ClusterSpec:
    """Build a :class:`ClusterSpec` from ``%gpu_cluster start`` options (``--idle-stop`` in minutes)."""
    return ClusterSpec(
        cloud=cloud,
        region=region,
        gpu=gpu,
        instance_type=instance_type,
        workers=workers,
        spot=spot,
        idle_stop_minutes=idle_stop,
        **extra,
    )


__all__ = [
    "CloudLauncher",
    "CloudRequestError",
    "LaunchError",
    "Plan",
    "TeardownReport",
    "plan_cluster",
    "spec_from_options",
]
