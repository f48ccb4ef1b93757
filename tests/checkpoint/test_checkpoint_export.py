"""Exports of a checkpoint to files other tools read: ``.safetensors`` (the real safetensors library) and a
``torch.save`` file that loads with ``torch.load(..., weights_only=True)``. Pure: no Ray."""

from __future__ import annotations

import pathlib

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from gpu_notebook import checkpoint
from gpu_notebook.checkpoint._export import write_export


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.encoder = torch.nn.Linear(6, 6).to(torch.bfloat16)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight  # tied, as in a language model


def _saved(tmp_path: pathlib.Path) -> tuple[checkpoint.Checkpointer, Net]:
    torch.manual_seed(0)
    net = Net()
    ck = checkpoint.Checkpointer(tmp_path / "store", preemption=None, current=False)
    ck.save({"model": net, "step": 7, "note": "run 1"}, step=7)
    ck.wait()
    return ck, net


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype and a.shape == b.shape and bool((a.view(torch.uint8) == b.view(torch.uint8)).all())
    )


def test_safetensors_round_trip_is_bit_exact_with_bf16_and_tied_weights(tmp_path: pathlib.Path) -> None:
    ck, net = _saved(tmp_path)
    try:
        res = ck.export("latest", tmp_path / "model.safetensors", select="model")
    finally:
        ck.close()
    got = load_file(tmp_path / "model.safetensors")
    want = net.state_dict()
    assert set(got) == set(want) == {"emb.weight", "encoder.weight", "encoder.bias", "head.weight"}
    for k, v in want.items():
        assert _same(got[k], v), k
    assert got["encoder.weight"].dtype == torch.bfloat16
    fresh = Net()
    fresh.load_state_dict(got, strict=True)  # every name is there, the tied one included
    assert res.tensors == 4 and res.format == "safetensors"
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["step"] == "7" and meta["select"] == "model"


def test_tensors_sharing_storage_are_copied_for_safetensors(tmp_path: pathlib.Path) -> None:
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"a": w, "b": w, "c": w[1:], "d": w.t()}  # an alias, a view into it, a non-contiguous view
    res = write_export(state, tmp_path / "t.safetensors", "safetensors", {"format": "pt"})
    got = load_file(tmp_path / "t.safetensors")
    for k, v in state.items():
        assert torch.equal(got[k], v), k
    assert res.cloned == ["b", "c", "d"]


def test_torch_export_loads_with_weights_only_and_keeps_plain_values(tmp_path: pathlib.Path) -> None:
    ck, net = _saved(tmp_path)
    try:
        checkpoint.export(ck, None, tmp_path / "state.pt")
        res = checkpoint.export(tmp_path / "store", "latest", tmp_path / "enc.pth", select="model.encoder")
    finally:
        ck.close()
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert state["step"] == 7 and state["note"] == "run 1"
    for k, v in net.state_dict().items():
        assert _same(state["model"][k], v), k
    enc = torch.load(tmp_path / "enc.pth", weights_only=True)
    assert set(enc) == {"weight", "bias"} and _same(enc["weight"], net.encoder.weight.detach())
    assert res.format == "torch" and res.tensors == 2


def test_what_an_export_leaves_out_or_refuses(tmp_path: pathlib.Path) -> None:
    ck, _net = _saved(tmp_path)
    try:
        res = ck.export(None, tmp_path / "all.safetensors")
        assert sorted(res.dropped) == ["note", "step"]  # safetensors holds tensors only
        assert "model.emb.weight" in load_file(tmp_path / "all.safetensors")
        with pytest.raises(checkpoint.ExportError, match="no key 'decoder' in the checkpoint"):
            ck.export(None, tmp_path / "x.safetensors", select="model.decoder")
        with pytest.raises(checkpoint.ExportError, match="cannot tell the export format"):
            ck.export(None, tmp_path / "x.bin")
        ck.export(None, tmp_path / "x.bin", format="torch")  # the format given overrides the suffix
    finally:
        ck.close()
    with pytest.raises(checkpoint.ExportError, match=r"cannot export opt.fn \(object\)"):
        write_export({"opt": {"fn": object()}}, tmp_path / "y.pt", "torch", {})
    assert not list(tmp_path.glob("y.pt*"))  # no partial file left behind
