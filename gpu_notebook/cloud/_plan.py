"""What a launch would do, before it does it: the rendered config, the instances and their cost per hour.

:func:`make_plan` is ``--dry-run``: it resolves the request against the catalog, renders the Ray cluster
launcher config (or the KubeRay manifest), validates it with Ray's own validation and prices it. Nothing is
created and no credentials are needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any

from . import _ray_compat
from ._render import render_kuberay_manifest, render_ray_config, shipped_package, to_yaml
from ._spec import ClusterSpec, InstanceChoice, Resolved, resolve

__all__ = ["Plan", "make_plan"]


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
            + (
                (
                    f"; idle stop after {s.idle_stop_minutes:g} idle min, by this kernel"
                    if s.cloud == "kubernetes"  # the KubeRay manifest has no head-side watcher
                    else f"; head auto-stop after {s.idle_stop_minutes:g} idle min"
                )
                if s.idle_stop_minutes
                else ""
            )
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


def make_plan(spec: ClusterSpec, catalog: Any = None) -> Plan:
    """Resolve instances, render the config, validate it with Ray's own validation, price it.

    Raises
    ------
    CloudRequestError
        The request cannot be met (unknown GPU/instance, region without it); alternatives are listed.
    """
    resolved = resolve(spec, catalog)
    notes: list[str] = []
    if spec.cloud == "kubernetes":
        manifest = render_kuberay_manifest(spec)
        notes.append("Kubernetes: cost depends on your cluster's nodes; no estimate.")
        if spec.idle_stop_minutes:
            notes.append(
                "Kubernetes: the idle stop runs in this kernel (there is no watcher on the head pod): if the "
                "kernel ends first, `%gpu_cluster stop` or `kubectl delete raycluster` removes the cluster"
            )
        if spec.ship_package:
            notes.append("this kernel's gpu_notebook reaches the pods through Ray's runtime_env at start")
        return Plan(spec, resolved, manifest, "kuberay", notes)
    _ray_compat.check_ray_version()
    package = shipped_package(spec)
    config = render_ray_config(spec, resolved, package)
    _ray_compat.prepare_and_validate(config)
    head = resolved.head
    if head is not None and head.on_demand_per_hour is None:
        notes.append(f"head {head.name}: price not in the catalog, left out of the estimate")
    if spec.idle_stop_minutes:
        notes.append(
            "idle auto-stop runs on the head (gpu_notebook.cloud._idle_watch) and tears the whole "
            "cluster down; Ray's idle_timeout_minutes only removes extra workers"
        )
    installs = ", ".join(spec.pip_or_default) or "nothing from the package index"
    ours = f"; then this kernel's gpu_notebook {package.version}, sent as {package.sdist}" if package else ""
    notes.append(f"image {spec.image_or_default}; setup installs {installs}{ours}")
    return Plan(spec, resolved, config, "ray", notes)
