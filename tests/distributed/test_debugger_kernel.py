"""The rank debugger in a real Jupyter kernel: ``%gpu_debug`` post-mortem and ``breakpoint()`` on gloo ranks, with
every command typed into the stdin channel's input requests (what the notebook's input box sends).

One kernel with its own local Ray for the module (listed in tests/own_ray_files.txt); the hang report's threshold
is 2 s there, so a pause of several seconds would be reported if a pause counted as a hang.
"""

from __future__ import annotations

import os
import queue
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.timeout(600)


class Session:
    """A kernel client that answers each input request with the next scripted line and records the prompts."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.prompts: list[str] = []
        self.kinds: list[str] = []  # the iopub message types of the cell that runs

    def run(self, code: str, answers: list[str] = (), wait_first: float = 0.0, ok: bool = True) -> str:  # type: ignore[assignment]
        out: list[str] = []
        todo = list(answers)

        def on_output(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            self.kinds.append(kind)
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                out.append("\n".join(content["traceback"]))
            elif kind in ("execute_result", "display_data", "update_display_data"):
                out.append(content.get("data", {}).get("text/plain", ""))

        def on_input(msg: dict[str, Any]) -> None:
            # what the cell printed before this prompt can arrive after it: iopub and stdin are two channels, with
            # no order between them (CI saw the answer to "all p rank" after the next prompt). The kernel flushed
            # it before asking, so it is on its way: read it first. (The cell's final idle cannot come meanwhile:
            # the kernel waits for this answer.)
            parent = msg["parent_header"].get("msg_id")
            drain_until = time.monotonic() + 0.5
            while time.monotonic() < drain_until:
                try:
                    m = self.kc.get_iopub_msg(timeout=0.1)
                except queue.Empty:
                    continue
                if m["parent_header"].get("msg_id") == parent and m["msg_type"] != "status":
                    on_output(m)
            self.prompts.append(msg["content"]["prompt"])
            if wait_first and len(self.prompts) == 1:
                time.sleep(wait_first)
            line = todo.pop(0) if todo else "c"
            out.append(f"{msg['content']['prompt']}{line}\n")
            self.kc.input(line)

        reply = self.kc.execute_interactive(
            code, timeout=240, allow_stdin=True, stdin_hook=on_input, output_hook=on_output
        )
        text = "".join(out)
        content = reply["content"]
        if content["status"] == "error" and not any(kind == "error" for kind in self.kinds):
            # CI once saw a failed cell's reply with none of its iopub output (a loaded 2-core machine): the
            # reply carries the same traceback the notebook shows, so the assertions read it from there
            text += "\n".join(
                content.get("traceback") or [f"{content.get('ename')}: {content.get('evalue')}"]
            )
        self.kinds.clear()
        assert (content["status"] == "ok") == ok, text
        assert not todo, f"answers left unasked: {todo}\n{text}"
        return text


@pytest.fixture(scope="module")
def kernel() -> Iterator[Session]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["GPU_NOTEBOOK_STALL_REPORT"] = "2"
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.kernel_spec.argv[0] = sys.executable
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    s = Session(kc)
    try:
        s.run("%load_ext gpu_notebook")
        s.run("%gpu_cluster start --workers 2 --cpus-per-worker 0.5")
        s.run("%%distributed\nimport torch, torch.distributed as dist\nkeep = 40 + rank")
        yield s
    finally:
        try:
            kc.execute_interactive("%gpu_cluster stop --all", timeout=120)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=False)


CELL_FAILS = """%%distributed
def scale(v):
    w = v * 2
    raise ValueError(f"bad value {w}")
if rank == 1:
    scale(5)
"""


def test_post_mortem_on_the_rank_that_failed(kernel: Session) -> None:
    out = kernel.run(CELL_FAILS, ok=False)
    assert "ValueError: bad value 10" in out
    kernel.prompts.clear()
    out = kernel.run("%gpu_debug", ["p rank", "p w", "u", "l", "q"])
    assert kernel.prompts == ["(Pdb rank 1) "] * 5
    answers = out.split("(Pdb rank 1) ")
    assert "ValueError: bad value 10" in answers[0] and "scale()" in answers[0]  # where it stopped
    assert answers[1].splitlines()[1] == "1"  # p rank
    assert answers[2].splitlines()[1] == "10"  # p w
    assert "<module>()" in answers[3] and "-> scale(5)" in answers[3]  # u: the cell's frame
    # l: the cell's lines, numbered as in the notebook cell (line 1 is the %%distributed line)
    assert "  6  ->\t    scale(5)" in answers[4] and "  4  \t    raise ValueError" in answers[4], answers[4]
    # the workers kept their state and the group still works
    assert "[40, 41]" in kernel.run("%%distributed -o kept\nkeep\n") + kernel.run("print(list(kept))")
    out = kernel.run("%%distributed\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
    assert "2.0" in out
    # the next cell forgot the failure
    assert "no rank has a failure to debug" in kernel.run("%gpu_debug", ok=False)


def test_breakpoint_on_one_rank_before_an_all_reduce(kernel: Session) -> None:
    kernel.prompts.clear()
    cell = "%%distributed\nx = torch.ones(1) * (rank + 1)\nif rank == 1:\n    breakpoint()\ndist.all_reduce(x)\nx.item()"
    out = kernel.run(cell, ["p rank", "all p rank", "c"], wait_first=6.0)
    assert "[rank 1] paused at cell line 5" in out
    assert kernel.prompts == ["(Pdb rank 1) "] * 3
    answers = out.split("(Pdb rank 1) ")
    assert answers[1].splitlines()[1] == "1"
    assert "[rank 1] 1" in answers[2] and "[rank 0]" not in answers[2]  # rank 0 waits in the collective
    assert "3.0" in answers[3]  # the all_reduce's result, on both ranks
    assert "no collective has completed" not in out  # 6 s paused with a 2 s threshold: no hang report


def test_breakpoint_on_both_ranks(kernel: Session) -> None:
    kernel.prompts.clear()
    cell = "%%distributed\nx = torch.ones(1) * (rank + 1)\ndist.barrier()\nbreakpoint()\ndist.all_reduce(x)\nx.item()"
    out = kernel.run(cell, ["all p rank", "rank 1", "p rank", "all c"])
    assert "[rank 0] 0" in out and "[rank 1] 1" in out
    assert kernel.prompts[:3] == ["(Pdb rank 0) ", "(Pdb rank 0) ", "(Pdb rank 1) "]
    assert out.split("(Pdb rank 1) ")[1].splitlines()[1] == "1"
    assert "3.0" in out


def test_a_background_cell_waits_for_gpu_debug(kernel: Session) -> None:
    kernel.run("%%distributed --noblock -o bg\nif rank == 1:\n    breakpoint()\nrank * 10")
    deadline = time.monotonic() + 30
    while "in the debugger" not in (status := kernel.run("%gpu_cluster status")):
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    kernel.prompts.clear()
    out = kernel.run("%gpu_debug", ["p rank", "c"])
    assert kernel.prompts == ["(Pdb rank 1) "] * 2
    assert out.split("(Pdb rank 1) ")[1].splitlines()[1] == "1"
    assert "[0, 10]" in kernel.run("%gpu_result\nprint(list(bg))")


def test_pythonbreakpoint_0_turns_breakpoints_off(kernel: Session) -> None:
    kernel.run("%gpu_cluster start --name nobp --workers 1 --cpus-per-worker 0.5 --env PYTHONBREAKPOINT=0")
    try:
        kernel.prompts.clear()
        out = kernel.run("%%distributed --cluster nobp\nbreakpoint()\nprint('ran through')")
        assert "ran through" in out and not kernel.prompts
    finally:
        kernel.run("%gpu_cluster stop --name nobp")
