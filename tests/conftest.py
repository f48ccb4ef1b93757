"""Shared test fixtures: one real local Ray cluster for the whole session, and a 2-worker gloo group on it."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

from gpu_notebook.cluster._connect import NO_PRESTART

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_memory_usage_threshold", "0.98")
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
# moto's in-process servers share one global backend state, created on first use: Ray's AWS bootstrap needs
# the AWS-managed IAM policies, which moto only loads when this is set before any test starts a server.
os.environ.setdefault("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")


# ---- the whole suite in two phases (scripts/test.sh): every file but those of tests/own_ray_files.txt on two
# pytest-xdist workers (``-n 2 --dist loadscope --no-loadscope-reorder``), each file whole on one worker (its module
# fixtures run once, its tests in order) on that worker's session Ray; then the files that start a Ray (or a browser
# and a kernel) of their own, on two workers of their own, whole files again, the longest first.
OWN_RAY_FILES = tuple(
    line.strip()
    for line in open(os.path.join(os.path.dirname(__file__), "own_ray_files.txt"), encoding="utf-8")
    if line.strip() and not line.startswith("#")
)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: only called when it runs the suite
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class WholeFiles(LoadScopeScheduling):
        """Each test file is a unit of work (xdist's loadscope splits by class; pytest 9.2 ignores the suffix
        that its ``--dist loadgroup`` writes)."""

        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0]

    return WholeFiles(config, log)


def _short_tmp(prefix: str) -> str:
    # Ray's AF_UNIX socket paths must stay under 107 bytes: pytest's tmp_path is too long.
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray cluster, started once per test session (8 logical CPUs, no dashboard)."""
    import logging

    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=8,
            num_gpus=0,
            include_dashboard=False,
            object_store_memory=200 * 2**20,
            _temp_dir=_short_tmp("gnb"),
            logging_level=logging.WARNING,
            log_to_driver=False,
            _system_config=NO_PRESTART,  # as gpu_notebook's own local start
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable


@pytest.fixture(scope="session", autouse=True)
def _notebook_like_shell():
    """Create the one global test shell first, rendering HTML as a notebook kernel does, whichever test runs first."""
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    fmt = shell.display_formatter
    fmt.formatters["text/html"].enabled = True
    if "text/html" not in fmt.active_types:
        fmt.active_types = [*fmt.active_types, "text/html"]
    return shell


@pytest.fixture(scope="session")
def ip(_notebook_like_shell):
    """A real IPython InteractiveShell with ``%load_ext gpu_notebook`` done."""
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()  # the one global test shell (start_ipython() returns None once it exists)
    # render HTML as a notebook kernel does (the terminal shell only renders text/plain)
    fmt = shell.display_formatter
    fmt.formatters["text/html"].enabled = True
    if "text/html" not in fmt.active_types:
        fmt.active_types = [*fmt.active_types, "text/html"]
    shell.run_line_magic("load_ext", "gpu_notebook")
    return shell


@pytest.fixture(scope="session")
def cluster(ray_session, ip):
    """A 2-worker gloo cluster on the session's Ray, started through the magic (so magic and API agree).

    Tests may rebuild its workers (state is then reset) but must leave it running with 2 workers.
    """
    from gpu_notebook import get_manager

    ip.run_line_magic("gpu_cluster", "start --name shared --workers 2 --cpus-per-worker 0.5")
    c = get_manager().get("shared")
    assert c.running and c.world_size == 2
    yield c
    c.stop()


@pytest.fixture()
def shared(cluster, ip):
    """The shared cluster made current again (another test may have switched to its own)."""
    from gpu_notebook import get_manager

    get_manager().use(cluster.name)
    if cluster.world_size != 2:
        cluster.scale(2)
    return cluster


@pytest.fixture()
def fresh_manager(monkeypatch: pytest.MonkeyPatch):
    """An empty cluster manager as the kernel's for this test (``get_manager()`` and the magics see it); the
    session's manager, with the shared cluster, is back afterwards. Clusters added to it are not stopped at exit."""
    import atexit

    from gpu_notebook import _registry

    manager = _registry.ClusterManager()
    monkeypatch.setattr(_registry, "_MANAGER", manager)
    yield manager
    atexit.unregister(manager.stop_all)  # ClusterManager.add registers it: this manager ends with the test
