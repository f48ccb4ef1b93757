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


# ---- the whole suite on two workers (scripts/test.sh runs ``pytest -n 2 --dist loadscope --no-loadscope-reorder``)
# The tests that start a Ray (or a browser and a kernel) of their own each take both cores of a small machine for
# a minute or more: they run one after another on one worker, first, while the other worker runs the rest on the
# session's Ray. Every other file stays whole on one worker (its module fixtures run once, its tests in order).
OWN_RAY_FILES = (
    "tests/widgets/test_journey_browser.py",
    "tests/cluster/test_small_machine.py",
    "tests/cluster/test_multinode.py",
    "tests/cluster/test_ship_package.py",
    "tests/examples/test_teaching_examples.py",
    "tests/distributed/test_gpu_mapping.py",
    "tests/checkpoint/test_checkpoint_example.py",
    "tests/examples/test_html_fallbacks.py",
    "tests/checkpoint/test_checkpoint_benchmark.py",
    "tests/cluster/test_workshop.py",
    "tests/widgets/test_monitor_browser.py",
)


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "own-ray" if path in OWN_RAY_FILES else path


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: only called when it runs the suite
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class OwnRayTogether(LoadScopeScheduling):
        """Each test file is a unit of work, the files of OWN_RAY_FILES together are one."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return OwnRayTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the longest unit first, so it never starts last
        items.sort(key=lambda item: _unit(item.nodeid) != "own-ray")


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
