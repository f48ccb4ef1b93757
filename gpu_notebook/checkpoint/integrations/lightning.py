"""A Lightning ``CheckpointIO`` plugin that saves Lightning's checkpoints as delta checkpoints in our store.

>>> from gpu_notebook.checkpoint.integrations.lightning import GpuNotebookCheckpointIO    # doctest: +SKIP
>>> io = GpuNotebookCheckpointIO("s3://bucket/run1")                                      # doctest: +SKIP
>>> trainer = Trainer(plugins=[io], callbacks=[ModelCheckpoint(save_last=True)])          # doctest: +SKIP
>>> trainer.fit(model, ckpt_path="last")                                                  # doctest: +SKIP

Lightning names each checkpoint by a file path (``.../epoch=0-step=10.ckpt``) and finds them on the file system
(``ckpt_path="last"``, ``ModelCheckpoint``'s top-k). So a save puts the checkpoint in the store and writes a
small JSON *pointer* at that path naming it; the tensors, deltas and S3 uploads are the store's. A load reads
the pointer (a plain ``torch.save`` file, such as ddp_spawn's hand-over of the final weights, goes through
Lightning's own ``TorchCheckpointIO``), or, where the file is not there (a new machine), finds the newest checkpoint saved under that
file name in the store (:meth:`GpuNotebookCheckpointIO.resume_path` gives the newest one's).

Only global rank 0 saves (Lightning calls ``save_checkpoint`` there), so the plugin's :class:`Checkpointer` is a
process-local one (``world_size=1``), made on first use in each process: under ``ddp_spawn`` the plugin is
pickled to the workers, which a Checkpointer (threads) cannot be.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO

from .._errors import CheckpointError
from ..checkpointer import Checkpointer
from ._safe import from_safe, to_safe

__all__ = ["GpuNotebookCheckpointIO", "POINTER_KEY"]

log = logging.getLogger("gpu_notebook.checkpoint")

#: the key of a pointer file's JSON object that names the checkpoint in the store
POINTER_KEY = "gpu_notebook_checkpoint"


def _global_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


class GpuNotebookCheckpointIO(CheckpointIO):
    """Lightning checkpoints saved as lossless delta checkpoints in a folder or ``s3://`` store.

    Parameters
    ----------
    store
        A folder or ``s3://bucket/prefix`` URL (a string or path: the plugin travels to spawned workers).
    pickle_objects
        Pickle objects of the checkpoint that have no safe representation (one by one; never a tensor): see
        :mod:`gpu_notebook.checkpoint.integrations._safe`. Loading then needs it too.
    block
        Wait for each save to be committed (default: the upload runs in the background; :meth:`teardown`, called
        by Lightning at the end of ``fit``, waits for it).
    checkpointer_options
        Passed to :class:`Checkpointer` (``full_every``, ``endpoint_url``, ...).
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        *,
        pickle_objects: bool = False,
        block: bool = False,
        **checkpointer_options: Any,
    ) -> None:
        if isinstance(store, Checkpointer):
            raise TypeError(
                "GpuNotebookCheckpointIO takes the store's URL or folder (it makes its Checkpointer in each "
                "process), not a Checkpointer; pass the Checkpointer's options as keywords"
            )
        self.store = os.fspath(store)
        self.pickle_objects = bool(pickle_objects)
        self.block = bool(block)
        self.options = dict(checkpointer_options)
        self._ckpt: Checkpointer | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ckpt": None}

    def __repr__(self) -> str:
        return f"GpuNotebookCheckpointIO({self.store!r})"

    @property
    def checkpointer(self) -> Checkpointer:
        """This process's :class:`Checkpointer` of the store (read-only on the ranks that do not save)."""
        if self._ckpt is None:
            writer = _global_rank() == 0
            opts = {"rng": False, "current": writer, **self.options}
            self._ckpt = Checkpointer(
                self.store, rank=0, world_size=1, read_only=not writer, preemption=None, **opts
            )
        return self._ckpt

    # ------------------------------------------------------------------ CheckpointIO
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Save ``checkpoint`` in the store and write a pointer to it at ``path``."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options, got {storage_options!r}")
        if "pytorch-lightning_version" not in checkpoint:
            # not a training checkpoint: ddp_spawn hands the final weights to the main process this way
            TorchCheckpointIO().save_checkpoint(checkpoint, path)
            return
        name = os.path.basename(os.fspath(path))
        step = int(checkpoint.get("global_step", 0) or 0)
        state = {"lightning": to_safe(checkpoint, "", self.pickle_objects), "lightning_path": name}
        handle = self.checkpointer.save(state, step=step, block=self.block)
        pointer = {POINTER_KEY: handle.id, "store": self.checkpointer.store.url, "step": step, "path": name}
        self._write_pointer(path, pointer)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load the checkpoint ``path`` names (its pointer, else the newest one saved under its file name).

        ``weights_only`` is accepted and has nothing to do: nothing is unpickled (unless ``pickle_objects``).
        """
        if self._is_plain_file(os.fspath(path)):  # a torch.save file (ddp_spawn's weights, an older .ckpt)
            return TorchCheckpointIO().load_checkpoint(path, map_location, weights_only)
        ckpt = self.checkpointer
        if self._ckpt is not None and not ckpt.read_only:
            ckpt.wait()  # a save of this process may still be uploading
        ckpt_id = self._resolve(path)
        state = ckpt.restore(ckpt_id, map_location=_device(map_location))
        return from_safe(state["lightning"], self.pickle_objects)  # type: ignore[no-any-return]

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the pointer file. The checkpoint stays in the store until ``checkpointer.gc(keep=...)``:
        the checkpoints after it may be deltas over it."""
        from fsspec.core import url_to_fs

        fs, p = url_to_fs(os.fspath(path))
        if fs.exists(p):
            fs.rm(p, recursive=True)

    def teardown(self) -> None:
        """Wait for the save in flight (Lightning calls this at the end of ``fit``)."""
        if self._ckpt is not None and not self._ckpt.read_only:
            self._ckpt.wait()

    # ------------------------------------------------------------------ helpers
    def resume_path(self) -> str | None:
        """The Lightning path of the newest checkpoint in the store (for ``trainer.fit(ckpt_path=...)`` on a
        machine without the pointer files), or None if the store has none."""
        latest = self.checkpointer.latest()
        if latest is None:
            return None
        return f"{self.checkpointer.store.url.rstrip('/')}#{latest.id}"

    def _resolve(self, path: Any) -> str:
        text = os.fspath(path)
        if "#" in text and text.split("#", 1)[0].rstrip("/") == self.checkpointer.store.url.rstrip("/"):
            return text.split("#", 1)[1]
        pointer = self._read_pointer(text)
        if pointer is not None:
            return str(pointer[POINTER_KEY])
        name = os.path.basename(text)
        for info in reversed(self.checkpointer.list()):
            shards = self.checkpointer.manifest(info.id).get("shards") or [{}]
            tree = shards[0].get("tree")
            if isinstance(tree, dict) and tree.get("lightning_path") == name:
                return info.id
        raise CheckpointError(
            f"no checkpoint {text!r}: it is not a gpu_notebook pointer file, and no checkpoint in "
            f"{self.checkpointer.store.url} was saved under the name {name!r}"
        )

    @staticmethod
    def _write_pointer(path: Any, pointer: dict[str, Any]) -> None:
        from fsspec.core import url_to_fs

        fs, p = url_to_fs(os.fspath(path))
        parent = os.path.dirname(p)
        if parent:
            fs.makedirs(parent, exist_ok=True)
        with fs.open(p, "w") as f:
            f.write(json.dumps(pointer) + "\n")

    def _is_plain_file(self, path: str) -> bool:
        from fsspec.core import url_to_fs

        if "#" in path:
            return False
        fs, p = url_to_fs(path)
        return bool(fs.isfile(p)) and self._read_pointer(path) is None

    @staticmethod
    def _read_pointer(path: str) -> dict[str, Any] | None:
        from fsspec.core import url_to_fs

        fs, p = url_to_fs(path)
        if not fs.isfile(p) or fs.size(p) > 65536:
            return None
        with fs.open(p, "rb") as f:
            raw = f.read()
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            return None
        return doc if isinstance(doc, dict) and POINTER_KEY in doc else None


def _device(map_location: Any) -> Any:
    """What restore can take of Lightning's ``map_location`` (a device or its name; a function or a dict
    mapping: None, the tensors stay on the CPU)."""
    if map_location is None or callable(map_location) or isinstance(map_location, dict):
        return None
    return map_location
