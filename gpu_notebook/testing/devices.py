"""A tensor that says it is on a GPU, for testing code that moves tensors off a GPU on machines without one.

:class:`OnAccelerator` holds its data on the CPU but reports ``cuda:0`` as its ``.device``, so code that
decides by ``tensor.device`` (what ``%gpu_pull`` and cell results send back) takes its GPU path. Its operations
return plain tensors (no ``__torch_function__`` of its own), and ``t.cpu()`` is an ordinary CPU tensor, as it
is for a real CUDA tensor. Importing this module imports torch.
"""

from __future__ import annotations

import torch

__all__ = ["OnAccelerator", "on_accelerator"]


class OnAccelerator(torch.Tensor):
    """A CPU tensor whose ``.device`` is ``cuda:0`` (see the module docstring)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @property  # type: ignore[override]
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    def cpu(self, *args: object, **kwargs: object) -> torch.Tensor:
        """A plain CPU tensor with this data (on a real GPU tensor, ``cpu()`` copies it off the device)."""
        return self.as_subclass(torch.Tensor)


def on_accelerator(t: torch.Tensor) -> OnAccelerator:
    """``t``'s data as an :class:`OnAccelerator`.

    >>> x = on_accelerator(torch.ones(2))
    >>> x.device, x.cpu().device, type(x.cpu()).__name__
    (device(type='cuda', index=0), device(type='cpu'), 'Tensor')
    """
    return t.as_subclass(OnAccelerator)  # type: ignore[return-value]
