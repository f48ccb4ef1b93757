"""Builds the optional C kernels of the checkpoint codec and lists the Jupyter data files; all other metadata lives
in pyproject.toml.

The C extension is optional: without a compiler the install still succeeds and the codec uses its numpy path
(same bytes, slower; the first save of a process says so; tests/checkpoint/test_checkpoint_no_compiler.py
installs with CC=/bin/false). ``GPU_NOTEBOOK_NO_C_EXT=1`` turns a built extension off at run time.
``GPU_NOTEBOOK_BUILD_NATIVE=require`` (set by scripts/setup_env.sh, so by the tests and CI)
makes a failed build fail the install instead of leaving an older build, or none, in place.

The JupyterLab extension is built from ``labextension/`` into ``gpu_notebook/labextension/`` by node
(scripts/setup_env.sh does it where node is present); setup.py never runs node. Where the built files are, they are
installed under ``share/jupyter/labextensions/gpu-notebook/`` (where JupyterLab and Notebook 7 find prebuilt
extensions); where they are not, the package installs without them and ``%load_ext gpu_notebook`` says so once.
The server extension is enabled by a config file in ``etc/jupyter/jupyter_server_config.d/`` either way.
"""

import os
import sys
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
LABEXTENSION = Path("gpu_notebook") / "labextension"  # the builder's outputDir (labextension/package.json)
LABEXTENSION_DEST = Path("share") / "jupyter" / "labextensions" / "gpu-notebook"


def jupyter_data_files() -> list[tuple[str, list[str]]]:
    """(install folder, files) pairs: the server extension's config, and the built labextension if there is one."""
    files = [
        ("etc/jupyter/jupyter_server_config.d", ["jupyter-config/jupyter_server_config.d/gpu_notebook.json"])
    ]
    if not (HERE / LABEXTENSION / "package.json").is_file():
        return files
    folders: dict[Path, list[str]] = {}
    for path in sorted((HERE / LABEXTENSION).rglob("*")):
        if path.is_file():
            rel = path.relative_to(HERE / LABEXTENSION)
            folders.setdefault(LABEXTENSION_DEST / rel.parent, []).append(str(LABEXTENSION / rel))
    files += [(str(dest), names) for dest, names in folders.items()]
    files.append((str(LABEXTENSION_DEST), ["labextension/install.json"]))
    return files


setup(
    ext_modules=[
        Extension(
            "gpu_notebook.checkpoint.format._planes",
            ["gpu_notebook/checkpoint/format/_planes.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
            optional=os.environ.get("GPU_NOTEBOOK_BUILD_NATIVE", "") != "require",
        )
    ],
    data_files=jupyter_data_files(),
)
