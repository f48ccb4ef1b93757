"""Framework hooks: save and resume Lightning and Hugging Face Trainer runs through a :class:`Checkpointer`.

* :mod:`.lightning`: ``GpuNotebookCheckpointIO``, a Lightning ``CheckpointIO`` plugin.
* :mod:`.transformers`: ``GpuNotebookCallback`` (a ``TrainerCallback``) and ``resume_folder``.

Importing this package is cheap; each module imports its framework when it is imported itself.
"""

from __future__ import annotations

__all__: list[str] = []
