"""node_venv: a second environment in a second, with or without gpu_notebook, that cannot touch this one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import gpu_notebook
from gpu_notebook.testing.venv import node_venv

PROBE = "import sys, gpu_notebook, ipykernel; print(sys.prefix); print(gpu_notebook.__file__)"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


def test_a_node_venv_lacks_gpu_notebook_and_with_gpu_notebook_imports_this_checkout_s(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"  # not this checkout: its folder would put gpu_notebook on the path
    elsewhere.mkdir()
    bare = node_venv(tmp_path / "node")
    lacks = subprocess.run(
        [str(bare), "-c", PROBE], cwd=elsewhere, env=_env(), capture_output=True, text=True
    )
    assert lacks.returncode != 0 and "No module named 'gpu_notebook'" in lacks.stderr, lacks.stderr

    python = node_venv(tmp_path / "user", with_gpu_notebook=True)
    done = subprocess.run(
        [str(python), "-c", PROBE], cwd=elsewhere, env=_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    prefix, where = done.stdout.split()
    assert Path(prefix) == tmp_path / "user"
    assert Path(where) == Path(gpu_notebook.__file__)
    # and its own site-packages holds only the link file, nothing copied
    own = next((tmp_path / "user" / "lib").glob("python*/site-packages"))
    assert sorted(p.name for p in own.iterdir()) == ["_borrowed.pth"]
