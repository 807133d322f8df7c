"""SAM over parameters sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``): each rank holds a shard of every
parameter and of its gradient, as a ``DTensor`` sharded on dim 0.

SAM works on each rank's local shards (``to_local()``, no gather): perturb, restore and ASAM's ``|w| + eta`` are
elementwise, so each rank moves its own shard, and the extra memory is one copy of the rank's shard. What spans
the shards is a sum: the gradient norm ``||g||`` (GSAM's and LookSAM's dot products too) is each rank's sum of
squares, all-reduced once. Parameters left unsharded (replicated on every rank) are counted once.
"""
import math
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from timm_ext.optim.sam_functional import total_norm

try:  # torch >= 2.5
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # pragma: no cover - torch 2.4 (the floor) keeps them private
    from torch.distributed._tensor import DTensor, Shard

__all__ = ['global_dot', 'global_norm', 'is_sharded', 'like_param', 'local', 'refuse_flat_parameters',
           'refuse_sharded_chunks', 'zero_gradient']


def is_sharded(t: torch.Tensor) -> bool:
    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``t`` (a view: writing to it writes the parameter), or ``t`` itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def like_param(shard: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``shard`` (this rank's part) as a tensor laid out like ``param``: a DTensor when the parameter is one, so
    that state kept per parameter is saved and loaded shard by shard (``torch.distributed.checkpoint``)."""
    if not is_sharded(param):
        return shard
    return DTensor.from_local(shard, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())


def _shard_group(tensors: Sequence[torch.Tensor]) -> Optional['dist.ProcessGroup']:
    """The process group the sharded ones are split over (one mesh dimension, ``Shard`` placements), else None."""
    sharded = [t for t in tensors if is_sharded(t)]
    if not sharded:
        return None
    mesh = sharded[0].device_mesh
    for t in sharded:
        if t.device_mesh != mesh or mesh.ndim != 1 or not all(isinstance(p, Shard) for p in t.placements):
            raise ValueError(f'SAM supports parameters sharded by fully_shard over one mesh dimension, got a DTensor '
                             f'with placements {t.placements} on a {t.device_mesh.ndim}-D mesh: shard the model with '
                             f'fully_shard (FSDP2) alone')
    return mesh.get_group()


def _all_ranks(local_sum: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    group = _shard_group(params)
    if group is not None:
        dist.all_reduce(local_sum, group=group)
    return local_sum


def global_norm(tensors: List[torch.Tensor], params: Sequence[torch.Tensor]) -> float:
    """The L2 norm of ``tensors`` (one per parameter of ``params``: the parameter's gradient, or a tensor shaped
    like its local shard) as one vector over every rank's shards: one all-reduce when ``params`` are sharded."""
    if not any(isinstance(p, DTensor) for p in params):
        return float(total_norm(tensors))
    sharded = [local(t) for t, p in zip(tensors, params) if is_sharded(p)]
    plain = [local(t) for t, p in zip(tensors, params) if not is_sharded(p)]
    squares = _all_ranks(total_norm(sharded).float() ** 2, params)
    if plain:  # replicated on every rank: counted once
        squares = squares + total_norm(plain).float().to(squares.device) ** 2
    return math.sqrt(float(squares))


def global_dot(xs: List[torch.Tensor], ys: List[torch.Tensor], params: Sequence[torch.Tensor]) -> float:
    """sum_i <xs_i, ys_i> over every rank's shards (one all-reduce when ``params`` are sharded)."""
    if not xs:
        return 0.0
    device = local(xs[0]).device

    def dots(pairs):
        if not pairs:
            return torch.zeros((), device=device)
        return torch.stack([torch.vdot(local(x).reshape(-1), local(y).reshape(-1)).to(device) for x, y in pairs]).sum()

    sharded = [(x, y) for x, y, p in zip(xs, ys, params) if is_sharded(p)]
    plain = [(x, y) for x, y, p in zip(xs, ys, params) if not is_sharded(p)]
    total = dots(plain).float()
    if sharded:
        total = total + _all_ranks(dots(sharded).float(), params)
    return float(total)


def refuse_sharded_chunks(m_sharpness: int, params: Sequence[torch.Tensor]) -> None:
    """m-sharpness perturbs each worker with its own gradient; sharded workers hold one copy of the weights."""
    if any(is_sharded(p) for p in params) and dist.is_initialized() and dist.get_world_size() > 1:
        raise ValueError(f'SAM m_sharpness={m_sharpness} under FSDP2 (fully_shard) needs each worker to perturb with '
                         f'its own gradient, but the workers share one sharded copy of the weights: train m-sharpness '
                         f'with DDP, or leave m_sharpness unset')


def refuse_flat_parameters(params: Sequence[torch.Tensor]) -> None:
    """FSDP1 (``FullyShardedDataParallel``) flattens and partitions the parameters behind SAM's back: no rank
    holds a shard SAM could take the global norm of, so refuse them in one line."""
    for p in params:
        if type(p).__name__ == 'FlatParameter' or getattr(p, '_fsdp_flattened', False):
            raise ValueError('SAM cannot perturb FSDP1 (FullyShardedDataParallel) flat parameters: each rank holds '
                             'a slice of a flattened buffer, not a shard SAM can take the global norm of; shard the '
                             'model with torch.distributed.fsdp.fully_shard (FSDP2), or use DDP')


def zero_gradient(params: List[torch.Tensor]) -> bool:
    """Every parameter has a gradient and all of them are zero (over every rank's shards)."""
    return bool(params) and all(p.grad is not None for p in params) and global_norm(
        [p.grad for p in params], params) == 0
