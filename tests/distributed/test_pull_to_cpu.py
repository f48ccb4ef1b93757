"""``%gpu_pull`` brings tensors to the CPU, as a cell's values come back; ``--device`` keeps them where they are.

The notebook may have no GPU: a CUDA tensor pulled as it is cannot even be rebuilt there. This machine has no
GPU either, so the ranks hold :class:`~gpu_notebook.testing.devices.OnAccelerator` tensors: CPU data that
reports ``cuda:0`` as its device, so the rank takes the path a real GPU tensor takes (``tensor.device`` is not
the CPU: copy it with ``.detach().cpu()``). What comes back tells which path was taken: a plain CPU tensor, or
(``--device``) the tensor as it was on the rank.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_notebook.testing.devices import OnAccelerator  # noqa: E402

CELL = """%%distributed
import torch
from gpu_notebook.testing.devices import on_accelerator
w = on_accelerator(torch.arange(4.0))
state = {"layer.weight": on_accelerator(torch.ones(2)), "step": 3, "history": [on_accelerator(torch.zeros(1))]}
"""


@pytest.mark.timeout(120)
def test_pull_brings_tensors_to_the_cpu_and_device_keeps_them(ip, shared) -> None:
    res = ip.run_cell(CELL)
    assert res.error_in_exec is None, res.error_in_exec
    assert ip.run_cell("%gpu_pull w").error_in_exec is None
    w = ip.user_ns["w"]
    assert type(w) is torch.Tensor and w.device.type == "cpu" and w.tolist() == [0.0, 1.0, 2.0, 3.0]

    assert ip.run_cell("%gpu_pull state --rank 1 --as state1").error_in_exec is None
    state = ip.user_ns["state1"]  # inside containers too (a state_dict, a list of losses)
    assert type(state["layer.weight"]) is torch.Tensor and state["layer.weight"].device.type == "cpu"
    assert type(state["history"][0]) is torch.Tensor and state["step"] == 3

    assert ip.run_cell("%gpu_pull w --device --as w_on_device").error_in_exec is None
    kept = ip.user_ns["w_on_device"]
    assert isinstance(kept, OnAccelerator) and kept.device.type == "cuda"  # as it was on the rank

    # the Python API does the same
    assert type(shared.pull("w")) is torch.Tensor
    assert isinstance(shared.pull("w", keep_device=True), OnAccelerator)
