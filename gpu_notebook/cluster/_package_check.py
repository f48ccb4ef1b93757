"""Our own package on a cluster's nodes: sent with the workers' ``runtime_env``, and checked on every node at start.

A cluster reached by address (or a KubeRay one) may have no gpu_notebook, or another version, or the same version
number with other code (a checkout edited since). The rank workers are Ray actors of a class of ours, so each
node must import the code this kernel runs. :func:`with_package` adds this kernel's package (a source tree, see
:mod:`gpu_notebook.cloud._ship`) to the ``py_modules`` of the workers' ``runtime_env``; over Ray Client it goes
into the job's ``runtime_env`` instead (:func:`job_env`: the client's server on the head unpickles our classes
too); VM cloud nodes installed it in their setup commands. Either way, :func:`check_nodes` then runs one tiny task on every alive node,
in the workers' ``runtime_env``, that reports the ``gpu_notebook`` it imports (version, file, content digest),
and raises :class:`PackageMismatchError`, saying what to do, before any worker starts with the wrong code.

The probe is pickled by value (its module is given a name that no node can import), so it runs on a node that
has no gpu_notebook at all and says so instead of failing to unpickle.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gpu_notebook._display import Progress, first_line
from gpu_notebook.cloud import _ship
from gpu_notebook.cluster._errors import ClusterError

__all__ = [
    "NodePackage",
    "PackageMismatchError",
    "check_nodes",
    "job_env",
    "mismatches",
    "probe_nodes",
    "with_package",
]

#: Seconds the probes may take: the first task in a runtime_env on a node sets that env up (uploads, pip).
PROBE_TIMEOUT_S = 600.0

_F = TypeVar("_F", bound=Callable[..., Any])


class PackageMismatchError(ClusterError):
    """A node imports no gpu_notebook, or another version or other code than this kernel's."""


@dataclass(frozen=True)
class NodePackage:
    """What one node's probe found."""

    node: str  # the node's address as Ray knows it (its node id when it has none)
    python: str  # the node's Python version
    version: str | None = None  # gpu_notebook.__version__ there; None when it cannot import gpu_notebook
    file: str | None = None  # gpu_notebook.__file__ there
    digest: str | None = None  # tree_digest() of the package directory it imports
    error: str | None = None  # why the import (or the probe) failed


def with_package(runtime_env: Mapping[str, Any] | None, ship: bool, say: Progress) -> dict[str, Any]:
    """``runtime_env`` (a copy) with this kernel's package added to its ``py_modules``, unless ``ship`` is off.

    ``ship=False`` (``Runtime.ship_package``) sends nothing: the nodes must have the same gpu_notebook already.
    """
    env = dict(runtime_env or {})
    if ship is False:
        return env
    pkg = _ship.package()
    say(f"sending this kernel's gpu_notebook {pkg.version} ({pkg.digest[:12]}) to the workers")
    if _client_mode():  # already in the job's runtime_env (job_env), which the workers inherit
        return env
    env["py_modules"] = [*env.get("py_modules", []), *pkg.py_modules()]
    return env


def job_env(address: str | None, ship: bool, cloud: str | None) -> dict[str, Any] | None:
    """The job-wide ``runtime_env`` of a Ray Client (``ray://``) connection: this kernel's package, or None.

    Over Ray Client, a server process on the head unpickles the worker class before any worker starts, so the
    package must be in the job's ``runtime_env`` (Ray uploads it while connecting); the workers inherit it.
    Not for VM cloud clusters: their nodes installed it, built for their Python.
    """
    if not address or not address.startswith("ray://") or ship is False:
        return None
    if cloud and cloud != "kubernetes":
        return None
    return {"py_modules": _ship.package().py_modules()}


def _client_mode() -> bool:
    import ray

    return bool(ray.util.client.ray.is_connected())


def _by_value(fn: _F) -> _F:
    """A copy of ``fn`` that cloudpickle (Ray) sends by value: its module name is importable nowhere."""
    scope = {"__builtins__": builtins, "__name__": "__gpu_notebook_probe__"}
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__
    return copy  # type: ignore[return-value]


def _probe(package: str, digest: Callable[[str], str]) -> dict[str, Any]:
    """Runs on a node: the ``package`` it imports. Standard library only (see the module docstring)."""
    import importlib
    import os
    import sys

    out: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        module = importlib.import_module(package)
    except Exception as exc:  # noqa: BLE001 - whatever the import raises is what the user must be told
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["version"] = str(getattr(module, "__version__", "?"))
    out["file"] = str(module.__file__)
    out["digest"] = digest(os.path.dirname(os.path.abspath(str(module.__file__))))
    return out


def probe_nodes(runtime_env: Mapping[str, Any] | None, timeout: float = PROBE_TIMEOUT_S) -> list[NodePackage]:
    """Run the probe once on every alive node of the connected Ray cluster, in ``runtime_env``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(_by_value(_probe))
    digest = _by_value(_ship.tree_digest)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = []
    for n in nodes:
        opts: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
            "max_retries": 0,
        }
        if runtime_env:
            opts["runtime_env"] = dict(runtime_env)
        refs.append(task.options(**opts).remote("gpu_notebook", digest))
    out = []
    for n, ref in zip(nodes, refs, strict=True):
        where = str(n.get("NodeManagerAddress") or n["NodeID"])
        try:
            got = ray.get(ref, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - a node whose probe fails is reported with Ray's reason
            out.append(NodePackage(where, "?", error=f"{type(exc).__name__}: {first_line(str(exc))[:400]}"))
            continue
        out.append(
            NodePackage(
                where,
                str(got.get("python", "?")),
                got.get("version"),
                got.get("file"),
                got.get("digest"),
                got.get("error"),
            )
        )
    return out


def mismatches(found: list[NodePackage], version: str, digest: str) -> list[str]:
    """One line per node whose gpu_notebook is not ``version`` with content ``digest``; [] when all match.

    >>> ok = NodePackage("10.0.0.1", "3.11.7", "0.1.0", "/x/gpu_notebook/__init__.py", "ab" * 32)
    >>> mismatches([ok], "0.1.0", "ab" * 32)
    []
    >>> mismatches([NodePackage("10.0.0.2", "3.12.1", error="ModuleNotFoundError: No module named 'gpu_notebook'")],
    ...            "0.1.0", "ab" * 32)
    ["node 10.0.0.2 (Python 3.12.1): cannot import gpu_notebook (ModuleNotFoundError: No module named 'gpu_notebook')"]
    """
    lines = []
    for n in found:
        head = f"node {n.node} (Python {n.python})"
        if n.version is None:
            lines.append(f"{head}: cannot import gpu_notebook ({n.error or 'no reason given'})")
        elif n.version != version:
            lines.append(f"{head}: gpu_notebook {n.version} from {n.file}, not {version}")
        elif n.digest != digest:
            lines.append(
                f"{head}: gpu_notebook {n.version} from {n.file} is other code (content "
                f"{(n.digest or '?')[:12]}, this kernel's {digest[:12]})"
            )
    return lines


def check_nodes(
    runtime_env: Mapping[str, Any] | None,
    say: Progress,
    shipped: bool = True,
    timeout: float = PROBE_TIMEOUT_S,
) -> list[NodePackage]:
    """Check that every node imports this kernel's gpu_notebook; returns what each node reported.

    Raises
    ------
    PackageMismatchError
        A node cannot import gpu_notebook, or imports another version or other code; the message names each
        such node and what to do.
    """
    pkg = _ship.package()
    say(f"checking gpu_notebook on every node (this kernel: {pkg.version}, content {pkg.digest[:12]})")
    found = probe_nodes(runtime_env, timeout)
    bad = mismatches(found, pkg.version, pkg.digest)
    if not bad:
        return found
    if shipped:
        fix = (
            "This kernel's copy was sent to the workers, so something on those nodes comes first on sys.path "
            "(a gpu_notebook on their PYTHONPATH, or an earlier runtime_env): remove it, or install this "
            f"kernel's version there (copy {pkg.sdist} to each node and pip install it)"
        )
    else:
        fix = (
            "ship_package=False was given: the nodes must already have this kernel's version. Drop "
            "ship_package=False to let the notebook send its own copy, or install it on every node (copy "
            f"{pkg.sdist} there and pip install it)"
        )
    raise PackageMismatchError(
        f"gpu_notebook on the cluster's nodes is not this kernel's {pkg.version} (content {pkg.digest[:12]}), "
        "so the workers would run other code; none was started.\n  " + "\n  ".join(bad) + f"\n{fix}"
    )
