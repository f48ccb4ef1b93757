"""The Hugging Face Trainer saving through a :class:`Checkpointer`, and resuming from it.

>>> ckpt = Checkpointer("s3://bucket/run1")                                           # doctest: +SKIP
>>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[GpuNotebookCallback(ckpt)])  # doctest: +SKIP
>>> trainer.train(resume_from_checkpoint=resume_folder(ckpt))   # None (a fresh start) if the store is empty  # doctest: +SKIP

Each time the Trainer saves (``save_strategy``/``save_steps``), it writes its checkpoint folder
(``output_dir/checkpoint-N``: weights, ``optimizer.pt``, ``scheduler.pt``, ``trainer_state.json``, RNG files);
:class:`GpuNotebookCallback`'s ``on_save`` then saves that folder's content through the Checkpointer: tensors as
tensors (deduplicated, delta-compressed against the last full base, uploaded in the background), JSON and
text files as text, other files as bytes, and each rank's ``rng_state_<rank>.pth`` in its per-rank section. The
``.pt`` files are read with ``torch.load(weights_only=True)``; nothing is pickled. ``resume_folder`` writes a
checkpoint back as such a folder, which the Trainer's own ``resume_from_checkpoint`` reads.

On a spot preemption notice (the Checkpointer's ``preemption`` watcher, agreed on by every rank), the callback
asks the Trainer to save and stop at the end of the step; that save is committed before ``on_save`` returns.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from ..checkpointer import Checkpointer
from ..per_rank import PerRank
from ._safe import from_safe, to_safe

__all__ = ["GpuNotebookCallback", "resume_folder"]

log = logging.getLogger("gpu_notebook.checkpoint")

_TEXT = (".json", ".txt", ".md", ".model", ".jinja", ".py", ".yaml")
#: pickled by the Trainer (its TrainingArguments); it never reads it on a resume: kept as its bytes
_OPAQUE = ("training_args.bin",)


def _rng_name(rank: int, world_size: int) -> str:
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"


def _torch_load(path: str) -> Any:
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():  # the Trainer's own allow-list (numpy's RNG state) for weights_only loads
        return torch.load(path, weights_only=True, map_location="cpu")


def _read_file(path: str) -> dict[str, Any]:
    name = os.path.basename(path)
    if name.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
            meta = f.metadata()
        return {"kind": "safetensors", "tensors": tensors, "metadata": meta}
    if name.endswith((".pt", ".pth", ".bin")) and name not in _OPAQUE:
        return {"kind": "torch", "value": to_safe(_torch_load(path), name)}
    with open(path, "rb") as fh:
        raw = fh.read()
    if name.endswith(_TEXT):
        try:
            return {"kind": "text", "value": raw.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"kind": "bytes", "value": np.frombuffer(raw, dtype=np.uint8).copy()}


def _write_file(path: str, entry: dict[str, Any]) -> None:
    kind = entry["kind"]
    if kind == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in entry["tensors"].items()}, path, metadata=entry["metadata"])
    elif kind == "torch":
        torch.save(from_safe(entry["value"]), path)
    elif kind == "text":
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(entry["value"])
    else:
        with open(path, "wb") as fh:
            fh.write(np.asarray(entry["value"], dtype=np.uint8).tobytes())


class GpuNotebookCallback(TrainerCallback):  # type: ignore[misc]
    """Saves each Trainer checkpoint through ``checkpointer``; saves and stops on a preemption notice.

    Every rank must have it (the Trainer calls ``on_save`` on every rank, and every rank saves its RNG file in
    its per-rank section); rank 0 writes the shared files. Make the :class:`Checkpointer` on every rank.

    Parameters
    ----------
    checkpointer
        Where the checkpoints go (a folder or ``s3://`` store, with its own options).
    block
        Wait for each save to be committed (default: it uploads in the background; a save on a preemption notice
        and the end of training always wait).
    """

    def __init__(self, checkpointer: Checkpointer, *, block: bool = False) -> None:
        if not isinstance(checkpointer, Checkpointer):
            raise TypeError(f"GpuNotebookCallback needs a Checkpointer, not a {type(checkpointer).__name__}")
        self.checkpointer = checkpointer
        self.block = bool(block)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # every rank asks, every step: the notice is agreed on with one small all-reduce (see policy.py)
        notice = self.checkpointer._preemption.agreed_notice()
        if notice is not None and not self.checkpointer._preemption.saved:
            log.warning(
                "preemption notice (%s): the Trainer saves and stops after step %s", notice, state.global_step
            )
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        folder_name = f"checkpoint-{state.global_step}"
        folder = os.path.join(args.output_dir, folder_name)
        rank, world = int(args.process_index), int(args.world_size)
        files: dict[str, Any] | None = None
        if rank == 0:
            files = {
                n: _read_file(os.path.join(folder, n))
                for n in sorted(os.listdir(folder))
                if os.path.isfile(os.path.join(folder, n)) and not n.startswith("rng_state")
            }
        rng_path = os.path.join(folder, _rng_name(rank, world))
        rng = to_safe(_torch_load(rng_path)) if os.path.isfile(rng_path) else None
        saved = {"hf_trainer": {"folder": folder_name, "files": files, "rng": PerRank(rng)}}
        step = int(state.global_step)
        ckpt = self.checkpointer
        pre = ckpt._preemption
        if pre.notice is not None and not pre.saved:
            ckpt.maybe_save(saved, step)  # the save on a notice: a full base if it fits, committed on return
        else:
            ckpt.save(saved, step=step, block=self.block)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.checkpointer.wait()
        return control


def resume_folder(
    checkpointer: Checkpointer, dest: str | os.PathLike[str] | None = None, ckpt_id: str | None = None
) -> str | None:
    """Write a checkpoint (the latest by default) as the Trainer's checkpoint folder; return its path for
    ``trainer.train(resume_from_checkpoint=...)``, or None when the store is empty (a fresh start).

    Every rank calls it and gets a folder of its own (in ``dest``, default a new temporary folder) with the
    shared files and its own RNG file. Onto another world size the RNG files are left out (the Trainer then
    logs that reproducibility is not guaranteed).
    """
    info = checkpointer.latest() if ckpt_id is None else None
    if ckpt_id is None and info is None:
        return None
    doc = checkpointer.manifest(ckpt_id or (info.id if info else None))
    same = int(doc.get("world_size", 1)) == checkpointer.world_size
    state = checkpointer.restore(doc["id"], per_rank="strict" if same else "drop")["hf_trainer"]
    rank = checkpointer.rank
    base = os.fspath(dest) if dest is not None else tempfile.mkdtemp(prefix=f"gnb-resume-r{rank}-")
    folder = os.path.join(base, state["folder"])
    os.makedirs(folder, exist_ok=True)
    for name, entry in (state.get("files") or {}).items():
        _write_file(os.path.join(folder, name), entry)
    rng = state.get("rng")
    if same and rng is not None:
        torch.save(from_safe(rng), os.path.join(folder, _rng_name(rank, checkpointer.world_size)))
    with open(os.path.join(folder, "gpu_notebook_checkpoint.json"), "w", encoding="utf-8") as fh:
        json.dump({"id": doc["id"], "store": checkpointer.store.url}, fh)
    return folder
