"""SAM's update as functions over lists of tensors, as torch's ``sgd()`` is to ``SGD``: no state of their own.

    e = rho * g / ||g||                   SAM: one global L2 norm over every parameter
    e = rho * T^2 g / ||T g||             ASAM: T = |w| + eta, per parameter group
    w <- w + e, and back to w bit-exactly
    the model's buffers (BatchNorm statistics) copied after the first pass, and put back after the second

Each works on a rank's local shards under FSDP2 (``sharded.local``); the norm is the global one (one all-reduce),
so the same call serves one process, DDP and sharded training. The SAM class (``sam.py``) keeps the buffers
these write into, so a step allocates nothing after the first.
"""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from timm.models import model_parameters
from timm.utils import dispatch_clip_grad

from timm_ext.optim.sharded import global_norm, local

__all__ = ['Groups', 'clip_gradient_', 'hold_buffers_', 'keep_', 'restore_buffers_', 'sam_perturb_', 'sam_restore_']

Store = Dict[torch.Tensor, torch.Tensor]
Groups = List[Tuple[Dict[str, Any], List[torch.Tensor]]]  # (param group, its parameters that have a gradient)


def keep_(store: Store, params: Sequence[torch.Tensor], values: Optional[Sequence[torch.Tensor]] = None,
          shapes: Optional[Sequence[torch.Tensor]] = None) -> List[torch.Tensor]:
    """One persistent buffer per parameter in ``store``, shaped like ``values`` (or ``shapes``), filled with
    ``values`` if given; allocated the first time only."""
    out = []
    for i, p in enumerate(params):
        like = values[i] if values is not None else shapes[i]
        buf = store.get(p)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype or buf.device != like.device:
            store[p] = buf = torch.empty_like(like, memory_format=torch.preserve_format)
        out.append(buf)
    if values is not None and out:
        torch._foreach_copy_(out, list(values))
    return out


@torch.no_grad()
def sam_perturb_(groups: Groups, backups: Store, clean: Optional[Store] = None) -> float:
    """Back every parameter up into ``backups`` and move it to w + e, with each group's ``rho``, ``adaptive`` and
    ``eta``; ``clean`` (if given) gets a copy of g first. Returns ||g|| (ASAM: ||T g||); a zero or non-finite norm
    moves nothing. The gradients are turned into T g / T^2 g on the way (ASAM); the caller replaces them next."""
    grads = [[local(p.grad) for p in params] for _, params in groups]
    if clean is not None:
        keep_(clean, [p for _, ps in groups for p in ps], [g for gs in grads for g in gs])
    for (group, params), gs in zip(groups, grads):
        if group['adaptive']:  # T = |w| + eta, held in the backups (w goes there next); g <- T g for the norm
            scale_t = keep_(backups, params, [local(p) for p in params])
            torch._foreach_abs_(scale_t)
            torch._foreach_add_(scale_t, float(group['eta']))
            torch._foreach_mul_(gs, scale_t)
    norm = global_norm([g for gs in grads for g in gs], [p for _, ps in groups for p in ps])
    for (group, params), gs in zip(groups, grads):
        shards = [local(p) for p in params]
        if group['adaptive']:  # ... and T^2 g for the move: e = rho T^2 g / ||T g||
            torch._foreach_mul_(gs, keep_(backups, params, None, shards))
        keep_(backups, params, shards)
        if math.isfinite(norm) and norm > 0 and group['rho'] > 0:
            torch._foreach_add_(shards, gs, alpha=group['rho'] / norm)
    return norm


@torch.no_grad()
def sam_restore_(params: Sequence[torch.Tensor], backups: Store) -> None:
    """Every parameter back to the value ``sam_perturb_`` backed up, bit-exactly."""
    if params:
        torch._foreach_copy_([local(p) for p in params], [backups[p] for p in params])


def hold_buffers_(module: Optional[nn.Module], copies: Store) -> List[torch.Tensor]:
    """Copy every buffer of ``module`` (BatchNorm's running statistics and ``num_batches_tracked``, any other) into
    ``copies``, so the second pass cannot move them; returns the buffers, for ``restore_buffers_``. Copies of buffers
    the module no longer has are dropped."""
    buffers = [] if module is None else list(module.buffers())
    if len(copies) != len(buffers) or any(b not in copies for b in buffers):
        copies.clear()
    keep_(copies, buffers, buffers)
    return buffers


def restore_buffers_(buffers: Sequence[torch.Tensor], copies: Store) -> None:
    """The buffers ``hold_buffers_`` copied back to those values, bit-exactly (into the same tensors)."""
    if buffers:
        torch._foreach_copy_(list(buffers), [copies[b] for b in buffers])


@torch.no_grad()
def clip_gradient_(params: List[torch.Tensor], clip_grad: float, clip_mode: str,
                   module: Optional[nn.Module] = None) -> None:
    """timm's clipping of the gradient about to be applied; AGC leaves ``module``'s classifier head out, as
    train.py does (nothing left out without a module)."""
    if clip_mode == 'agc' and module is not None:
        keep = {id(p) for p in model_parameters(module, exclude_head=True)}
        params = [p for p in params if id(p) in keep]
    dispatch_clip_grad(params, clip_grad, mode=clip_mode)
