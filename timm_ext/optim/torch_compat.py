"""The few torch calls of ``timm_ext.optim`` that are newer than the package's torch floor, with fallbacks.

Each helper uses the current torch API when it exists and an equivalent older one otherwise, so the
optimizers behave the same on every supported torch:

* ``total_norm``: ``torch.nn.utils.get_total_norm`` (torch 2.6) or one ``_foreach_norm`` + norm;
* ``foreach_copy_``: ``torch._foreach_copy_`` (torch 2.1) or a loop of ``copy_``;
* ``autocast_state``: ``torch.is_autocast_enabled(device_type)`` / ``torch.get_autocast_dtype(device_type)``
  (torch 2.4) or the per-device functions they replaced (``is_autocast_cpu_enabled``, ...).
"""
from typing import List, Optional, Tuple

import torch

__all__ = ['autocast_state', 'foreach_copy_', 'total_norm']

# what this torch offers (module constants, so a test can take the older route on a new torch)
HAS_GET_TOTAL_NORM = hasattr(torch.nn.utils, 'get_total_norm')
HAS_FOREACH_COPY = hasattr(torch, '_foreach_copy_')
HAS_DEVICE_AUTOCAST_API = hasattr(torch, 'get_autocast_dtype')


def total_norm(tensors: List[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of ``tensors`` (per-tensor norms gathered on the first one's device), as
    ``torch.nn.utils.get_total_norm`` computes it."""
    if HAS_GET_TOTAL_NORM:
        return torch.nn.utils.get_total_norm(tensors, foreach=True)
    if not tensors:
        return torch.tensor(0.)
    norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))


def foreach_copy_(dst: List[torch.Tensor], src: List[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every i, in one multi-tensor kernel where torch has it."""
    if not dst:
        return
    if HAS_FOREACH_COPY:
        torch._foreach_copy_(dst, src)
        return
    for d, s in zip(dst, src):
        d.copy_(s)


def autocast_state(device_type: str) -> Tuple[bool, Optional[torch.dtype]]:
    """(enabled, dtype) of the autocast context active for ``device_type``."""
    if HAS_DEVICE_AUTOCAST_API:  # torch >= 2.4: one API for every device type
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    if device_type == 'cuda':
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    return False, None  # other accelerators before torch 2.4: the replay runs without autocast
