"""Builds the optional C kernels of the checkpoint codec; all metadata lives in pyproject.toml.

The extension is optional: without a compiler the install still succeeds and the codec uses its numpy path
(same bytes, slower).
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpu_notebook.checkpoint._planes",
            ["gpu_notebook/checkpoint/_planes.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
            optional=True,
        )
    ]
)
