"""Shared test fixtures: one real local Ray cluster for the whole session, and a 2-worker gloo group on it."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_memory_usage_threshold", "0.98")
os.environ.pop("CUDA_VISIBLE_DEVICES", None)


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
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable
