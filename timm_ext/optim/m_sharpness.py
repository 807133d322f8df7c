"""m-sharpness: SAM's perturbation computed per chunk of ``m`` images, as the SAM papers ran it.

Foret et al. (2021, Sec. 4.1 and App. C.3) and Chen et al. (2022, App. H) compute the ascent
direction on each accelerator from its own few images (the JAX code perturbs per replica and
all-reduces only the second gradient); the ViT-SAM models used 32 images per TPU core. With
``m_sharpness=M`` the batch of each worker is cut into chunks of M images, and for each chunk

    g_i = grad L_i(w),   e_i = rho * g_i / ||g_i||,   h_i = grad L_i(w + e_i)

and the descent gradient is the mean of the ``h_i`` (then averaged over the workers once).

Inside timm's train.py the training task's recorded calls are sliced along the batch dimension
(every tensor argument whose first dimension is the batch size); a closure receives a
:class:`BatchChunk` and slices its own batch with it. This module holds those chunk sources and the
one all-reduce of the result under DDP; the update itself is ``SAM._chunked_step``.
"""
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from timm_ext.optim.task_capture import TaskCall

__all__ = ['BatchChunk', 'ClosureChunks', 'ReplayChunks', 'all_reduce_mean', 'check_m_sharpness', 'no_sync_of',
           'sync_context', 'world_size']


def check_m_sharpness(m_sharpness: Any, where: str = '') -> None:
    if m_sharpness is None:
        return
    if isinstance(m_sharpness, bool) or not isinstance(m_sharpness, int) or m_sharpness < 1:
        raise ValueError(f'SAM m_sharpness must be a positive integer (images per perturbation) or None, '
                         f'got m_sharpness={m_sharpness!r}{where}')


def _num_chunks(batch_size: int, m_sharpness: int, where: str) -> int:
    if batch_size % m_sharpness != 0:
        raise ValueError(f'SAM m_sharpness={m_sharpness} must divide the per-worker batch, got a batch of '
                         f'{batch_size} images{where}')
    return batch_size // m_sharpness


def _slice_batch(values: Sequence[Any], batch_size: int, index: slice) -> Tuple[Any, ...]:
    """Every tensor whose first dimension is the batch, cut to ``index``; anything else as it is."""
    return tuple(v[index] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch_size else v
                 for v in values)


def world_size() -> int:
    """Number of workers of the default process group (1 without torch.distributed)."""
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


class BatchChunk:
    """What a closure receives under ``m_sharpness``: ``xs, ys = chunk(x, y)`` cuts the current chunk.

    Every tensor whose first dimension equals the first tensor's (the batch) is sliced; anything
    else is returned unchanged. With ``size=None`` (a step without SAM's chunked passes) the whole
    batch is returned.
    """

    def __init__(self, size: Optional[int]) -> None:
        self.size = size
        self.index = 0
        self.batch_size: Optional[int] = None

    def __call__(self, *values: Any) -> Any:
        if not values or not isinstance(values[0], torch.Tensor) or values[0].dim() == 0:
            raise ValueError('chunk(...) takes the batch tensors, the first one batched along dim 0, '
                             f'got {type(values[0]).__name__ if values else "nothing"}')
        batch = values[0].shape[0]
        if self.size is None:
            out = tuple(values)
        else:
            if self.batch_size is None:
                _num_chunks(batch, self.size, '')
                self.batch_size = batch
            elif batch != self.batch_size:
                raise ValueError(f'chunk(...) got batches of {self.batch_size} and {batch} images in one step')
            start = self.index * self.size
            out = _slice_batch(values, batch, slice(start, start + self.size))
        return out[0] if len(out) == 1 else out

    @property
    def count(self) -> int:
        if self.batch_size is None:
            raise RuntimeError('SAM m_sharpness: the closure never called chunk(...) on its batch, so SAM cannot '
                               'split it: def closure(chunk): xs, ys = chunk(x, y); ...')
        return self.batch_size // self.size


class ClosureChunks:
    """The chunks of a closure's batch: ``run(i)`` evaluates the closure on chunk i."""

    def __init__(self, closure: Callable[[BatchChunk], Any], size: int) -> None:
        self.closure = closure
        self.chunk = BatchChunk(size)

    def count(self) -> int:
        return self.chunk.count

    def prepare(self, index: int) -> None:
        self.chunk.index = index

    def run(self, index: int) -> Any:
        self.chunk.index = index
        with torch.enable_grad():
            return self.closure(self.chunk)


class ReplayChunks:
    """The chunks of the recorded training-task calls of one step: ``run(i)`` forwards and backwards chunk i.

    Each call's chunks start from the random state the call first ran with (so a chunk's two passes
    draw the same masks, and chunks draw different ones); the caller forks the generators around
    the whole step.
    """

    def __init__(
            self,
            task: torch.nn.Module,
            calls: List[TaskCall],
            size: int,
            set_replaying: Callable[[bool], None],
    ) -> None:
        self.task = task
        self.set_replaying = set_replaying
        self.items: List[Tuple[TaskCall, int, slice]] = []
        for idx, call in enumerate(calls):
            first = call.args[0] if call.args else None
            if not isinstance(first, torch.Tensor) or first.dim() == 0:
                raise ValueError(f'SAM m_sharpness needs the training task\'s input as a batched tensor, got '
                                 f'{type(first).__name__} (NaFlex dict input cannot be split)')
            batch = first.shape[0]
            where = f' (micro-batch {idx + 1} of {len(calls)})' if len(calls) > 1 else ''
            for i in range(_num_chunks(batch, size, where)):
                self.items.append((call, batch, slice(i * size, (i + 1) * size)))

    def count(self) -> int:
        return len(self.items)

    def prepare(self, index: int) -> None:
        call, _, part = self.items[index]
        if part.start == 0 and call.rng is not None:
            call.rng.apply()

    def run(self, index: int) -> torch.Tensor:
        call, batch, part = self.items[index]
        args = _slice_batch(call.args, batch, part)
        keys = list(call.kwargs)
        values = _slice_batch([call.kwargs[k] for k in keys], batch, part)
        self.set_replaying(True)
        try:
            with torch.enable_grad():
                with call.autocast():
                    loss = self.task(*args, **dict(zip(keys, values)))['loss']
                loss.backward()
        finally:
            self.set_replaying(False)
        return loss.detach()


def no_sync_of(task: Optional[torch.nn.Module]) -> Optional[Callable[[], ContextManager]]:
    """The task's ``no_sync`` (timm >= 1.0.24), or its DDP module's (timm 1.0.23 keeps it in ``task.model``)."""
    if task is None:
        return None
    if hasattr(task, 'no_sync'):
        return task.no_sync
    module = getattr(task, 'model', None)
    if module is not None and hasattr(module, 'no_sync'):
        return module.no_sync
    return None


def sync_context(no_sync: Optional[Callable[[], ContextManager]]) -> ContextManager:
    return no_sync() if no_sync is not None else nullcontext()
