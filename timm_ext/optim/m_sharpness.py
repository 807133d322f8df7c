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
chunked update itself (``ChunkedSAMStep``, a part of :class:`timm_ext.optim.SAM`).
"""
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from timm_ext.optim.ddp import NoSync, all_reduce_mean, no_sync_of, sync_context, world_size
from timm_ext.optim.loss_scaling import NO_SCALING, LossScaling
from timm_ext.optim.rng import RngState, cuda_devices_of
from timm_ext.optim.sam_settings import check_m_sharpness as _check_m_sharpness
from timm_ext.optim.task_capture import TaskCall, TaskRecorder, _slice_batch

__all__ = ['BatchChunk', 'ChunkedSAMStep', 'ClosureChunks', 'ReplayChunks', 'all_reduce_mean', 'check_m_sharpness',
           'no_sync_of', 'sync_context', 'world_size']


def check_m_sharpness(m_sharpness: Any, where: str = '') -> None:
    try:
        _check_m_sharpness(m_sharpness)
    except ValueError as error:
        raise ValueError(f'{error}{where}') from None


def _num_chunks(batch_size: int, m_sharpness: int, where: str) -> int:
    if batch_size % m_sharpness != 0:
        raise ValueError(f'SAM m_sharpness={m_sharpness} must divide the per-worker batch, got a batch of '
                         f'{batch_size} images{where}')
    return batch_size // m_sharpness


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
    """The chunks of the recorded training-task calls of one step: ``run(i)`` replays chunk i.

    Each call's chunks start from the random state the call first ran with (so a chunk's two passes
    draw the same masks, and chunks draw different ones); the caller forks the generators around
    the whole step.
    """

    def __init__(self, recorder: TaskRecorder, calls: List[TaskCall], size: int) -> None:
        self.recorder = recorder
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
        return self.recorder.replay([call.rows(batch, part)])[0]


class ChunkedSAMStep:
    """The part of :class:`timm_ext.optim.SAM` that runs an m-sharpness update (a perturbation per chunk)."""

    def _chunked_step(
            self,
            source: Any,
            scaling: LossScaling,
            no_sync: NoSync,
            fork_rng: bool,
    ) -> List[Any]:
        """One SAM update with a perturbation per chunk of ``m_sharpness`` images (see ``m_sharpness``).

        Both passes of every chunk run inside ``no_sync`` (each worker uses its own gradient); the
        mean of the chunks' second-pass gradients is all-reduced once at the end under DDP.
        Returns the chunks' losses at w.
        """
        if scaling is not NO_SCALING:
            raise RuntimeError('SAM m_sharpness does not support fp16 loss scaling (GradScaler): train with '
                               'bf16 autocast (--amp-dtype bfloat16) or fp32, or leave m_sharpness unset')
        self.base_optimizer.zero_grad(set_to_none=True)  # train.py's full-batch gradient is not used
        self._prepare_sam_step()
        self._buffers.capture(self._module('its buffers (BatchNorm statistics) are updated by every chunk pass'))
        devices = cuda_devices_of(self._params())
        descent: Dict[torch.Tensor, torch.Tensor] = {}
        clean_sum: Dict[torch.Tensor, torch.Tensor] = {}
        losses = []
        try:
            with torch.random.fork_rng(devices=devices) if fork_rng else nullcontext():
                index = 0
                while index == 0 or index < source.count():
                    source.prepare(index)
                    rng = RngState.capture(devices)
                    with sync_context(no_sync):
                        losses.append(source.run(index))
                    grouped = self._grouped_params_with_grad()
                    if self._keeps_clean_grad:
                        self._keep_clean(grouped)
                        _accumulate(clean_sum, [(p, self._clean[p]) for _, params, _ in grouped for p in params])
                    self._perturb(grouped, self._perturbation_norm(grouped))
                    self.base_optimizer.zero_grad(set_to_none=True)
                    with sync_context(no_sync), rng.restored():
                        source.run(index)
                    perturbed = [p for p in self._restore_weights() if p.grad is not None]
                    self._transform_second_grad(perturbed, self._clean)
                    _accumulate(descent, [(p, p.grad) for p in self._params() if p.grad is not None])
                    self.base_optimizer.zero_grad(set_to_none=True)
                    index += 1
        except BaseException:
            self._restore_weights()
            self._buffers.restore()
            raise
        self._buffers.restore()
        count = source.count()
        for p, grad in descent.items():
            p.grad = grad.div_(count)
        for grad in clean_sum.values():
            grad.div_(count)
        if world_size() > 1:
            all_reduce_mean([p.grad for p in descent])
            all_reduce_mean(list(clean_sum.values()))
        self._after_sam_step(list(descent), clean_sum)
        self._apply(lambda base: base.step())
        return losses

    def _check_chunk_sync(self, no_sync: NoSync) -> None:
        if world_size() > 1 and no_sync is None:
            raise ValueError('SAM m_sharpness under torch.distributed needs each worker\'s own gradient: pass '
                             'no_sync=ddp_model.no_sync to step() (train.py\'s task provides it)')

    def _chunked_replay_step(self, calls: List[TaskCall], scaling: LossScaling) -> None:
        task = self.recorder.task
        if task is None:
            raise RuntimeError('SAM.step(): the training task whose calls were recorded no longer exists')
        no_sync = no_sync_of(task)
        self._check_chunk_sync(no_sync)
        source = ReplayChunks(self.recorder, calls, self.m_sharpness)  # checks every batch first
        self._chunked_step(source, scaling, no_sync, fork_rng=True)

    def _one_local_chunk(self, calls: List[TaskCall]) -> bool:
        """One process, one micro-batch of exactly m_sharpness images: train.py's gradient is the chunk's own."""
        first = calls[0].args[0] if len(calls) == 1 and calls[0].args else None
        return (world_size() == 1 and isinstance(first, torch.Tensor) and first.dim() > 0
                and first.shape[0] == self.m_sharpness)


def _accumulate(total: Dict[torch.Tensor, torch.Tensor], items: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
    """total[p] += value (the first value of a key is copied)."""
    for p, value in items:
        if p in total:
            total[p].add_(value)
        else:
            total[p] = value.detach().clone()


def mean_loss(losses: List[Any]) -> Any:
    """The mean of the chunks' losses at w (what a closure step returns)."""
    values = [loss for loss in losses if loss is not None]
    if not values:
        return None
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack([v.detach().float() for v in values]).mean()
    return sum(float(v) for v in values) / len(values)
