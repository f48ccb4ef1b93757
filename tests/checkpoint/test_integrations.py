"""Lightning and the Hugging Face Trainer saving through a Checkpointer, with the real frameworks on 2 gloo ranks."""

from __future__ import annotations

import argparse
import json
import pathlib

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from gpu_notebook.checkpoint import Checkpointer, UnsafeValueError  # noqa: E402
from gpu_notebook.checkpoint.integrations._safe import from_safe, to_safe  # noqa: E402


def _no_pickle(ckpt: Checkpointer) -> None:
    for info in ckpt.list():
        doc = json.dumps(ckpt.manifest(info.id))
        assert "$pickle" not in doc and '"kind": "pickle"' not in doc


class Holder:
    """An object holding a tensor: pickle_objects must still refuse it."""

    def __init__(self) -> None:
        self.t = torch.zeros(1)


def test_safe_values_round_trip_and_refuse_objects() -> None:
    hp = {"lr": 0.1, "ns": argparse.Namespace(a=1, p=pathlib.Path("/x")), "tags": {"a"}, "t": torch.ones(2)}
    safe = to_safe(hp)
    assert safe["t"] is hp["t"]  # tensors are left to the checkpoint format
    back = from_safe(safe)
    assert back["ns"] == hp["ns"] and back["tags"] == {"a"}
    with pytest.raises(UnsafeValueError, match="/obj"):
        to_safe({"obj": object()})
    pickled = to_safe({"obj": range(3)}, pickle_objects=True)
    with pytest.raises(UnsafeValueError, match="pickled"):
        from_safe(pickled)
    assert from_safe(pickled, pickle_objects=True)["obj"] == range(3)

    with pytest.raises(UnsafeValueError, match="holds a tensor"):
        to_safe({"h": Holder()}, pickle_objects=True)


# ---------------------------------------------------------------------------------------------- Lightning
class Tiny(pl.LightningModule):
    """A frozen layer and a trained head (as in fine-tuning: most bytes do not change between checkpoints)."""

    def __init__(self, width: int = 64, args: argparse.Namespace | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.frozen = torch.nn.Linear(width, width)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(width, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(self.frozen(x)), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.head.parameters(), lr=0.05, momentum=0.9)


def _loader():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 64, generator=g)
    ds = torch.utils.data.TensorDataset(x, x[:, :1] * 2)
    return torch.utils.data.DataLoader(ds, batch_size=8)


def test_lightning_ddp_saves_deltas_and_resumes_bit_exact(tmp_path: pathlib.Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from gpu_notebook.checkpoint.integrations.lightning import GpuNotebookCheckpointIO

    store = tmp_path / "store"
    model = Tiny(args=argparse.Namespace(depth=2, out=pathlib.Path("/tmp/out")))
    mc = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", max_steps=4, plugins=[GpuNotebookCheckpointIO(store)],
        callbacks=[mc], logger=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, _loader())

    ckpt = Checkpointer(store, read_only=True, current=False)
    infos = ckpt.list()
    assert [i.step for i in infos] == [2, 4]
    assert infos[1].new_bytes < infos[0].new_bytes / 2  # the frozen layer is not written again
    _no_pickle(ckpt)
    pointer = json.loads((tmp_path / "ckpts" / "epoch=0-step=4.ckpt").read_text())
    assert pointer["gpu_notebook_checkpoint"] == infos[1].id

    # resume (one process) from the pointer: weights, optimizer state, global step and hyper-parameters back
    seen: dict[str, object] = {}

    class Look(pl.Callback):
        def on_train_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
            seen["step"] = trainer.global_step
            seen["weights"] = {k: v.clone() for k, v in pl_module.state_dict().items()}
            seen["momentum"] = [s["momentum_buffer"].clone() for s in trainer.optimizers[0].state.values()]

    io = GpuNotebookCheckpointIO(store)
    saved = io.load_checkpoint(tmp_path / "ckpts" / "epoch=0-step=4.ckpt")
    assert saved["hyper_parameters"]["args"] == argparse.Namespace(depth=2, out=pathlib.Path("/tmp/out"))
    for k, v in saved["state_dict"].items():
        assert torch.equal(v, model.state_dict()[k])  # the spawned ranks' final weights
    t2 = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=6, plugins=[io], callbacks=[Look()], logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    t2.fit(Tiny(), _loader(), ckpt_path=str(tmp_path / "ckpts" / "epoch=0-step=4.ckpt"))
    assert seen["step"] == 4 and t2.global_step == 6
    for k, v in saved["state_dict"].items():
        assert torch.equal(seen["weights"][k], v)  # type: ignore[index]
    got = seen["momentum"]
    want = [s["momentum_buffer"] for s in saved["optimizer_states"][0]["state"].values()]
    assert len(got) == len(want) == 2 and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))  # type: ignore[arg-type]
    # a machine without the pointer files resumes from the store alone
    assert GpuNotebookCheckpointIO(store).load_checkpoint("gone/epoch=0-step=2.ckpt")["global_step"] == 2
    assert io.resume_path() is not None
    assert io.load_checkpoint(io.resume_path())["global_step"] == 4
