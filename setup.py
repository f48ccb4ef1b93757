"""Builds the optional C kernels of the checkpoint codec; all metadata lives in pyproject.toml.

The extension is optional: without a compiler the install still succeeds and the codec uses its numpy path
(same bytes, slower; the first save of a process says so; tests/checkpoint/test_checkpoint_no_compiler.py
installs with CC=/bin/false). ``GPU_NOTEBOOK_NO_C_EXT=1`` turns a built extension off at run time.
``GPU_NOTEBOOK_BUILD_NATIVE=require`` (set by scripts/setup_env.sh, so by the tests and CI)
makes a failed build fail the install instead of leaving an older build, or none, in place.
"""

import os
import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpu_notebook.checkpoint.format._planes",
            ["gpu_notebook/checkpoint/format/_planes.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
            optional=os.environ.get("GPU_NOTEBOOK_BUILD_NATIVE", "") != "require",
        )
    ]
)
