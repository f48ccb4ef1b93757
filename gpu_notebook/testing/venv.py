"""A stand-in for a cluster node's Python: a fresh virtualenv with this environment's packages but no gpu_notebook.

A real node (a cloud VM's container, another machine's Ray) has Ray, torch and the rest, and no gpu_notebook
unless it was shipped there. :func:`node_venv` makes that here in a second or two, without downloads: a venv
made ``--without-pip`` whose only link to this environment is one ``.pth`` line naming a folder of symlinks to
this environment's ``site-packages`` entries, minus gpu_notebook's own (its editable-install finder and
``.pth``, its ``dist-info``) and minus the ``.pth`` files (they are processed only in a real site directory).
``pip`` comes along as a package; :func:`node_venv` adds a ``bin/pip`` that runs it, so ``pip install`` in a
setup command installs into the new venv. Nothing from the new venv can touch this environment: pip does not
see a gpu_notebook there to uninstall, and it installs into the venv's own ``site-packages``.

``with_gpu_notebook=True`` makes instead a user's other environment that has gpu_notebook installed: the same
links with gpu_notebook's own entries kept, and the lines of its ``.pth`` files (an editable install's finder)
run from the venv's ``.pth``, after the folder of links is on ``sys.path``. No pip, no build: in well under a
second, where ``pip install --no-deps -e`` of this checkout takes about five.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["node_venv"]


def _gpu_notebook_s(name: str) -> bool:
    return name.lower().startswith(("gpu_notebook", "__editable__.gpu_notebook", "__editable___gpu_notebook"))


def _ours(name: str) -> bool:
    return _gpu_notebook_s(name) or name.lower().endswith(".pth")


def node_venv(
    path: str | os.PathLike[str], site_packages: str | None = None, with_gpu_notebook: bool = False
) -> Path:
    """Create a venv at ``path`` that sees this environment's packages except gpu_notebook; returns its python.

    Parameters
    ----------
    path
        Where to create it (must not exist yet, or be empty).
    site_packages
        The ``site-packages`` to borrow from (default: this interpreter's ``purelib``).
    with_gpu_notebook
        Borrow gpu_notebook as well (the one this environment imports, an editable install's included).
    """
    root = Path(path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    borrowed = Path(site_packages or sysconfig.get_paths()["purelib"])
    farm = root / "borrowed-site-packages"
    farm.mkdir()
    lines = [str(farm)]
    for entry in sorted(borrowed.iterdir()):
        if with_gpu_notebook and _gpu_notebook_s(entry.name) and entry.name.endswith(".pth"):
            lines += [line for line in entry.read_text().splitlines() if line.strip()]
        elif not _ours(entry.name) or (with_gpu_notebook and _gpu_notebook_s(entry.name)):
            (farm / entry.name).symlink_to(entry)
    Path(own, "_borrowed.pth").write_text("\n".join(lines) + "\n")
    pip = root / "bin" / "pip"
    pip.write_text(f"#!{python}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n")
    pip.chmod(0o755)
    return python
