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


# ---------------------------------------------------------------------------------------------- HF Trainer
def _hf_worker(rank: int, world: int, port: int, store: str, out: str, max_steps: int, resume: bool) -> None:
    import os

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port), TOKENIZERS_PARALLELISM="false",
    )  # fmt: skip
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from gpu_notebook.checkpoint.integrations.transformers import GpuNotebookCallback, resume_folder

    args = TrainingArguments(
        output_dir=out, use_cpu=True, ddp_backend="gloo", max_steps=max_steps, save_steps=2,
        per_device_train_batch_size=4, learning_rate=1e-3, report_to="none", logging_steps=100,
        disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    _ = args.device  # sets up the process group
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=16))
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 512, (64, 16), generator=g)
    data = [{"input_ids": r, "labels": r} for r in ids]
    ckpt = Checkpointer(store, current=False)
    steps: list[int] = []

    class Count(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            steps.append(state.global_step)

    trainer = Trainer(
        model=model, args=args, train_dataset=data, callbacks=[GpuNotebookCallback(ckpt), Count()]
    )
    where = resume_folder(ckpt) if resume else None
    trainer.train(resume_from_checkpoint=where)
    ckpt.close()
    with open(os.path.join(out, f"steps_{rank}.json"), "w") as fh:
        json.dump(steps, fh)


def _spawn_hf(store: str, out: str, max_steps: int, resume: bool) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _hf_worker, args=(2, port, store, out, max_steps, resume), nprocs=2, start_method="spawn"
    )


def test_hf_trainer_ddp_saves_deltas_and_resumes(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from gpu_notebook.checkpoint.integrations.transformers import resume_folder

    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    _spawn_hf(store, out, 4, resume=False)
    ckpt = Checkpointer(store, current=False)
    infos = ckpt.list()
    assert [i.step for i in infos] == [2, 4]
    assert infos[1].new_bytes < infos[0].new_bytes
    assert {s["rank"] for s in ckpt.manifest(infos[1].id)["per_rank"]} == {0, 1}  # each rank's RNG file
    _no_pickle(ckpt)

    # the folder written back holds what the Trainer wrote: bit-exact weights and optimizer state, the step
    folder = resume_folder(ckpt, tmp_path / "back")
    assert folder is not None and folder.endswith("checkpoint-4")
    orig = pathlib.Path(out) / "checkpoint-4"
    a, b = load_file(orig / "model.safetensors"), load_file(pathlib.Path(folder) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa = torch.load(orig / "optimizer.pt", weights_only=True)
    ob = torch.load(pathlib.Path(folder) / "optimizer.pt", weights_only=True)
    for i, s in oa["state"].items():
        assert all(torch.equal(v, ob["state"][i][k]) for k, v in s.items())
    assert json.loads((pathlib.Path(folder) / "trainer_state.json").read_text())["global_step"] == 4

    # resume on 2 ranks from the store alone (the Trainer's own folders gone): two more steps, not six
    import shutil

    shutil.rmtree(out)
    _spawn_hf(store, out, 6, resume=True)
    assert json.loads((pathlib.Path(out) / "steps_0.json").read_text()) == [5, 6]
    assert [i.step for i in Checkpointer(store, current=False).list()] == [2, 4, 6]


def test_hf_trainer_on_a_preemption_notice_saves_to_s3_and_stops(tmp_path: pathlib.Path) -> None:
    """One process, the default save schedule never reached: a spot notice (the fake AWS metadata service) makes
    the callback save at once, into S3 (moto), and stop the Trainer; the folder written back resumes there."""
    pytest.importorskip("transformers")
    from _poll import wait_for
    from _s3server import serving
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from gpu_notebook.checkpoint import PreemptionWatcher
    from gpu_notebook.checkpoint.integrations.transformers import GpuNotebookCallback, resume_folder
    from gpu_notebook.testing.cloud_metadata import FakeMetadataServer

    with serving() as s3, FakeMetadataServer("aws") as md:
        s3.client().create_bucket(Bucket="hf-run")
        url = "s3://hf-run/trainer"
        watcher = PreemptionWatcher("aws", url=md.url, interval_s=0.05)
        ckpt = Checkpointer(url, endpoint_url=s3.endpoint, preemption=watcher, current=False)

        class Notice(TrainerCallback):  # type: ignore[misc]
            def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
                if state.global_step == 3:
                    md.preempt(in_s=120)
                    wait_for(lambda: watcher.notice is not None, what="the watcher to see the notice")

        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=40, save_steps=1000,
            per_device_train_batch_size=4, learning_rate=1e-3, report_to="none", logging_steps=100,
            disable_tqdm=True, seed=0, dataloader_num_workers=0,
        )  # fmt: skip
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=8))
        ids = torch.randint(0, 128, (160, 8), generator=torch.Generator().manual_seed(2))
        data = [{"input_ids": r, "labels": r} for r in ids]
        trainer = Trainer(
            model=model, args=args, train_dataset=data, callbacks=[Notice(), GpuNotebookCallback(ckpt)]
        )
        trainer.train()
        stopped = trainer.state.global_step
        ckpt.close()
        assert 3 <= stopped <= 6, stopped  # stopped by the notice (seen at step 3 or soon after), not at 40
        back = Checkpointer(url, endpoint_url=s3.endpoint, preemption=None, current=False)
        assert [i.step for i in back.list()] == [stopped]  # the notice's save, in S3
        folder = resume_folder(back, tmp_path / "back")
        assert folder is not None and folder.endswith(f"checkpoint-{stopped}")
        state = json.loads((pathlib.Path(folder) / "trainer_state.json").read_text())
        assert state["global_step"] == stopped
        back.close()
