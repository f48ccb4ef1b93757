"""``python -m gpu_notebook.checkpoint ls|show|verify|export URL ...``: see ``gpu_notebook/checkpoint/_cli.py``."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
