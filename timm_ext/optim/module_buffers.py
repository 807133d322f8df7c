"""Snapshot and restore of a module's buffers around SAM's second forward pass.

SAM evaluates the model twice per update; the second pass runs at perturbed weights and must not
move BatchNorm running statistics (nor ``num_batches_tracked``, nor any other buffer a forward
pass updates). Copying the buffers after the first pass and copying them back after the second
keeps exactly the first pass's values, for every norm layer type, at the cost of one copy of the
(small) buffers.
"""
from typing import List, Optional

import torch
import torch.nn as nn

__all__ = ['BufferSnapshot']


class BufferSnapshot:
    """Holds copies of ``module.buffers()``; ``restore()`` writes them back bit-exactly."""

    def __init__(self) -> None:
        self._buffers: List[torch.Tensor] = []
        self._copies: List[torch.Tensor] = []
        self._taken = False

    def capture(self, module: Optional[nn.Module]) -> None:
        """Copy the current buffers of ``module`` (reusing the copy storage between steps)."""
        buffers = [] if module is None else [b for b in module.buffers()]
        if not self._same_layout(buffers):
            self._copies = [torch.empty_like(b) for b in buffers]
        self._buffers = buffers
        if buffers:
            torch._foreach_copy_(self._copies, buffers)
        self._taken = True

    @property
    def nbytes(self) -> int:
        """Memory of the copies (kept between steps)."""
        return sum(c.numel() * c.element_size() for c in self._copies)

    @property
    def held(self) -> bool:
        """Whether a capture is waiting to be restored."""
        return self._taken

    def restore(self) -> None:
        """Write the captured values back into the same buffer tensors (no-op if nothing captured)."""
        if self._taken and self._buffers:
            torch._foreach_copy_(self._buffers, self._copies)
        self._taken = False

    def _same_layout(self, buffers: List[torch.Tensor]) -> bool:
        if len(buffers) != len(self._copies):
            return False
        return all(
            b.shape == c.shape and b.dtype == c.dtype and b.device == c.device
            for b, c in zip(buffers, self._copies))
