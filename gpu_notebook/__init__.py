"""gpu_notebook: a Jupyter notebook as the control room for distributed GPU training.

``%load_ext gpu_notebook`` registers the magics (they live in :mod:`gpu_notebook.magics`); the widgets live in
:mod:`gpu_notebook.widgets`. Importing this package is cheap: it imports no ray, torch, boto3 or NVML; the heavy
parts load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_notebook._lazy import lazy_module

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "ClusterManager",
    "CloudLaunch",
    "Policies",
    "Resources",
    "Runtime",
    "get_manager",
    "load_ipython_extension",
    "unload_ipython_extension",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
    from IPython.core.interactiveshell import InteractiveShell

    from gpu_notebook.cluster import (
        CloudLaunch,
        Cluster,
        ClusterManager,
        Policies,
        Resources,
        Runtime,
        get_manager,
    )

__getattr__, __dir__ = lazy_module(
    __name__,
    __all__,
    {
        "Cluster": "gpu_notebook.cluster",
        "ClusterManager": "gpu_notebook.cluster",
        "CloudLaunch": "gpu_notebook.cluster",
        "Policies": "gpu_notebook.cluster",
        "Resources": "gpu_notebook.cluster",
        "Runtime": "gpu_notebook.cluster",
        "get_manager": "gpu_notebook.cluster",
    },
)


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Register the gpu_notebook magics: ``%load_ext gpu_notebook``.

    Says once per process, in one line, when the JupyterLab panel's front end is not installed.
    """
    from gpu_notebook._labext import note_if_unbuilt
    from gpu_notebook.magics import register

    register(ipython)
    note_if_unbuilt()


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """Remove the gpu_notebook magics: ``%unload_ext gpu_notebook``.

    The live views the magics started stop; clusters stay until ``%gpu_cluster stop`` (or
    ``get_manager().stop_all()``) or the kernel exits.
    """
    from gpu_notebook.magics import unregister

    unregister(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension (for ``jupyter labextension develop``): built into
    ``gpu_notebook/labextension/`` from ``labextension/``, installed as ``gpu-notebook``."""
    return [{"src": "labextension", "dest": "gpu-notebook"}]
