"""``binder/``: the pins are the versions the tests run, they cover what the examples import, and they resolve.

Binder itself cannot be built here (it needs Docker and repo2docker). What can be checked:

* every line of ``binder/requirements.txt`` is an exact pin (or the index option, or the checkout itself);
* a package that ``constraints-dev.txt`` pins has the same pin, and every pin holds for the version installed
  in this test environment (the versions the suite ran with);
* every dependency of ``gpu_notebook[all]`` is pinned, and so is ``jupyter-server-proxy`` (the dashboard links);
* every module the example notebooks import is in the standard library or in a pinned distribution (or one
  of their dependencies), and ``binder/runtime.txt`` names this Python;
* NETWORK: ``uv pip install --dry-run`` resolves the file for a fresh environment against PyPI (skipped when
  PyPI cannot be reached). Where the CPU index of PyTorch cannot be reached the local wheel folder of pip's
  find-links stands in for it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder" / "requirements.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _lines(path: Path) -> list[str]:
    return [
        ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines() if ln.split("#", 1)[0].strip()
    ]


def _binder() -> tuple[list[str], dict[str, Requirement], list[str]]:
    """(options, pins by canonical name, local paths)."""
    options, pins, local = [], {}, []
    for ln in _lines(BINDER):
        if ln.startswith("-"):
            options.append(ln)
        elif ln.startswith("."):
            local.append(ln)
        else:
            req = Requirement(ln)
            pins[canonicalize_name(req.name)] = req
    return options, pins, local


def _constraints() -> dict[str, Requirement]:
    reqs = [Requirement(ln) for ln in _lines(ROOT / "constraints-dev.txt")]
    return {canonicalize_name(r.name): r for r in reqs}


def _pinned(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req}: binder pins exact versions"
    return spec.version


def _extra_requires(extras: set[str]) -> list[Requirement]:
    """gpu_notebook's requirements for ``extras`` (the ``all`` extra expanded), from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = [Requirement(r) for r in project["dependencies"]]
    todo = list(extras)
    while todo:
        for r in map(Requirement, project["optional-dependencies"][todo.pop()]):
            if canonicalize_name(r.name) == "gpu-notebook":
                todo += list(r.extras)
            else:
                out.append(r)
    return out


def test_pins_are_the_tested_versions_and_cover_the_package() -> None:
    options, pins, local = _binder()
    assert options == [f"--extra-index-url {CPU_INDEX}"]  # the CPU build of torch
    assert local == [".[all]"]
    versions = {name: _pinned(req) for name, req in pins.items()}
    for name, req in _constraints().items():
        if name in pins:
            assert req.specifier == pins[name].specifier, (
                f"{name}: binder {pins[name]}, constraints-dev {req}"
            )
    for req in pins.values():
        installed = metadata.version(req.name)
        # torch==2.13.0 holds for the 2.13.0+cpu build the suite runs (a local version label is ignored)
        assert req.specifier.contains(Version(installed), prereleases=True), (
            f"binder pins {req}, the tests run {req.name} {installed}"
        )
    missing = (
        sorted(
            {canonicalize_name(r.name) for r in _extra_requires({"all"})} | {"jupyter-server-proxy", "torch"}
        )
        - versions.keys()
    )
    assert not missing, f"not pinned in binder/requirements.txt: {missing}"
    for r in _extra_requires({"all"}):  # each pin satisfies what the package asks for
        assert r.specifier.contains(versions[canonicalize_name(r.name)], prereleases=True), (r, versions)
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert runtime == f"python-{sys.version_info.major}.{sys.version_info.minor}"


def _imports(notebook: Path) -> set[str]:
    mods: set[str] = set()
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        # IPython lines (%magic, !shell) are not Python
        code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())
        if src.lstrip().startswith("%%"):
            continue  # a cell magic's body (%%distributed runs Python, but its imports are checked below too)
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods.add(node.module.split(".")[0])
    return mods


def _cell_magic_imports(notebook: Path) -> set[str]:
    mods: set[str] = set()
    for cell in json.loads(notebook.read_text())["cells"]:
        src = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        if src.lstrip().startswith("%%"):
            mods |= set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", src.split("\n", 1)[-1], re.M))
    return mods


def _closure(names: set[str]) -> set[str]:
    """The distributions ``names`` install, with their dependencies (as installed here)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for r in map(Requirement, reqs):
            if r.marker is None or r.marker.evaluate({"extra": "default"}):
                todo.append(r.name)
    return seen


def test_every_example_import_is_installed_by_binder() -> None:
    _, pins, _ = _binder()
    dists = _closure(set(pins) | {r.name for r in _extra_requires({"all"})})
    by_module = metadata.packages_distributions()
    notebooks = sorted((ROOT / "examples").glob("*.ipynb"))
    assert notebooks
    for nb in notebooks:
        for mod in sorted(_imports(nb) | _cell_magic_imports(nb)):
            if mod in sys.stdlib_module_names or mod == "gpu_notebook":
                continue
            owners = {canonicalize_name(d) for d in by_module.get(mod, [])}
            assert owners & dists, (
                f"{nb.name} imports {mod!r}, which binder/requirements.txt does not install"
            )


def _reachable(host: str) -> bool:
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_binder_requirements_resolve_for_a_fresh_environment(tmp_path) -> None:
    """NETWORK (PyPI): resolves, installs nothing. Skipped offline."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        pytest.skip("uv is not installed in the test environment (scripts/setup_env.sh installs it)")
    if not _reachable("pypi.org"):
        pytest.skip("PyPI cannot be reached: the dry-run resolution needs the network")
    # pip (what repo2docker runs) takes the best match across indexes; uv's default takes the first index only
    args = ["--index-strategy", "unsafe-best-match"]
    text = BINDER.read_text().replace(".[all]", f"gpu_notebook[all] @ {ROOT.as_uri()}")
    if not _reachable("download.pytorch.org"):
        # this machine keeps the CPU build of torch in pip's find-links; resolve it from there
        text = text.replace(f"--extra-index-url {CPU_INDEX}", "")
        for d in os.environ.get("PIP_FIND_LINKS", "").split():
            args += ["--find-links", d]
    (tmp_path / "requirements.txt").write_text(text)
    subprocess.run([str(uv), "venv", "-q", str(tmp_path / "venv"), "--python", sys.executable], check=True)
    run = subprocess.run(
        [str(uv), "pip", "install", "--dry-run", "--python", str(tmp_path / "venv" / "bin" / "python"), *args]
        + ["-r", str(tmp_path / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    would = dict(re.findall(r"^ \+ ([\w.-]+(?:\[[\w,]+\])?)==(\S+)", run.stderr + run.stdout, re.M))
    would = {canonicalize_name(k.split("[")[0]): v for k, v in would.items()}
    _, pins, _ = _binder()
    for name, req in pins.items():
        assert name in would, f"{name} missing from the resolution:\n{run.stderr[-3000:]}"
        assert req.specifier.contains(Version(would[name]), prereleases=True), (req, would[name])
    assert re.search(r"^ \+ gpu-notebook @ file://", run.stderr + run.stdout, re.M), run.stderr[-3000:]
