"""The Jupyter server extension of the JupyterLab panel: serves every kernel's published clusters to the browser.

Enabled by the install (``etc/jupyter/jupyter_server_config.d/gpu_notebook.json``); ``jupyter server extension
list`` shows it as ``gpu_notebook.labpanel``. It reads the feed folder the kernels write
(:mod:`gpu_notebook._feed`) and answers under ``{base_url}gpu-notebook/api/`` behind the server's own
authentication, so it works behind JupyterHub and Binder and opens no port of its own. It never imports Ray,
torch or NVML into the server process (an import-linter contract). Protocol: ``docs/dev/panel-protocol.md``.
"""

from __future__ import annotations

from typing import Any

from gpu_notebook import _feed

from ._handlers import handlers

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpu_notebook.labpanel"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    web_app = serverapp.web_app
    root = _feed.feed_root(serverapp.runtime_dir)
    web_app.settings["gpu_notebook_feed_root"] = str(root)
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    serverapp.log.info("gpu_notebook: the GPU clusters panel reads %s", root)
