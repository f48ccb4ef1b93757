"""Where the JupyterLab panel's front end is installed, and the one line ``%load_ext gpu_notebook`` says when it is
not.

The front end is a prebuilt JupyterLab extension (TypeScript in ``labextension/``, built by node into
``gpu_notebook/labextension/``). ``pip install`` ships it under ``share/jupyter/labextensions/gpu-notebook/`` when
it was built; a package built where node was missing installs without it, and the magics work as before. JupyterLab
and Notebook 7 look for it in the Jupyter data folders, so that is where this looks too (``jupyter_core``'s list
when it is importable, the same folders otherwise). Imports only the standard library.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["NAME", "installed_labextension", "note_if_unbuilt", "unbuilt_message"]

#: the npm package's name: the folder JupyterLab finds it in (labextension/package.json)
NAME = "gpu-notebook"

_noted = False
_lock = threading.Lock()


def _data_dirs() -> list[Path]:
    try:
        from jupyter_core.paths import jupyter_path

        return [Path(p) for p in jupyter_path()]
    except ImportError:  # a kernel environment without jupyter_core: jupyter_core's own order
        dirs = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        dirs.append(
            os.environ.get("JUPYTER_DATA_DIR")
            or os.path.join(
                os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "jupyter"
            )
        )
        dirs += [
            os.path.join(sys.prefix, "share", "jupyter"),
            "/usr/local/share/jupyter",
            "/usr/share/jupyter",
        ]
        return [Path(p) for p in dirs]


def installed_labextension() -> Path | None:
    """The installed front end's folder (the first with our ``package.json``), or None when none is installed."""
    for data in _data_dirs():
        folder = data / "labextensions" / NAME
        if (folder / "package.json").is_file():
            return folder
    return None


def unbuilt_message() -> str:
    return (
        "gpu_notebook: the JupyterLab panel (GPU clusters sidebar, dashboards, status item) is not built in this "
        "environment; the magics work without it. To get it, run scripts/setup_env.sh in a clone with node >= 18 on "
        "the PATH (it builds and installs it), or install a wheel built there; then reload the JupyterLab page."
    )


def note_if_unbuilt(write: Callable[[str], object] = print) -> bool:
    """Say (once per process) that the front end is not installed, if it is not. Returns whether it said so."""
    global _noted
    with _lock:
        if _noted:
            return False
        _noted = True
    if installed_labextension() is not None:
        return False
    write(unbuilt_message())
    return True
