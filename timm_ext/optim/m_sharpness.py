"""m-sharpness: SAM's perturbation computed per chunk of ``m`` images, as the SAM papers ran it.

Foret et al. (2021, Sec. 4.1 and App. C.3) and Chen et al. (2022, App. H) compute the ascent
direction on each accelerator from its own few images (the JAX code perturbs per replica and
all-reduces only the second gradient); the ViT-SAM models used 32 images per TPU core. With
``m_sharpness=M`` the batch of each worker is cut into chunks of M images, and for each chunk

    g_i = grad L_i(w),   e_i = rho * g_i / ||g_i||,   h_i = grad L_i(w + e_i)

and the descent gradient is the mean of the ``h_i`` (then averaged over the workers once). SAM enters this
module only when ``m_sharpness`` is set: ``chunked_update`` is that loop over any ``ChunkPasses`` (a closure's here,
``chunked_closure_step``; timm's training task's in ``replay_passes``), with what they share: how a batch is cut
(``BatchChunk`` for a closure, ``slice_batch`` for train.py's recorded calls), the checks, and the sum of the
chunks' gradients.
"""
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, Iterable, List, Optional, Protocol, Tuple

import torch

from timm_ext.optim.ddp import NoSync, all_reduce_mean, sync_context, world_size
from timm_ext.optim.sam_functional import cuda_devices_of
from timm_ext.optim.sharded import refuse_sharded_chunks

if TYPE_CHECKING:
    from timm_ext.optim.left_gradients import LeftGradients
    from timm_ext.optim.loss_scaling import LossScaling

__all__ = ['BatchChunk', 'ChunkPasses', 'ChunkedSAM', 'ClosureChunks', 'GradientSum', 'check_chunk_sync',
           'chunk_count', 'chunked_closure_step', 'chunked_update', 'mean_loss', 'refuse_loss_scaling', 'slice_batch']


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


class ChunkedSAM(Protocol):
    """What the chunks' update uses of the SAM it drives (``sam.SAM``, which imports this module)."""
    base_optimizer: torch.optim.Optimizer
    param_groups: List[Dict[str, Any]]
    settings: Any
    model: Optional[torch.nn.Module]
    left: 'LeftGradients'
    sam_step_due: bool

    def hold_buffers(self) -> None: ...
    def release_buffers(self) -> None: ...
    def ascend(self, scaling: Optional['LossScaling'] = None) -> None: ...
    def descend(self, scaling: Optional['LossScaling'] = None) -> bool: ...
    def params_with_grad(self) -> List[torch.Tensor]: ...
    def clean_gradients(self) -> Dict[torch.Tensor, torch.Tensor]: ...
    def cancel_step(self) -> None: ...
    def plain_step(self, scaling: Optional['LossScaling'] = None) -> None: ...
    def apply_descent(self, descend: bool, scaling: Optional['LossScaling'],
                      clean: Dict[torch.Tensor, torch.Tensor], zero_grad: bool = False) -> None: ...


class ChunkPasses(Protocol):
    """The two passes of each chunk of one update."""

    def context(self) -> ContextManager:
        """Around all the passes of the update."""

    def count(self) -> int:
        """How many chunks (known after the first pass of the first one)."""

    def first(self, index: int) -> Any:
        """The gradient at w of chunk ``index``; returns its loss."""

    def second(self, index: int) -> None:
        """The gradient at w + e of chunk ``index``, drawing the random numbers its first pass drew."""


def chunked_update(sam: 'ChunkedSAM', passes: ChunkPasses, scaling: Optional['LossScaling']) -> List[Any]:
    """One SAM update per chunk: the chunk's gradient at w, up to w + e, its gradient there, back to w; then the
    chunks' mean second-pass gradient (over the workers too) is applied. The buffers are held from before the first
    chunk's first pass; weights and buffers are back at w whatever fails in between. Returns the chunks' losses."""
    params = [p for group in sam.param_groups for p in group['params']]
    refuse_sharded_chunks(sam.settings.m_sharpness, params)
    refuse_loss_scaling(scaling is not None)
    descent, clean = GradientSum(), GradientSum()
    losses = []
    with passes.context():
        try:
            sam.hold_buffers()
            index = 0
            while index == 0 or index < passes.count():
                sam.base_optimizer.zero_grad()  # each chunk's own gradient (the whole batch's is not used)
                losses.append(passes.first(index))
                sam.ascend()
                sam.base_optimizer.zero_grad()
                passes.second(index)
                descend = sam.descend()
                descent.add(sam.params_with_grad())
                clean.add_values(sam.clean_gradients())
                index += 1
        except BaseException:
            sam.cancel_step()
            raise
    sam.release_buffers()
    descent.write_mean_to_grads()  # the mean over the chunks, then over the workers (one all-reduce each)
    clean_grads = clean.mean()
    if world_size() > 1:
        all_reduce_mean([p.grad for p in sam.params_with_grad()])
        all_reduce_mean(list(clean_grads.values()))
    sam.apply_descent(descend, None, clean_grads)
    return losses


class ClosureChunks:
    """``step(closure)``'s chunks: the closure cuts its batch with the ``BatchChunk`` it is handed; each chunk's
    first pass runs in a fork of the generators, so that its second draws the same masks; both run in ``no_sync``.
    After the first chunk's first pass, the closure must have zeroed the gradients the last step left."""

    def __init__(self, closure: Callable[..., Any], size: Optional[int], no_sync: NoSync,
                 params: List[torch.Tensor], left: 'LeftGradients') -> None:
        self.closure = closure
        self.chunk = BatchChunk(size)
        self.no_sync = no_sync
        self.params = params
        self.left = left
        self.devices = cuda_devices_of(params)

    def _call(self) -> Any:
        with torch.enable_grad():
            return self.closure(self.chunk)

    def whole_batch(self) -> Any:
        """A plain ``interval`` step's one pass: ``chunk(x, y)`` returns the batch unchanged."""
        self.chunk = BatchChunk(None)
        loss = self._call()
        self.left.check_closure_zeroed(self.params)
        return loss

    def context(self) -> ContextManager:
        check_chunk_sync(self.no_sync)
        return nullcontext()

    def count(self) -> int:
        return self.chunk.count

    def first(self, index: int) -> Any:
        self.chunk.index = index
        with torch.random.fork_rng(devices=self.devices), sync_context(self.no_sync):
            loss = self._call()
        if index == 0:
            self.left.check_closure_zeroed(self.params)
        return loss

    def second(self, index: int) -> None:
        with sync_context(self.no_sync):
            self._call()


def chunked_closure_step(sam: 'ChunkedSAM', closure: Callable[..., Any], scaling: Optional['LossScaling'],
                         no_sync: NoSync) -> Any:
    """``SAM.step(closure)`` with ``m_sharpness``: the chunks' SAM update (the mean of their losses at w returned),
    or on a plain ``interval`` step one pass over the whole batch."""
    params = [p for group in sam.param_groups for p in group['params']]
    passes = ClosureChunks(closure, sam.settings.m_sharpness, no_sync, params, sam.left)
    if sam.sam_step_due:
        loss = mean_loss(chunked_update(sam, passes, scaling))
    else:
        loss = passes.whole_batch()
        sam.plain_step(scaling)
    sam.left.record(params)
    return loss
