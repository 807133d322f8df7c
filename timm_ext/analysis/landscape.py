"""Filter-normalised loss landscapes in 1-D and 2-D (Li et al. 2018, "Visualizing the Loss Landscape of Neural Nets").

As the SAM paper (Chen et al. 2022, Fig. 1, App. E.1) and how-do-vits-work (Fig. 1a, C.4a) plot them:
``L(w + a d1 + b d2)`` on a grid, where each direction is Gaussian and rescaled filter by filter (each
slice along the output dimension 0) to the norm of the matching filter of ``w``. As in Li et al.'s
``ignore='biasbn'``, the directions are zero on parameters of one dimension or fewer (biases,
normalisation scales and shifts) and on names matching ``ignore`` (by default position embeddings and
relative-position tables, as how-do-vits-work's notebook). The weights are restored bit for bit.

``weight_decay`` adds ``weight_decay / 2 * ||w||^2`` (the l2-regularised NLL of how-do-vits-work; its
notebook used a sum of non-squared norms, which its issue #10 discusses).
"""
import re
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from timm_ext.analysis._hooks import LossFn, as_batches, eval_mode, mean_loss
from timm_ext.arg_types import positive_number

__all__ = ['DEFAULT_IGNORE', 'filter_normalized_direction', 'loss_landscape_1d', 'loss_landscape_2d']

DEFAULT_IGNORE = (r'pos_embed', r'relative_position')


def filter_normalized_direction(
        model: nn.Module,
        seed: int = 0,
        ignore: Sequence[str] = DEFAULT_IGNORE,
) -> List[torch.Tensor]:
    """A Gaussian direction shaped like ``model.parameters()``, each filter scaled to its weight's filter norm."""
    patterns = [re.compile(p) for p in ignore]
    generator = torch.Generator().manual_seed(seed)
    direction = []
    for name, p in model.named_parameters():
        d = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p)
        if p.ndim <= 1 or any(pat.search(name) for pat in patterns):
            d.zero_()
        else:
            w = p.detach().flatten(1)
            flat = d.flatten(1)
            flat.mul_(w.norm(dim=1, keepdim=True) / flat.norm(dim=1, keepdim=True).clamp_min(1e-12))
        direction.append(d)
    return direction


def _regularised_loss(model: nn.Module, loss_fn: LossFn, batches, weight_decay: float) -> float:
    loss = mean_loss(model, loss_fn, batches)
    if weight_decay:
        with torch.no_grad():
            loss += weight_decay / 2 * float(sum(p.double().pow(2).sum() for p in model.parameters()))
    return loss


def _grid(span: float, steps: int) -> torch.Tensor:
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise ValueError(f'steps must be an int >= 2, got {steps!r}')
    positive_number('span', span)
    grid = torch.linspace(-span, span, steps, dtype=torch.float64)
    grid[grid.abs() < 1e-12 * span] = 0.0  # the centre is exactly w
    return grid


def _evaluate(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        directions: Sequence[Sequence[torch.Tensor]],
        coords: Sequence[Sequence[float]],
        weight_decay: float,
        progress: Optional[Any],
) -> List[float]:
    """The loss at ``w + sum_i c_i d_i`` for each coordinate tuple; the weights are restored afterwards."""
    batches = as_batches(batches)
    params = list(model.parameters())
    for d in directions:
        if len(d) != len(params) or any(t.shape != p.shape for t, p in zip(d, params)):
            raise ValueError('a direction must have one tensor per model parameter, with its shape')
    saved = [p.detach().clone() for p in params]
    losses = []
    with eval_mode(model):
        try:
            for c in coords:
                with torch.no_grad():
                    for i, (p, w) in enumerate(zip(params, saved)):
                        p.copy_(w)
                        for coef, d in zip(c, directions):
                            if coef:
                                p.add_(d[i], alpha=float(coef))
                losses.append(_regularised_loss(model, loss_fn, batches, weight_decay))
                if progress is not None:
                    progress(1)
        finally:
            with torch.no_grad():
                for p, w in zip(params, saved):
                    p.copy_(w)
    return losses


def loss_landscape_1d(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        steps: int = 21,
        span: float = 1.0,
        direction: Optional[Sequence[torch.Tensor]] = None,
        seed: int = 0,
        weight_decay: float = 0.0,
        ignore: Sequence[str] = DEFAULT_IGNORE,
        progress: Optional[Any] = None,
) -> Dict[str, torch.Tensor]:
    """``L(w + a d)`` for ``steps`` values of ``a`` in ``[-span, span]``: ``{'alpha', 'loss'}``."""
    alphas = _grid(span, steps)
    d = direction if direction is not None else filter_normalized_direction(model, seed, ignore)
    losses = _evaluate(model, loss_fn, batches, [d], [(float(a),) for a in alphas], weight_decay, progress)
    return dict(alpha=alphas, loss=torch.tensor(losses, dtype=torch.float64))


def loss_landscape_2d(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        steps: int = 11,
        span: float = 1.0,
        directions: Optional[Sequence[Sequence[torch.Tensor]]] = None,
        seed: int = 0,
        weight_decay: float = 0.0,
        ignore: Sequence[str] = DEFAULT_IGNORE,
        progress: Optional[Any] = None,
) -> Dict[str, torch.Tensor]:
    """``L(w + a d1 + b d2)`` on a ``steps`` x ``steps`` grid: ``{'alpha', 'beta', 'loss'}``, loss[i, j] at a_i, b_j."""
    grid = _grid(span, steps)
    if directions is None:
        directions = [filter_normalized_direction(model, seed, ignore),
                      filter_normalized_direction(model, seed + 1, ignore)]
    if len(directions) != 2:
        raise ValueError(f'a 2-D landscape needs 2 directions, got {len(directions)}')
    coords = [(float(a), float(b)) for a in grid for b in grid]
    losses = _evaluate(model, loss_fn, batches, directions, coords, weight_decay, progress)
    return dict(alpha=grid, beta=grid.clone(), loss=torch.tensor(losses, dtype=torch.float64).view(steps, steps))
