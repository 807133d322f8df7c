"""m-sharpness: SAM's perturbation computed per chunk of ``m`` images, as the SAM papers ran it.

Foret et al. (2021, Sec. 4.1 and App. C.3) and Chen et al. (2022, App. H) compute the ascent
direction on each accelerator from its own few images (the JAX code perturbs per replica and
all-reduces only the second gradient); the ViT-SAM models used 32 images per TPU core. With
``m_sharpness=M`` the batch of each worker is cut into chunks of M images, and for each chunk

    g_i = grad L_i(w),   e_i = rho * g_i / ||g_i||,   h_i = grad L_i(w + e_i)

and the descent gradient is the mean of the ``h_i`` (then averaged over the workers once). SAM's one
update loop runs the chunks; this module holds what they share: how a batch is cut (``BatchChunk`` for a
closure, ``slice_batch`` for train.py's recorded calls), the checks, and the sum of the chunks' gradients.
"""
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from timm_ext.optim.ddp import NoSync, world_size

__all__ = ['BatchChunk', 'GradientSum', 'check_chunk_sync', 'chunk_count', 'mean_loss', 'refuse_loss_scaling',
           'slice_batch']


def slice_batch(values: Iterable[Any], batch_size: int, rows: slice) -> Tuple[Any, ...]:
    """Every tensor whose first dimension is the batch, cut to ``rows``; anything else as it is."""
    return tuple(v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch_size else v
                 for v in values)


def chunk_count(batch_size: int, m_sharpness: int, where: str = '') -> int:
    """How many chunks of ``m_sharpness`` images a batch holds; a one-line error if they do not divide it."""
    if batch_size % m_sharpness != 0:
        raise ValueError(f'SAM m_sharpness={m_sharpness} must divide the per-worker batch, got a batch of '
                         f'{batch_size} images{where}')
    return batch_size // m_sharpness


def check_chunk_sync(no_sync: NoSync) -> None:
    """Under torch.distributed each worker's chunks need its own gradient, i.e. a ``no_sync``."""
    if world_size() > 1 and no_sync is None:
        raise ValueError('SAM m_sharpness under torch.distributed needs each worker\'s own gradient: pass '
                         'no_sync=ddp_model.no_sync to step() (train.py\'s task provides it)')


def refuse_loss_scaling(scaled: bool) -> None:
    if scaled:
        raise RuntimeError('SAM m_sharpness does not support fp16 loss scaling (GradScaler): train with '
                           'bf16 autocast (--amp-dtype bfloat16) or fp32, or leave m_sharpness unset')


class BatchChunk:
    """What a closure receives under ``m_sharpness``: ``xs, ys = chunk(x, y)`` cuts the current chunk.

    Every tensor whose first dimension equals the first tensor's (the batch) is sliced; anything else is
    returned unchanged. With ``size=None`` (a plain step of ``interval``) the whole batch is returned.
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
                chunk_count(batch, self.size)
                self.batch_size = batch
            elif batch != self.batch_size:
                raise ValueError(f'chunk(...) got batches of {self.batch_size} and {batch} images in one step')
            start = self.index * self.size
            out = slice_batch(values, batch, slice(start, start + self.size))
        return out[0] if len(out) == 1 else out

    @property
    def count(self) -> int:
        if self.batch_size is None:
            raise RuntimeError('SAM m_sharpness: the closure never called chunk(...) on its batch, so SAM cannot '
                               'split it: def closure(chunk): xs, ys = chunk(x, y); ...')
        return self.batch_size // self.size


class GradientSum:
    """The sum of the chunks' gradients (copied, so the grads can be zeroed between chunks), and their mean."""

    def __init__(self) -> None:
        self.total: Dict[torch.Tensor, torch.Tensor] = {}
        self.count = 0

    def add(self, params: List[torch.Tensor]) -> None:
        """Add each parameter's ``.grad``."""
        self.add_values({p: p.grad for p in params})

    def add_values(self, values: Dict[torch.Tensor, torch.Tensor]) -> None:
        for p, value in values.items():
            if p in self.total:
                self.total[p].add_(value)
            else:
                self.total[p] = value.detach().clone()
        self.count += 1

    def mean(self) -> Dict[torch.Tensor, torch.Tensor]:
        return {p: total.div_(self.count) for p, total in self.total.items()}

    def write_mean_to_grads(self) -> None:
        """``p.grad`` = the mean over the chunks."""
        for p, mean in self.mean().items():
            p.grad = mean


def mean_loss(losses: List[Any]) -> Any:
    """The mean of the chunks' losses at w (what a closure step returns)."""
    values = [loss for loss in losses if loss is not None]
    if not values:
        return None
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack([v.detach().float() for v in values]).mean()
    return sum(float(v) for v in values) / len(values)
