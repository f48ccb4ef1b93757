"""Our own package, shipped to a cluster's nodes at the version and content this kernel runs.

Nothing is installed on a node from a package index under our name: no ``gpu_notebook`` is published there, and
whoever published one would run code on the user's nodes with the user's credentials. The nodes get the package
this kernel imports, read from its own directory (:func:`package`), as two artifacts cached under
``~/.cache/gpu_notebook/packages/<version>-<digest>/``:

- a **source tree** (``tree/gpu_notebook``) for Ray's ``runtime_env={"py_modules": [dir]}`` on clusters reached
  by address (Ray uploads a local directory once, keyed by its content, and puts it on the workers'
  ``PYTHONPATH``). It holds the sources and the C extension built here: the extension's file name carries its ABI
  tag (``_planes.cpython-311-x86_64-linux-gnu.so``), so a node with the same Python loads it and a node with
  another Python ignores it and the checkpoint codec takes its numpy path (same bytes, slower). A wheel would be
  refused outright by ``pip`` on a node with another Python, and py_modules takes no sdist.
- an **sdist** (``sdist/gpu_notebook-<version>.tar.gz``) for cloud clusters: its folder is sent through the
  launcher's ``file_mounts`` and the file installed by ``pip install`` in the setup commands, so the C kernels
  are compiled for the node's Python (the extension stays optional: a node without a compiler still installs,
  on the numpy path). The mount is the folder, which holds nothing else, not the file: Ray warns about a file
  mount (with Docker a bind-mounted file may not see updates), and it copies a folder's contents into the
  remote path, so the file lands at :attr:`ShippedPackage.remote_sdist` all the same.

Why the sdist is written here (``tarfile`` and a generated ``pyproject.toml``/``setup.py``) instead of by
``python -m build --sdist``: the running package may be an editable checkout with edits not yet committed, or a
normal install with no project files beside it. The one thing both have is the package directory, so that is
what is shipped, file for file; the build needs no ``build`` package, no network and no compiler, and takes
milliseconds. The project metadata (name, dependencies) comes from the installed distribution; the version is
the ``__version__`` of the package's ``__init__.py``, what the nodes report back. Every ``.c`` file is built as the single-file
extension module of its name (``checkpoint/format/_planes.c`` is ``gpu_notebook.checkpoint.format._planes``).

:func:`tree_digest` names the content: a SHA-256 over the shipped files' paths and bytes (compiled files and
caches left out). The same function runs on every node (pickled by value, see
:mod:`gpu_notebook.cluster._package_check`) over the copy that node imports, so "same version" also means "same
code" for a development version that was edited without a version bump.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

__all__ = ["REMOTE_DIR", "ShippedPackage", "cache_dir", "package", "tree_digest"]

#: Where the sdist's folder lands on a cloud node, one subfolder per content (``file_mounts`` targets; Ray expands
#: ``~`` in the node's container).
REMOTE_DIR = "~/gpu_notebook_dist"
#: The file name parts that are never shipped nor hashed: build products and caches, rebuilt on the node.
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dylib", ".dll", ".o")
_SKIP_DIRS = ("__pycache__",)


def tree_digest(root: str, skip_suffixes: tuple[str, ...] = _SKIP_SUFFIXES) -> str:
    """SHA-256 (hex) of the source files under ``root``: their relative paths and bytes, in sorted order.

    Self-contained (standard library only, imported here, constants as defaults) because it is also pickled by
    value and run on nodes that may lack this package.
    """
    import hashlib
    import os

    h = hashlib.sha256()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for name in filenames:
            if name.endswith(skip_suffixes) or name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            found.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    for rel, path in sorted(found):
        with open(path, "rb") as f:
            data = f.read()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class ShippedPackage:
    """The running gpu_notebook, packed for a cluster's nodes (see the module docstring)."""

    version: str  # gpu_notebook.__version__ of the running package: what every node must report
    digest: str  # tree_digest() of its sources: what every node's copy must hash to
    tree: Path  # the package directory to ship as a py_modules entry (ends in /gpu_notebook)
    sdist: Path  # sdist/gpu_notebook-<version>.tar.gz, installable with pip on a node; alone in its folder

    @property
    def remote_sdist(self) -> str:
        """Where the sdist is put on a cloud node: one folder per content, so nodes never mix two builds."""
        return f"{REMOTE_DIR}/{self.digest[:16]}/{self.sdist.name}"

    def file_mounts(self) -> dict[str, str]:
        """The Ray launcher's ``file_mounts`` entry (remote path: local path) that sends the sdist.

        The sdist's folder, not the file: Ray syncs a local folder's contents into the remote folder, so the
        file arrives at :attr:`remote_sdist`, and a folder mount raises no "refers to a file" warning.
        """
        return {f"{REMOTE_DIR}/{self.digest[:16]}": str(self.sdist.parent)}

    def install_command(self) -> str:
        """The setup command that installs the sent sdist (replacing any gpu_notebook the image has).

        ``--force-reinstall --no-deps`` first, so a copy of the same version already on the node is replaced
        (pip keeps an installed version equal to the requested one), then a plain install for the dependencies.
        """
        path = self.remote_sdist
        return f"pip install -q --force-reinstall --no-deps {path} && pip install -q {path}"

    def py_modules(self) -> list[str]:
        """The ``runtime_env["py_modules"]`` entries that put this package on every worker's path."""
        return [str(self.tree)]

    def __repr__(self) -> str:
        return (
            f"<ShippedPackage gpu_notebook {self.version} ({self.digest[:12]}) at {self.tree.parent.parent}>"
        )


def cache_dir() -> Path:
    """Where built packages are kept (``$XDG_CACHE_HOME/gpu_notebook/packages``, else under ``~/.cache``)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "gpu_notebook" / "packages"


def source_root() -> Path:
    """The directory of the gpu_notebook this process imports (an editable checkout's or site-packages')."""
    return Path(__file__).resolve().parents[1]


def package(root: Path | None = None, cache: Path | None = None) -> ShippedPackage:
    """The running package packed for shipping; built once per version and content, then reused.

    Parameters
    ----------
    root
        The package directory (default: the imported gpu_notebook's).
    cache
        Where to keep the artifacts (default :func:`cache_dir`).
    """
    root = (root or source_root()).resolve()
    version = _version_in(root)
    digest = tree_digest(str(root))
    where = (cache or cache_dir()) / f"{version}-{digest[:16]}"
    shipped = ShippedPackage(
        version, digest, where / "tree" / "gpu_notebook", where / "sdist" / f"gpu_notebook-{version}.tar.gz"
    )
    if not (where / "done").exists():
        _build(root, version, where)
    return shipped


def _version_in(root: Path) -> str:
    """``__version__ = "..."`` read from a package directory's ``__init__.py``: what the nodes will import.

    Read, not imported: the package's root imports the layers above this one (the magics, lazily).
    """
    for line in (root / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise ValueError(f"{root}/__init__.py sets no __version__")


def _shipped_files(root: Path) -> list[Path]:
    """The files to ship, relative to ``root``: what :func:`tree_digest` hashes."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(_SKIP_SUFFIXES) and not name.startswith("."):
                out.append((Path(dirpath) / name).relative_to(root))
    return out


def _build(root: Path, version: str, where: Path) -> None:
    """Write the tree and the sdist into a fresh folder, then move it into place (another kernel may race)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=where.parent))
    try:
        files = _shipped_files(root)
        tree = tmp / "tree" / "gpu_notebook"
        for rel in files:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, tree / rel)
        # this Python's extension modules too: ABI-tagged, so a node with another Python ignores them
        for ext in root.rglob("*.so"):
            if "__pycache__" not in ext.parts:
                (tree / ext.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ext, tree / ext.relative_to(root))
        # in a folder of its own: that folder is what the launcher mounts, so nothing else may be in it
        (tmp / "sdist").mkdir()
        _write_sdist(root, files, version, tmp / "sdist" / f"gpu_notebook-{version}.tar.gz")
        (tmp / "done").write_text(version + "\n")
        try:
            tmp.rename(where)
        except OSError:  # another process built the same content first: theirs is as good
            if not (where / "done").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write_sdist(root: Path, files: list[Path], version: str, out: Path) -> None:
    """A source distribution pip can install: ``gpu_notebook-<v>/{pyproject.toml,setup.py,PKG-INFO,gpu_notebook/}``."""
    top = f"gpu_notebook-{version}"
    packages = sorted(
        ".".join(("gpu_notebook", *rel.parent.parts)) for rel in files if rel.name == "__init__.py"
    )
    package_data: dict[str, list[str]] = {}
    extensions: list[tuple[str, str]] = []
    for rel in files:
        if rel.suffix == ".py":
            continue
        if rel.suffix == ".c":
            extensions.append(
                (".".join(("gpu_notebook", *rel.parent.parts, rel.stem)), f"gpu_notebook/{rel.as_posix()}")
            )
        owner = rel.parent  # the nearest package above the file owns it as package data
        while owner.parts and ".".join(("gpu_notebook", *owner.parts)) not in packages:
            owner = owner.parent
        key = ".".join(("gpu_notebook", *owner.parts))
        package_data.setdefault(key, []).append(rel.relative_to(owner).as_posix())
    meta = _metadata()
    generated = {
        "pyproject.toml": _pyproject(version, meta),
        "setup.py": _setup_py(packages, package_data, extensions),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: gpu_notebook\nVersion: {version}\nSummary: {meta.summary}\n",
    }
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, text in generated.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
        for rel in files:
            tar.add(root / rel, arcname=f"{top}/gpu_notebook/{rel.as_posix()}", recursive=False)


class _Metadata(NamedTuple):
    summary: str
    python: str  # Requires-Python
    deps: list[str]  # the requirements outside any extra


def _metadata() -> _Metadata:
    """Summary, Python requirement and the dependencies (no extras) of the installed distribution."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("gpu_notebook")
    except PackageNotFoundError:  # a bare source tree on sys.path: no metadata to copy
        return _Metadata("gpu_notebook", ">=3.11", [])
    info = dist.metadata.json
    deps = [r for r in dist.requires or [] if "extra ==" not in r and "extra==" not in r]
    return _Metadata(
        str(info.get("summary") or "gpu_notebook"), str(info.get("requires_python") or ">=3.11"), deps
    )


def _pyproject(version: str, meta: _Metadata) -> str:
    deps = ", ".join(_toml_str(d) for d in meta.deps)
    return (
        "[build-system]\n"
        'requires = ["setuptools>=61"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        'name = "gpu_notebook"\n'
        f"version = {_toml_str(version)}\n"
        f"description = {_toml_str(meta.summary)}\n"
        f"requires-python = {_toml_str(meta.python)}\n"
        f"dependencies = [{deps}]\n"
    )


def _setup_py(
    packages: list[str], package_data: dict[str, list[str]], extensions: list[tuple[str, str]]
) -> str:
    exts = ", ".join(
        f"Extension({name!r}, [{src!r}], optional=True, extra_compile_args=[] if sys.platform == 'win32' else ['-O3'])"
        for name, src in extensions
    )
    return (
        '"""Generated by gpu_notebook.cloud._ship: the running package, with its C kernels built for this Python."""\n'
        "import sys\n\n"
        "from setuptools import Extension, setup\n\n"
        f"setup(packages={packages!r}, package_data={package_data!r}, include_package_data=False, "
        f"ext_modules=[{exts}])\n"
    )


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
