"""What SAM needs from torch.distributed: the world size, one all-reduce of a gradient list, and a worker's
``no_sync`` (so each worker perturbs with its own gradient), all a no-op on one process."""
from contextlib import nullcontext
from typing import Callable, ContextManager, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

__all__ = ['NoSync', 'all_reduce_mean', 'no_sync_of', 'sync_context', 'world_size']

NoSync = Optional[Callable[[], ContextManager]]


def world_size() -> int:
    """Number of workers of the default process group, i.e. of all nodes (1 without torch.distributed).

    Never a per-node count (``LOCAL_WORLD_SIZE``): SAM's all-reduce spans every node, as DDP's does."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


@torch.no_grad()
def all_reduce_mean(tensors: List[torch.Tensor]) -> None:
    """Average ``tensors`` over the workers in place: one all-reduce per device and dtype (as DDP's mean)."""
    size = world_size()
    if size == 1 or not tensors:
        return
    buckets: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.device, t.dtype), []).append(t)
    for group in buckets.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        dist.all_reduce(flat)
        flat.div_(size)
        offset = 0
        for t in group:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def no_sync_of(task: Optional[torch.nn.Module]) -> NoSync:
    """The task's ``no_sync`` (timm >= 1.0.24), or its DDP module's (timm 1.0.23 keeps it in ``task.model``)."""
    if task is None:
        return None
    if hasattr(task, 'no_sync'):
        return task.no_sync
    module = getattr(task, 'model', None)
    if module is not None and hasattr(module, 'no_sync'):
        return module.no_sync
    return None


def sync_context(no_sync: NoSync) -> ContextManager:
    """``no_sync()`` where there is one (gradients stay local to the worker), else nothing."""
    return no_sync() if no_sync is not None else nullcontext()
