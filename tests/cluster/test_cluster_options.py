"""The Cluster's settings in dataclasses (gpu_notebook/cluster/options.py): the flat keywords and the grouped form
make the same cluster settings, the defaults are the old keywords', and a wrong or doubled keyword is a TypeError.
No Ray: nothing here starts a cluster."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import gpu_notebook
from gpu_notebook.cluster import CloudLaunch, Cluster, Policies, Resources, Runtime, WorkerSetup
from gpu_notebook.cluster.options import GROUPS, KEYWORDS, ClusterOptions, gather

#: the values the keywords had when every one of them was a keyword of Cluster.__init__ or a key of **options
#: (absent meant None, except for these): one place, and the dataclasses' defaults are checked against it
OLD_DEFAULTS: dict[str, Any] = {
    "backend": "auto",
    "gpu_visibility": "node",
    "dashboard": False,
    "ship_package": True,  # absent: shipped (only ``is False`` turned it off)
    "spot": False,  # absent: bool(None)
    "reaper": True,  # absent: a reaper (only ``is False`` turned it off)
    "detach": False,  # new with detached clusters: off, as every cluster was
}


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def test_every_default_is_the_old_keyword_default() -> None:
    for group, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            assert _default(f) == OLD_DEFAULTS.get(f.name), (group, f.name)
    made = gather({}, {})
    for name, group in KEYWORDS.items():
        assert getattr(getattr(made, group), name) == OLD_DEFAULTS.get(name), name


def test_the_keyword_table_is_the_fields() -> None:
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) == len(KEYWORDS)  # no field in two groups
    assert {"workers", "cpus_per_worker", "idle_stop", "budget", "max_result_bytes", "cloud"} <= set(KEYWORDS)
    assert not set(KEYWORDS) & {"name", "address", "timeouts"}  # the Cluster's own keywords, not settings


def _some_value(name: str, f: dataclasses.Field[Any]) -> Any:
    """A valid non-default value for each setting."""
    special = {
        "backend": "gloo",
        "gpu_visibility": "own",
        "worker_setup": WorkerSetup(pip=("numpy",)),
        "runtime_env": {"env_vars": {"X": "1"}},
        "on_budget_checkpoint": print,
        "node_pricing": {"a": 1.0},
        "cloud": "aws",
        "connect": "direct",
    }
    if name in special:
        return special[name]
    default = _default(f)
    if isinstance(default, bool):
        return not default
    if "int" in str(f.type):
        return 3
    if "float" in str(f.type):
        return 2.5
    return f"{name}-x"


def test_flat_keywords_and_dataclasses_make_the_same_settings() -> None:
    flat = {f.name: _some_value(f.name, f) for cls in GROUPS.values() for f in dataclasses.fields(cls)}
    grouped = {
        group: cls(**{f.name: flat[f.name] for f in dataclasses.fields(cls)}) for group, cls in GROUPS.items()
    }
    a, b = Cluster(**flat), Cluster(**grouped)
    assert a.settings == b.settings == ClusterOptions(**grouped)
    assert dict(a.options) == dict(b.options) == flat  # what the cost layer reads, the same either way
    mixed = Cluster(resources=Resources(workers=2, cpus_per_worker=0.5), idle_stop=30)
    assert mixed.settings == Cluster(workers=2, cpus_per_worker=0.5, idle_stop=30).settings
    assert mixed.settings.resources == Resources(workers=2, cpus_per_worker=0.5)
    assert mixed.settings.policies == Policies(idle_stop=30)
    assert mixed.settings.runtime == Runtime() and mixed.settings.launch == CloudLaunch()


def test_an_unknown_keyword_names_the_nearest_setting() -> None:
    with pytest.raises(TypeError, match="'cpu_per_worker' .*did you mean 'cpus_per_worker'"):
        Cluster(workers=2, cpu_per_worker=0.5)
    with pytest.raises(TypeError, match="'idle_stop_minutes'.*'idle_stop'"):
        Cluster(idle_stop_minutes=5)
    with pytest.raises(TypeError, match="Resources, Runtime, Policies, CloudLaunch"):
        Cluster(frobnicate=1)


def test_a_setting_given_twice_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"workers both as a keyword and in resources=Resources\(...\)"):
        Cluster(workers=2, resources=Resources(cpus_per_worker=1))
    with pytest.raises(TypeError, match="budget, idle_stop both"):
        Cluster(policies=Policies(), idle_stop=5, budget=1)
    with pytest.raises(TypeError, match="takes a Runtime, not dict"):
        Cluster(runtime={"dashboard": True})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Resources(workers=0), "--workers must be at least 1"),
        (lambda: Resources(cpus_per_worker=math.nan), "--cpus-per-worker must be a finite number"),
        (lambda: Resources(gpus_per_worker=-1), "--gpus-per-worker must be a finite number"),
        (lambda: Resources(backend="nccl", gpus_per_worker=0), "--backend nccl needs a GPU"),
        (lambda: Policies(idle_stop=0), "--idle-stop must be a positive number of minutes"),
        (lambda: Policies(budget=math.inf), "--budget must be a positive number of US dollars"),
        (lambda: Cluster(workers=0), "--workers must be at least 1"),
        (lambda: Cluster(budget=-1), "--budget must be a positive"),
    ],
)
def test_values_are_checked_when_made(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_the_dataclasses_are_frozen_and_public() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Resources().workers = 3  # type: ignore[misc]
    for name in ("Resources", "Runtime", "Policies", "CloudLaunch"):
        assert name in gpu_notebook.__all__ and getattr(gpu_notebook, name) is GROUPS_BY_NAME[name]
        assert name in gpu_notebook.cluster.__all__


GROUPS_BY_NAME = {cls.__name__: cls for cls in GROUPS.values()}


def test_node_pricing_set_after_a_launch_is_what_the_cost_layer_reads() -> None:
    c = Cluster(workers=1)
    assert "node_pricing" not in c.options
    c.node_pricing = {"n": 1.0}  # what a cloud provider does once launched
    assert c.options["node_pricing"] == {"n": 1.0}
    assert c.settings.policies.node_pricing is None  # the settings stay as given
    with pytest.raises(TypeError):
        c.options["budget"] = 3  # type: ignore[index]
