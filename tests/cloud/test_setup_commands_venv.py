"""The rendered cloud setup commands, run as a node runs them: in a fresh virtualenv that has no gpu_notebook.

The node is a venv that borrows this environment's packages (Ray, torch, numpy, ...) but not gpu_notebook
(gpu_notebook.testing.venv). The launcher's ``file_mounts`` are played as Ray plays a folder mount (its rsync of
``local/`` to ``remote/``): each local folder's contents are copied into its remote path under the node's HOME
(``~`` on the node), and every setup command runs unchanged in bash. Offline: pip may use no package index
(``PIP_NO_INDEX``), so a command that fetched gpu_notebook by name from one would fail here, and the sdist builds
with this environment's setuptools (no isolated build env to download).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import gpu_notebook
from gpu_notebook.cloud import ClusterSpec, _ship, render_ray_config, resolve
from gpu_notebook.testing.venv import node_venv

pytest.importorskip("ray")

PINNED = dict(image="rayproject/ray:2.60.0-py311-gpu", workers=1, project="p")


def _config(cloud: str, package: _ship.ShippedPackage) -> dict:
    spec = ClusterSpec(cloud=cloud, gpu="A100:8", name=f"gnb-venv-{cloud}", **PINNED)
    return render_ray_config(spec, resolve(spec), package)


def test_the_rendered_setup_commands_install_this_kernels_package_in_a_fresh_venv(tmp_path):
    package = _ship.package(cache=tmp_path / "cache")
    configs = {cloud: _config(cloud, package) for cloud in ("aws", "gcp", "azure")}
    # one node setup for every VM cloud: what runs below is what each of them runs
    assert (
        configs["gcp"]["setup_commands"]
        == configs["aws"]["setup_commands"]
        == configs["azure"]["setup_commands"]
    )
    assert configs["gcp"]["file_mounts"] == configs["aws"]["file_mounts"] == configs["azure"]["file_mounts"]
    config = configs["aws"]
    assert not any("gpu_notebook==" in c for c in config["setup_commands"])

    python = node_venv(tmp_path / "node")
    home = tmp_path / "home"
    home.mkdir()
    for remote, local in config["file_mounts"].items():
        assert remote.startswith("~/")
        # a folder holding only the sdist: Ray's launcher warns of a file mount, and sends whatever else is there
        assert os.path.isdir(local) and os.listdir(local) == [package.sdist.name]
        shutil.copytree(local, home / remote[2:])
    assert (home / package.remote_sdist[2:]).is_file()  # where the setup commands install it from
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        HOME=str(home),
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",  # pip reads this as --no-build-isolation (its rule for --no-* options)
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    probe = [str(python), "-c", "import gpu_notebook"]
    assert subprocess.run(probe, cwd=home, env=env, capture_output=True).returncode != 0  # the node lacks it
    for cmd in config["setup_commands"]:
        done = subprocess.run(
            ["bash", "-c", cmd], cwd=home, env=env, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"

    report = (
        "import os, gpu_notebook\n"
        "from gpu_notebook.checkpoint.format import codec\n"
        "from gpu_notebook.cloud._ship import tree_digest\n"
        "print(gpu_notebook.__version__)\n"
        "print(gpu_notebook.__file__)\n"
        "print(tree_digest(os.path.dirname(gpu_notebook.__file__)))\n"
        "print(codec.native_kernels())\n"
    )
    out = subprocess.run(
        [str(python), "-c", report], cwd=home, env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    version, file, digest, native = out[:4]
    assert version == gpu_notebook.__version__
    assert (
        file.startswith(str(tmp_path / "node" / "lib")) and "site-packages" in file
    )  # installed, not borrowed
    assert not file.startswith(os.path.dirname(os.path.dirname(gpu_notebook.__file__)))  # not this checkout
    assert digest == package.digest  # the same code, file for file
    if shutil.which("cc") or shutil.which("gcc"):
        assert native == "True"  # the C kernels were built for the node's Python


def test_an_installed_copy_ships_as_well_as_an_editable_checkout(tmp_path):
    """The package is packed from its directory: a copy elsewhere (a normal install) gives the same content."""
    copy = tmp_path / "site" / "gpu_notebook"
    shutil.copytree(_ship.source_root(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    from_copy = _ship.package(root=copy, cache=tmp_path / "cache")
    from_here = _ship.package(cache=tmp_path / "cache")
    assert (from_copy.version, from_copy.digest) == (from_here.version, from_here.digest)
    assert from_copy.sdist == from_here.sdist and from_copy.sdist.is_file()
    assert (from_copy.tree / "checkpoint" / "format" / "_planes.c").is_file()
