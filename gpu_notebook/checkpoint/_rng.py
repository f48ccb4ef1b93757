"""Capture and restore every random number generator a training loop usually depends on."""

from __future__ import annotations

import random
import sys
from typing import Any

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """The state of Python's ``random``, numpy's global RNG, torch's CPU RNG and (if used) CUDA RNGs.

    The result is safe to checkpoint (tensors, arrays and plain values only).
    """
    import numpy as np

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    if "torch" in sys.modules:
        import torch

        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    import numpy as np

    if "python" in state:
        v = state["python"]
        random.setstate((v[0], tuple(v[1]), v[2]))
    if "numpy" in state:
        np.random.set_state(tuple(state["numpy"]))
    if "torch" in state:
        import torch

        # torch takes RNG states only as CPU byte tensors (restore(map_location=...) moves them with the rest)
        def cpu(t: Any) -> Any:
            return torch.as_tensor(t).to("cpu", torch.uint8).contiguous()

        torch.set_rng_state(cpu(state["torch"]))
        if "cuda" in state and torch.cuda.is_available():
            states = [cpu(t) for t in state["cuda"]]
            n = torch.cuda.device_count()
            if (
                len(states) > n
            ):  # resumed on fewer GPUs than it was saved from (set_rng_state_all would raise)
                import warnings

                warnings.warn(
                    f"the checkpoint holds the CUDA RNG states of {len(states)} GPUs and this process sees {n}: "
                    f"the first {n} are restored, the others dropped",
                    RuntimeWarning,
                    stacklevel=2,
                )
                states = states[:n]
            torch.cuda.set_rng_state_all(states)
