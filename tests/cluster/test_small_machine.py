"""The default journey on the smallest machines: a kernel that may use 1 or 2 CPUs (its affinity mask, as
``taskset`` or a container's cpuset sets it) starts its own local Ray, and every step works.

``%gpu_cluster start --workers 2`` with default options, ``%gpu_monitor`` (which must sample every node although
the workers hold every CPU), ``%gpu_cost``, a ``%%distributed`` training cell, a checkpoint save and restore, and
``%gpu_cluster stop``, run by nbclient in a real kernel process, as a new user on a 2-core laptop or Binder runs
the quickstart. Not the session's 8-CPU test cluster: that one never meets a full node.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CELLS = [
    "%load_ext gpu_notebook",
    "import tempfile\nCKPT = tempfile.mkdtemp(prefix='gnb-small-')",
    "%gpu_cluster start --workers 2",
    "%gpu_monitor",
    "%gpu_cost",
    # the monitor samples every node (generous deadline: this shared machine may be busy)
    "import time\n"
    "from gpu_notebook import get_manager\n"
    "from gpu_notebook.monitor import running_monitor\n"
    "c = get_manager().current\n"
    "mon = running_monitor()\n"
    "nodes = {n['NodeID'] for n in c.ray_nodes()}\n"
    "deadline = time.monotonic() + 90\n"
    "while (set(mon.nodes) != nodes or not mon.aggregator.rows_in) and time.monotonic() < deadline:\n"
    "    time.sleep(0.2)\n"
    "print('CPUS', sum(n['Resources'].get('CPU', 0) for n in c.ray_nodes()), "
    "'PER_WORKER', c.group.cpus_per_worker)\n"
    "print('SAMPLED', len(set(mon.nodes) & nodes), 'OF', len(nodes), 'DOWN', len(mon.failed_nodes))",
    "%gpu_push CKPT",
    "%%distributed\n"
    "import torch\n"
    "from gpu_notebook import checkpoint\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "g = torch.Generator().manual_seed(rank)\n"
    "X = torch.randn(64, 4, generator=g)\n"
    "y = X.sum(1, keepdim=True)\n"
    "for step in range(30):\n"
    "    opt.zero_grad()\n"
    "    loss = torch.nn.functional.mse_loss(model(X), y)\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "ckpt = checkpoint.Checkpointer(CKPT)\n"
    "ckpt.save({'model': model.module, 'optim': opt, 'step': step}, step)\n"
    "ckpt.wait()\n"
    "print(f'TRAINED loss {loss.item():.4f} saved step {step}')",
    "%%distributed\n"
    "fresh = torch.nn.Linear(4, 1)\n"
    "state = checkpoint.Checkpointer(CKPT).restore(into={'model': fresh})\n"
    "same = all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), "
    "model.module.state_dict().values()))\n"
    "print(f'RESTORED step {state[\"step\"]} same {same}')",
    "%gpu_cluster stop",
    "print('JOURNEY DONE', mon.started)",
]


def _texts(nb) -> list[str]:
    out = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        parts = []
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                parts.append(o.get("text", ""))
            elif "data" in o:
                parts.append(str(o["data"].get("text/plain", "")) + str(o["data"].get("text/html", "")))
        out.append("".join(parts))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cpus", [1, 2])
def test_the_default_journey_on_a_small_machine(cpus, tmp_path):
    import nbformat

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < cpus:
        pytest.skip(f"this machine lets us use {len(allowed)} CPU(s)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    path = tmp_path / "journey.ipynb"
    nbformat.write(nb, path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(path), "--timeout", "200"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        # the kernel, its Ray and the workers inherit the mask: a machine with `cpus` CPUs
        preexec_fn=lambda: os.sched_setaffinity(0, allowed[:cpus]),
    )
    done = nbformat.read(tmp_path / "journey.executed.ipynb", as_version=4)
    texts = _texts(done)
    errors = [
        f"cell {i}: {o.get('ename')}: {o.get('evalue')}"
        for i, c in enumerate(done.cells)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert proc.returncode == 0 and not errors, (errors, proc.stdout[-2000:], proc.stderr[-2000:])
    assert f"{len(CELLS)}/{len(CELLS)} code cells executed" in proc.stdout
    start = texts[2]
    assert f"starting a local Ray cluster ({cpus} CPUs" in start, start
    # the default on a small machine: the workers share the CPUs (fractions), so both fit
    share = 1.0 if cpus >= 2 else 0.5
    assert f"{share:g} CPU each" in start, start
    sampled = texts[5]
    assert f"CPUS {cpus:g}" in sampled or f"CPUS {float(cpus)}" in sampled, sampled
    assert re.search(r"SAMPLED 1 OF 1 DOWN 0", sampled), sampled  # the monitor samples every node
    assert "sampler did not start" not in "".join(texts[3:6])
    assert "$0" in texts[4] or "0.00" in texts[4], texts[4]  # a local cluster costs nothing
    trained = texts[7]
    assert "[rank 0] TRAINED" in trained and "[rank 1] TRAINED" in trained, trained
    restored = texts[8]
    assert "[rank 0] RESTORED step 29 same True" in restored, restored
    assert "[rank 1] RESTORED step 29 same True" in restored, restored
    assert "stopped" in texts[9] and "JOURNEY DONE False" in texts[10], texts[9:]


def test_a_local_ray_declares_the_cpus_this_process_may_use():
    """``os.cpu_count()`` counts the host's cores; a kernel limited to one CPU (taskset, a cpuset) gets a
    1-CPU Ray, so the default worker size fits what is really there."""
    code = "from gpu_notebook.cluster._connect import local_cpus; print(local_cpus())"
    first = sorted(os.sched_getaffinity(0))[:1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.sched_setaffinity(0, first),
    )
    assert out.stdout.strip() == "1", out.stderr
    from gpu_notebook.cluster._connect import local_cpus

    assert 1 <= local_cpus() <= (os.cpu_count() or 1)


@pytest.mark.timeout(180)
def test_start_with_dashboard_prints_its_url(tmp_path):
    """``%gpu_cluster start --dashboard`` says where the dashboard is, and it answers there."""
    code = (
        "from IPython.testing.globalipapp import start_ipython\n"
        "import urllib.request\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'gpu_notebook')\n"
        "ip.run_line_magic('gpu_cluster', 'start --workers 1 --cpus-per-worker 0.5 --dashboard')\n"
        "from gpu_notebook import get_manager\n"
        "url = get_manager().current.connection.dashboard_url\n"
        "print('URL', url)\n"
        "print('HTTP', urllib.request.urlopen(url, timeout=30).status)\n"
        "ip.run_line_magic('gpu_cluster', 'stop')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=170, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    url = re.search(r"^URL (http://\S+)$", proc.stdout, re.M)
    assert url, proc.stdout
    assert f"Ray dashboard: {url.group(1)}" in proc.stdout
    assert "HTTP 200" in proc.stdout
