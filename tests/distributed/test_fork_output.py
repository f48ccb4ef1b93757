"""Output of a rank's child processes reaches the cell with the rank's prefix: forked children (os.fork,
DataLoader workers) printing through Python or logging, and subprocesses writing to their stdout or stderr; a
fork while another thread prints never deadlocks the child (real ranks of the shared gloo cluster)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(180)


def _out(capsys) -> str:
    got = capsys.readouterr()
    return got.out + got.err


def test_a_forked_child_print_and_logging_reach_the_cell(ip, shared, capsys):
    cell = (
        "%%distributed\n"
        "import logging, os\n"
        "log = logging.getLogger('forky')\n"
        "log.addHandler(logging.StreamHandler())\n"
        "log.setLevel(logging.INFO)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('child of', rank, 'prints')\n"
        "    log.info('child of %s logs', rank)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('parent', rank, 'done')\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    text = _out(capsys)
    for r in (0, 1):
        assert f"[rank {r}] child of {r} prints" in text
        assert f"[rank {r}] child of {r} logs" in text
        assert f"[rank {r}] parent {r} done" in text


def test_forked_dataloader_workers_that_print_reach_the_cell(ip, shared, capsys):
    cell = (
        "%%distributed -o got\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Loud(Dataset):\n"
        "    def __len__(self):\n"
        "        return 4\n"
        "    def __getitem__(self, i):\n"
        "        print(f'worker loads item {i}')\n"
        "        return torch.tensor(i)\n"
        "sum(b.sum().item() for b in DataLoader(Loud(), batch_size=2, num_workers=2))\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["got"]) == [6, 6]
    text = _out(capsys)
    for r in (0, 1):
        for i in range(4):
            assert f"[rank {r}] worker loads item {i}" in text


def test_subprocess_stdout_and_stderr_reach_the_cell(ip, shared, capsys):
    cell = (
        "%%distributed\n"
        "import subprocess, sys\n"
        "subprocess.run(['echo', f'echo from {rank}'], check=True)\n"
        "subprocess.run([sys.executable, '-c', f'import sys; print(\"stderr from {rank}\", file=sys.stderr)'],"
        " check=True)\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    text = _out(capsys)
    for r in (0, 1):
        assert f"[rank {r}] echo from {r}" in text
        assert f"[rank {r}] stderr from {r}" in text


def test_forks_while_another_thread_prints_never_deadlock_the_child(ip, shared, capsys):
    cell = (
        "%%distributed --ranks 0 -o hung\n"
        "import os, signal, threading, time\n"
        "stop = threading.Event()\n"
        "def chatter():\n"
        "    while not stop.is_set():\n"
        "        print('chatter')\n"
        "        time.sleep(0.0005)\n"
        "t = threading.Thread(target=chatter)\n"
        "t.start()\n"
        "hung = 0\n"
        "try:\n"
        "    for i in range(60):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            print(f'forked child {i} alive')\n"
        "            os._exit(0)\n"
        "        deadline = time.monotonic() + 10\n"
        "        while os.waitpid(pid, os.WNOHANG) == (0, 0):\n"
        "            if time.monotonic() > deadline:\n"
        "                os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0); hung += 1\n"
        "                break\n"
        "            time.sleep(0.001)\n"
        "        if hung >= 3:\n"
        "            break\n"
        "finally:\n"
        "    stop.set(); t.join()\n"
        "hung\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["hung"]) == [0]
    text = _out(capsys)
    assert "[rank 0] forked child 59 alive" in text


FORK_WHILE_LOCKED = """
import os, sys, threading, time
from gpu_notebook.distributed._capture import Capture, StreamProxy
capture = Capture()
capture.capture_fds()
out = StreamProxy(capture, "<stdout>")
held = threading.Event()
def hold():
    with capture._lock:  # another thread inside a write when the fork comes
        held.set()
        time.sleep(0.3)
threading.Thread(target=hold).start()
held.wait()
pid = os.fork()
if pid == 0:
    out.write("child line\\n")
    out.write("unfinished")
    out.flush()
    os._exit(0)
os.waitpid(pid, 0)
capture.sync()
with open(sys.argv[1], "w") as f:
    f.write(capture.drain())
"""


def test_capture_in_a_forked_child_writes_through_the_pipe_with_fresh_locks(tmp_path, python_exe):
    import subprocess

    result = tmp_path / "drained.txt"
    subprocess.run([python_exe, "-c", FORK_WHILE_LOCKED, str(result)], check=True, timeout=60)
    assert result.read_text() == "child line\nunfinished"
