"""The JupyterLab panel's front end as installed: the built extension, what ``jupyter labextension list`` and
``jupyter server extension list`` say after ``scripts/setup_env.sh``, and a wheel built without node.

The front end is built from ``labextension/`` into ``gpu_notebook/labextension/`` where node is present
(scripts/setup_env.sh); the wheel carries it as data files under ``share/jupyter/labextensions/gpu-notebook/``. A
wheel built without it still installs, with the server extension's config, and ``%load_ext gpu_notebook`` then
says once, in one line, that the panel is not built. Without node on a developer's machine the tests of the built
extension skip; under ``CI=true`` they fail, as CI builds it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "gpu_notebook" / "labextension"
LABEXT = "share/jupyter/labextensions/gpu-notebook"
SERVER_CONFIG = "etc/jupyter/jupyter_server_config.d/gpu_notebook.json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# %load_ext twice (with an unload between) in one IPython: the note comes once per process
LOAD_EXT_TWICE = """
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "gpu_notebook")
ip.run_line_magic("unload_ext", "gpu_notebook")
ip.run_line_magic("load_ext", "gpu_notebook")
import gpu_notebook
print("loaded from", gpu_notebook.__file__)
"""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _need_built() -> None:
    if (BUILT / "package.json").is_file():
        return
    what = "the JupyterLab panel is not built (scripts/setup_env.sh builds it where node is present)"
    if _in_ci() or shutil.which("node"):
        pytest.fail(what)
    pytest.skip(what)


def _jupyter(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return ANSI.sub("", out.stdout + out.stderr)


def test_the_built_extension_is_ours_with_a_remote_entry() -> None:
    _need_built()
    meta = json.loads((BUILT / "package.json").read_text())
    assert meta["name"] == "gpu-notebook"
    assert meta["version"] == json.loads((ROOT / "labextension" / "package.json").read_text())["version"]
    entry = meta["jupyterlab"]["_build"]["load"]
    assert re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", entry), entry
    assert (BUILT / entry).is_file()
    # the shared JupyterLab packages come from the page, not from our bundle: it stays small
    assert sum(p.stat().st_size for p in (BUILT / "static").glob("*.js")) < 300_000


def test_jupyter_lists_the_front_end_and_the_server_extension_enabled_and_ok() -> None:
    _need_built()
    labext = _jupyter("labextension", "list")
    assert re.search(r"gpu-notebook v\S+ enabled\s+OK", labext), labext
    server = _jupyter("server", "extension", "list")
    assert re.search(r"gpu_notebook\.labpanel\s+enabled", server), server
    assert re.search(r"gpu_notebook\.labpanel\s+OK", server), server


def _source_copy(dst: Path) -> Path:
    """The files git tracks or would (what a clone has): no node_modules, no built front end."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    return dst


def _wheel(src: Path, out: Path) -> Path:
    # offline, with this environment's setuptools; CC=/bin/false skips the (optional) C kernels, which this test
    # is not about, to keep it short
    env = {k: v for k, v in os.environ.items() if k != "GPU_NOTEBOOK_BUILD_NATIVE"}
    env.update(CC="/bin/false", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    got = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    (wheel,) = out.glob("gpu_notebook-*.whl")
    return wheel


def _data_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n.split(".data/data/", 1)[1] for n in z.namelist() if ".data/data/" in n}


def _fresh_prefix(path: Path) -> Path:
    """A new virtual environment (its own sys.prefix, so its own share/jupyter) that sees this environment's
    packages (IPython, numpy) through a .pth file, but not its installed front end."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    (site,) = path.glob("lib/python*/site-packages")
    import IPython

    (site / "_outer.pth").write_text(str(Path(IPython.__file__).parents[1]) + "\n")
    return path


def _install(wheel: Path, prefix: Path) -> None:
    """Install ``wheel`` into ``prefix`` with this environment's pip. ``--ignore-installed``: without it pip first
    uninstalls the gpu_notebook of the environment it runs in (this checkout's editable install)."""
    got = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed"]
        + ["--prefix", str(prefix), str(wheel)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    assert "Uninstalling" not in got.stdout + got.stderr, got.stdout


def _load_ext(python: Path, home: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_PATH", "PYTHONPATH")}
    env.update(JUPYTER_DATA_DIR=str(home / "jupyter-data"), HOME=str(home), JUPYTER_PLATFORM_DIRS="0")
    out = subprocess.run(
        [str(python), "-c", LOAD_EXT_TWICE], env=env, capture_output=True, text=True, timeout=120, cwd=home
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout.splitlines()


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the project's git checkout")
def test_a_wheel_built_without_node_installs_and_load_ext_says_once_the_panel_is_not_built(
    tmp_path: Path,
) -> None:
    for system in ("/usr/local/share/jupyter", "/usr/share/jupyter"):
        if Path(system, "labextensions", "gpu-notebook").exists():
            pytest.skip(f"a gpu-notebook front end is installed system-wide in {system}")
    src = _source_copy(tmp_path / "src")
    assert not (src / "gpu_notebook" / "labextension").exists()  # a clone has no build
    wheel = _wheel(src, tmp_path / "dist")
    files = _data_files(wheel)
    assert SERVER_CONFIG in files  # the server extension is enabled by any install
    assert not [f for f in files if f.startswith(LABEXT)], sorted(files)

    prefix = _fresh_prefix(tmp_path / "env")
    _install(wheel, prefix)
    assert (prefix / SERVER_CONFIG).is_file()
    assert not (prefix / LABEXT).exists()

    home = tmp_path / "home"
    home.mkdir()
    lines = _load_ext(prefix / "bin" / "python", home)
    assert any(line.startswith("loaded from " + str(prefix)) for line in lines), lines  # the wheel's package
    notes = [line for line in lines if "JupyterLab panel" in line]
    assert len(notes) == 1, lines  # once per process, one line
    assert "is not built" in notes[0] and "node" in notes[0] and "scripts/setup_env.sh" in notes[0]


def test_a_wheel_built_with_the_front_end_carries_it_and_load_ext_is_quiet(tmp_path: Path) -> None:
    _need_built()
    src = _source_copy(tmp_path / "src")
    shutil.copytree(BUILT, src / "gpu_notebook" / "labextension")
    wheel = _wheel(src, tmp_path / "dist")
    files = _data_files(wheel)
    assert f"{LABEXT}/package.json" in files and f"{LABEXT}/install.json" in files
    entry = json.loads((BUILT / "package.json").read_text())["jupyterlab"]["_build"]["load"]
    assert f"{LABEXT}/{entry}" in files
    prefix = _fresh_prefix(tmp_path / "env")
    _install(wheel, prefix)
    assert (prefix / LABEXT / "package.json").is_file()
    home = tmp_path / "home"
    home.mkdir()
    lines = _load_ext(prefix / "bin" / "python", home)
    assert not [line for line in lines if "JupyterLab panel" in line], lines
