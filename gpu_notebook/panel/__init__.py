"""The kernel's side of the JupyterLab panel: each cluster this kernel starts is published to the Jupyter server.

A cluster appears in the "GPU clusters" sidebar, its dashboard pane and the status-bar item of every JupyterLab
or Notebook 7 page of the same server, also while a blocking cell runs. Nothing is published outside a Jupyter
kernel, or with ``GPU_NOTEBOOK_PANEL=0``. How it works: ``docs/dev/panel-protocol.md``.
"""

from __future__ import annotations

from ._publisher import Publisher, listen, start

__all__ = ["Publisher", "listen", "start"]
