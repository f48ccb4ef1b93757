"""Our own package reaches every node at the notebook's version: a Ray head whose Python lacks gpu_notebook.

The head runs from a second virtualenv that has Ray and torch but no gpu_notebook (gpu_notebook.testing.venv), in a
working directory elsewhere, with its own ports (the session's Ray runs beside it). A notebook in a separate process
(an IPython shell of this environment) connects by address with ``%gpu_cluster start --address``; the ranks must
import gpu_notebook from the copy the notebook sent, at its version and content. Then a node whose gpu_notebook is
not the notebook's fails the start with a message that names the node and says what to do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import gpu_notebook
from gpu_notebook.cloud import _ship
from gpu_notebook.cluster._package_check import NodePackage, PackageMismatchError, mismatches
from gpu_notebook.errors import GpuNotebookError
from gpu_notebook.testing.venv import node_venv

pytestmark = pytest.mark.timeout(300)

_ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")  # a test-only head on loopback
_ENV.pop("RAY_ADDRESS", None)
_ENV.pop("PYTHONPATH", None)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (each socket is held until all are picked: two picks never return the same one,
    which made Ray refuse to start, "a port number ... that is used by other components", once in CI)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def bare_head():
    """A Ray head whose Python has no gpu_notebook, started in an unrelated directory; killed at the end."""
    where = tempfile.mkdtemp(prefix="gnbs", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
    python = node_venv(os.path.join(where, "venv"))
    cwd = os.path.join(where, "elsewhere")
    os.mkdir(cwd)
    lacks = subprocess.run([str(python), "-c", "import gpu_notebook"], cwd=cwd, env=_ENV, capture_output=True)
    assert lacks.returncode != 0 and b"No module named 'gpu_notebook'" in lacks.stderr
    names = [
        "--ray-client-server-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
        "--node-manager-port",
        "--object-manager-port",
    ]
    port, *others = _free_ports(len(names) + 1)
    ports = dict(zip(names, others, strict=True))
    cmd = [str(python), "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}"]
    cmd += [f"{k}={v}" for k, v in ports.items()]
    cmd += [
        "--node-ip-address=127.0.0.1",
        "--num-cpus=2",
        "--include-dashboard=false",
        f"--temp-dir={os.path.join(where, 'ray')}",
        "--disable-usage-stats",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", ports["--ray-client-server-port"])) == 0:
                    break
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read())
            time.sleep(0.5)
        else:
            raise RuntimeError("the bare Ray head did not start")
        client = f"ray://127.0.0.1:{ports['--ray-client-server-port']}"
        yield {"address": f"127.0.0.1:{port}", "client": client, "python": str(python), "cwd": cwd}
    finally:
        try:  # (a head that failed to start is gone already: its error is the one to see)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


NOTEBOOK = textwrap.dedent(
    """
    import json, sys
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpu_notebook")
    from gpu_notebook import get_manager
    ip.run_line_magic("gpu_cluster", f"start --name bare --address {sys.argv[1]} --workers 2 --cpus-per-worker 0.5")
    ip.run_cell("%%distributed -o r\\nimport os, sys, torch, torch.distributed as dist, gpu_notebook\\n"
                "from gpu_notebook.cloud._ship import tree_digest\\n"
                "t = torch.ones(1); dist.all_reduce(t); print('hello from', rank)\\n"
                "(gpu_notebook.__version__, gpu_notebook.__file__, sys.executable,\\n"
                " tree_digest(os.path.dirname(gpu_notebook.__file__)), t.item())\\n")
    c = get_manager().get("bare")
    kind, started_ray = c.kind, c.started_ray
    print("RESULT " + json.dumps({"ranks": list(ip.user_ns["r"]), "kind": kind, "started_ray": started_ray,
                                  "stop": c.stop()}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["address", "client"])
def test_the_ranks_import_the_notebooks_own_package_on_a_head_that_lacks_it(bare_head, tmp_path, how):
    """By the GCS address and through Ray Client (``ray://``), whose uploads take another path. Address mode as
    a whole, too: a cell's collective runs across the head's workers, every rank's print reaches the notebook,
    and stop leaves the head running (the second case connects to the head the first one left)."""
    proc = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, bare_head[how]],
        cwd=tmp_path,  # not this checkout: nothing of ours on the notebook's sys.path but the installed package
        env={**_ENV, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0 and "RESULT " in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    shipped = _ship.package(cache=tmp_path / "cache" / "gpu_notebook" / "packages")
    assert len(result["ranks"]) == 2
    assert result["kind"] == "address" and result["started_ray"] is False
    assert "[rank 0] hello from 0" in proc.stdout and "[rank 1] hello from 1" in proc.stdout
    for version, file, python, digest, reduced in result["ranks"]:
        assert reduced == 2.0  # the all_reduce summed both ranks' ones
        assert version == gpu_notebook.__version__
        assert python.startswith(os.path.dirname(bare_head["python"]))  # the ranks run the bare venv's Python
        # from the copy Ray unpacked for the workers: neither this checkout nor the bare venv's site-packages
        assert not file.startswith(os.path.dirname(os.path.dirname(gpu_notebook.__file__)))
        assert "runtime_resources" in file and "py_modules_files" in file
        assert digest == shipped.digest
    assert "sending this kernel's gpu_notebook" in proc.stdout
    assert "checking gpu_notebook on every node" in proc.stdout
    assert "left running" in result["stop"]


MISMATCH = textwrap.dedent(
    """
    import sys
    from gpu_notebook import Cluster
    from gpu_notebook.cluster._package_check import PackageMismatchError
    c = Cluster(name="bare", address=sys.argv[1], workers=1, cpus_per_worker=0.5, ship_package=False)
    try:
        c.start(progress=print)
    except PackageMismatchError as exc:
        print("MISMATCH " + str(exc))
    print("STATE " + c.state)
    """
)


@pytest.mark.slow
def test_a_node_without_the_notebooks_package_fails_the_start_and_says_what_to_do(bare_head, tmp_path):
    """``ship_package=False``: the bare node has no gpu_notebook, and the start says so before any worker starts."""
    proc = subprocess.run(
        [sys.executable, "-c", MISMATCH, bare_head["address"]],
        cwd=tmp_path,
        env={**_ENV, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "MISMATCH " in proc.stdout, proc.stdout[-3000:]
    msg = proc.stdout.split("MISMATCH ", 1)[1]
    assert f"not this kernel's {gpu_notebook.__version__}" in msg
    assert re.search(
        r"node \S+ \(Python 3\.\d+\.\d+\): cannot import gpu_notebook \(ModuleNotFoundError", msg
    ), msg
    assert "Drop ship_package=False" in msg
    assert f"gpu_notebook-{gpu_notebook.__version__}.tar.gz there and pip install it" in msg
    assert "STATE failed" in proc.stdout


def test_mismatched_versions_and_content_are_each_named() -> None:
    digest = "ab" * 32
    found = [
        NodePackage("10.0.0.1", "3.11.7", "0.1.0", "/a/gpu_notebook/__init__.py", digest),
        NodePackage("10.0.0.2", "3.11.7", "0.0.9", "/b/gpu_notebook/__init__.py", "cd" * 32),
        NodePackage("10.0.0.3", "3.11.7", "0.1.0", "/c/gpu_notebook/__init__.py", "ef" * 32),
    ]
    assert mismatches(found, "0.1.0", digest) == [
        "node 10.0.0.2 (Python 3.11.7): gpu_notebook 0.0.9 from /b/gpu_notebook/__init__.py, not 0.1.0",
        "node 10.0.0.3 (Python 3.11.7): gpu_notebook 0.1.0 from /c/gpu_notebook/__init__.py is other code "
        "(content efefefefefef, this kernel's abababababab)",
    ]
    assert issubclass(PackageMismatchError, GpuNotebookError)


PIP_NOTEBOOK = textwrap.dedent(
    """
    import json, sys
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpu_notebook")
    from gpu_notebook import get_manager
    ip.run_line_magic(
        "gpu_cluster", f"start --name piped --address {sys.argv[1]} --workers 2 --cpus-per-worker 0.5 --pip {sys.argv[2]}"
    )
    ip.run_cell("%%distributed -o r\\nimport gnb_tiny_pkg\\n(gnb_tiny_pkg.WHO, gnb_tiny_pkg.__file__)\\n")
    print("RESULT " + json.dumps({"ranks": list(ip.user_ns["r"]), "stop": get_manager().get("piped").stop()}))
    """
)


def _tiny_wheel(where: str) -> str:
    """A one-module wheel written by hand (no build, no index): what ``--pip`` must install on the workers."""
    import base64
    import hashlib
    import zipfile

    files = {
        "gnb_tiny_pkg/__init__.py": b"WHO = 'installed by --pip'\n",
        "gnb_tiny_pkg-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: gnb-tiny-pkg\nVersion: 0.1\n",
        "gnb_tiny_pkg-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("gnb_tiny_pkg-0.1.dist-info/RECORD,,")
    path = os.path.join(where, "gnb_tiny_pkg-0.1-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("gnb_tiny_pkg-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.mark.slow
def test_pip_installs_a_package_on_the_workers_only(bare_head, tmp_path):
    """``--pip`` goes to Ray's runtime_env: the workers import a package that neither the node nor the kernel has."""
    wheel = _tiny_wheel(str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", PIP_NOTEBOOK, bare_head["address"], wheel],
        cwd=tmp_path,
        env={**_ENV, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PIP_NO_INDEX": "1"},  # offline, as here
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0 and "RESULT " in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.split("RESULT ", 1)[1])["ranks"]
    assert [who for who, _ in ranks] == ["installed by --pip"] * 2
    assert all(
        "runtime_resources" in file for _, file in ranks
    )  # in the env Ray built, not the node's Python
    lacks = subprocess.run([bare_head["python"], "-c", "import gnb_tiny_pkg"], env=_ENV, capture_output=True)
    assert lacks.returncode != 0  # the node's own Python is untouched
