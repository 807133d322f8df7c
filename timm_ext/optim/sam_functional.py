"""SAM's update as functions over lists of tensors, as torch's ``sgd()`` is to ``SGD``: no state of their own.

    e = rho * g / ||g||                   SAM: one global L2 norm over every parameter
    e = rho * T^2 g / ||T g||             ASAM: T = |w| + eta, per parameter group
    w <- w + e, and back to w bit-exactly
    the model's buffers (BatchNorm statistics) copied after the first pass, and put back after the second

Each works on the tensors it is handed: the parameters' own, or under FSDP2 each rank's local shards, with the norm
over every rank's (one all-reduce, ``sharded.global_norm``), so the same call serves one process, DDP and sharded
training. The SAM class (``sam.py``) keeps the buffers
these write into, so a step allocates nothing after the first.
"""
import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from timm.models import model_parameters
from timm.utils import dispatch_clip_grad

__all__ = ['Groups', 'HAS_GET_TOTAL_NORM', 'centralize_gradients_', 'clip_gradient_', 'cuda_devices_of',
           'hold_buffers_', 'keep_', 'restore_buffers_', 'sam_perturb_', 'sam_restore_', 'total_norm']

Store = Dict[torch.Tensor, torch.Tensor]
# (param group, its parameters that have a gradient, their weights, their gradients)
Groups = List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]]
HAS_GET_TOTAL_NORM = hasattr(torch.nn.utils, 'get_total_norm')  # torch >= 2.6 (a test takes the older route)


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
def sam_perturb_(groups: Groups, backups: Store, clean: Optional[Store] = None,
                 norm: Optional[Callable[[List[torch.Tensor]], Any]] = None) -> float:
    """Back every parameter up into ``backups`` and move it to w + e, with each group's ``rho``, ``adaptive`` and
    ``eta``; ``clean`` (if given) gets a copy of g first. ``groups``: (param group, its parameters that have a
    gradient, their weights, their gradients), the weights and gradients being the parameters' own tensors, or a
    rank's shards under FSDP2; ``norm``: the L2 norm of a tensor list as one vector (``total_norm`` if not given;
    over every rank's shards under FSDP2, ``sharded.global_norm``). Returns ||g||
    (ASAM: ||T g||); a zero or non-finite norm moves nothing. The gradients are turned into T g / T^2 g on the way
    (ASAM); the caller replaces them next."""
    params = [p for _, ps, _, _ in groups for p in ps]
    grads = [g for _, _, _, gs in groups for g in gs]
    if clean is not None:
        keep_(clean, params, grads)
    for group, ps, weights, gs in groups:
        if group['adaptive']:  # T = |w| + eta, held in the backups (w goes there next); g <- T g for the norm
            scale_t = keep_(backups, ps, weights)
            torch._foreach_abs_(scale_t)
            torch._foreach_add_(scale_t, float(group['eta']))
            torch._foreach_mul_(gs, scale_t)
    grad_norm = float(norm(grads) if norm is not None else total_norm(grads))
    for group, ps, weights, gs in groups:
        if group['adaptive']:  # ... and T^2 g for the move: e = rho T^2 g / ||T g||
            torch._foreach_mul_(gs, keep_(backups, ps, None, weights))
        keep_(backups, ps, weights)
        if math.isfinite(grad_norm) and grad_norm > 0 and group['rho'] > 0:
            torch._foreach_add_(weights, gs, alpha=group['rho'] / grad_norm)
    return grad_norm


@torch.no_grad()
def centralize_gradients_(grads: Sequence[torch.Tensor]) -> None:
    """Gradient centralization (Yong et al., ECCV 2020), in place: each gradient of 2 or more dimensions (linear and
    conv weights) has its mean over all but the first dimension removed, output channel by output channel; biases
    and norm scales (1-D) are left as they are. GC-SAM's ascent direction (``SAM(use_gc=True)``). Under FSDP2 give
    each rank's shards: FSDP2 splits rows (Shard(0)), so every row a rank holds is whole."""
    for g in grads:
        if g.dim() > 1:
            g.sub_(g.mean(dim=tuple(range(1, g.dim())), keepdim=True))


@torch.no_grad()
def sam_restore_(weights: Sequence[torch.Tensor], params: Sequence[torch.Tensor], backups: Store) -> None:
    """Every parameter's weights (``params``' own tensors, or their shards) back to the value ``sam_perturb_``
    backed up, bit-exactly."""
    if params:
        torch._foreach_copy_(list(weights), [backups[p] for p in params])


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


def total_norm(tensors: List[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of ``tensors`` as one vector: ``torch.nn.utils.get_total_norm`` (torch >= 2.6), or on torch 2.4
    and 2.5 the same sum, one ``_foreach_norm`` and the norm of the per-tensor norms on the first one's device."""
    if HAS_GET_TOTAL_NORM:
        return torch.nn.utils.get_total_norm(tensors, foreach=True)
    if not tensors:
        return torch.tensor(0.)
    norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))


def cuda_devices_of(tensors: Iterable[torch.Tensor]) -> List[int]:
    """Indices of the CUDA devices that hold ``tensors`` (the generators a pass on them may draw from)."""
    return sorted({t.device.index or 0 for t in tensors if t.device.type == 'cuda'})
