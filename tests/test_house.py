"""The house rules of the code base (docs/architecture.md), checked on the source tree.

Each rule here was broken once and cost a refactor to repair: modules that grew into god files, errors with no
common root (so the magics caught builtin errors and hid bugs), and import cycles between the feature packages
(dodged by imports inside functions). These tests keep them from coming back.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpu_notebook
from gpu_notebook.errors import GpuNotebookError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpu_notebook"
MAX_LINES = 650

# Subpackages that make up the library; each is a layer of the import-linter contracts in pyproject.toml.
FEATURES = ("catalog", "checkpoint", "cloud", "cluster", "cost", "distributed", "doctor", "monitor")


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_a_god_file() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def _our_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(gpu_notebook.__path__, "gpu_notebook."):
        # the magics and widgets need IPython/ipywidgets; the testing fakes mirror third-party errors
        if info.name.startswith(("gpu_notebook.testing", "gpu_notebook.magics", "gpu_notebook.widgets")):
            continue
        names.append(info.name)
    return names


def test_every_error_of_ours_derives_from_the_root() -> None:
    """Magics catch GpuNotebookError and show one line; an error outside the root would show a traceback."""
    orphans = []
    for name in _our_modules():
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional dependency (boto3, kubernetes...) is missing here
            pytest.fail(f"{name} does not import in the dev environment: {exc}")
        for cls_name, cls in vars(module).items():
            if (
                inspect.isclass(cls)
                and issubclass(cls, BaseException)
                and cls.__module__ == name
                and not cls_name.startswith("_")
                and not issubclass(cls, GpuNotebookError | Warning)
            ):
                orphans.append(f"{name}.{cls_name}")
    assert not orphans, f"exception classes outside GpuNotebookError: {orphans}"


def _function_level_imports_of_ours(path: Path) -> list[str]:
    """``import gpu_notebook...`` / ``from . import ...`` inside a function body of ``path``."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and (
                inner.level > 0 or (inner.module or "").startswith("gpu_notebook")
            ):
                found.append(
                    f"{path.relative_to(ROOT)}:{inner.lineno} from {'.' * inner.level}{inner.module}"
                )
            elif isinstance(inner, ast.Import) and any(
                a.name.startswith("gpu_notebook") for a in inner.names
            ):
                found.append(f"{path.relative_to(ROOT)}:{inner.lineno} import {inner.names[0].name}")
    return found


# Imports of our own modules inside functions that are allowed, with the reason. Everything else in the library
# imports at module level: an import inside a function to dodge a cycle hides the cycle from import-linter.
ALLOWED_LAZY = {
    # dask's Cluster._widget: the one upward edge, from the monitor to the UI layer
    "gpu_notebook/monitor/_monitor.py": ("gpu_notebook.widgets",),
    # FORMAT_VERSION is defined once, in the standalone reader.py (it can import nothing of ours), which imports
    # numpy: read when a version is checked, so that importing gpu_notebook.checkpoint loads no numpy
    "gpu_notebook/checkpoint/format/manifest.py": ("from ..reader",),
}


def test_the_library_imports_its_own_modules_at_module_level() -> None:
    offenders = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        if rel.startswith(("gpu_notebook/magics/", "gpu_notebook/widgets/", "gpu_notebook/testing/")):
            continue
        if rel == "gpu_notebook/__init__.py":  # load_ipython_extension imports the magics when called
            continue
        allowed = ALLOWED_LAZY.get(rel, ())
        offenders += [f for f in _function_level_imports_of_ours(path) if not any(a in f for a in allowed)]
    assert not offenders, "imports of our own modules inside functions:\n" + "\n".join(offenders)


def test_import_linter_contracts_hold() -> None:
    """The layers of pyproject.toml's [tool.importlinter]: a cycle or an upward import fails the build."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a dev dependency: scripts/setup_env.sh dev installs it"
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "broken" in proc.stdout and "0 broken" in proc.stdout, proc.stdout[-2000:]


def test_no_two_modules_import_each_other_even_through_others() -> None:
    """No import cycle at all, also inside a package (the layer contracts only see imports between packages)."""
    import grimp  # import-linter's graph builder

    graph = grimp.build_graph("gpu_notebook", exclude_type_checking_imports=True)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    # Tarjan's strongly connected components, iteratively: a component of more than one module is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


def test_the_suites_own_ray_group_names_files_that_exist() -> None:
    """scripts/test.sh runs the files of tests/own_ray_files.txt after the rest, on two workers of their own; a test
    file renamed out of the list would silently run its own Ray beside the first phase's tests and slow both down."""
    from conftest import OWN_RAY_FILES

    assert len(OWN_RAY_FILES) >= 10, OWN_RAY_FILES
    missing = [p for p in OWN_RAY_FILES if not (ROOT / p).is_file()]
    assert not missing, missing
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "--dist loadscope" in script and "tests/own_ray_files.txt" in script


def test_the_venv_holds_compiled_bytecode() -> None:
    """scripts/setup_env.sh installs with uv's --compile-bytecode: without .pyc files (uv writes none by default, and
    PYTHONDONTWRITEBYTECODE stops Python writing them), every kernel, rank and Ray daemon compiled torch and Ray
    from source on each import (a local Ray start took 8-9 s on the 2-core machine instead of 5.5-6.5)."""
    import importlib.util

    import ray
    import torch

    for mod in (torch, ray):
        assert mod.__file__ is not None
        cached = importlib.util.cache_from_source(mod.__file__)
        assert os.path.exists(cached), f"{cached} missing: make the .venv with scripts/setup_env.sh dev"
