"""Layer-wise cosine similarity between tokens (scaled-ReLU conv-stem paper, Wang et al. 2022, Eq. 5 and Fig. 1).

``CosSim(B) = 1 / (n (n - 1)) sum_{i != j} B_i B_j^T / (||B_i|| ||B_j||)`` over the n patch tokens of
one image, averaged over images. Read, as in Fig. 1, after the stem (patch embedding or conv stem), after
the position embedding, and after every block; prefix (class) tokens are left out. Lower is more diverse.
"""
from collections import OrderedDict
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn as nn

from timm_ext.analysis._hooks import (
    Point,
    capture,
    eval_mode,
    forward_batches,
    hooks,
    num_prefix_tokens,
    select_points,
)

__all__ = ['cosine_similarity_tokens', 'token_cosine_similarity', 'token_points']


def cosine_similarity_tokens(x: torch.Tensor) -> torch.Tensor:
    """Eq. 5 for each item of a (B, n, C) batch of tokens: the mean cosine of the n (n - 1) distinct pairs, (B,)."""
    if x.ndim != 3 or x.shape[1] < 2:
        raise ValueError(f'expected (B, n, C) tokens with n >= 2, got shape {tuple(x.shape)}')
    n = x.shape[1]
    u = torch.nn.functional.normalize(x.float(), dim=-1)
    s = u.sum(dim=1)  # sum_i sum_j u_i.u_j = ||sum_i u_i||^2, then the diagonal (each ||u_i||^2 = 1) is removed
    total = (s * s).sum(-1) - (u * u).sum(dim=(1, 2))
    return total / (n * (n - 1))


def token_points(model: nn.Module) -> 'OrderedDict[str, Point]':
    """Fig. 1's reading points of a timm ViT: ``patch_embed``, ``pos_embed`` (after it) and ``blocks.i``."""
    named = dict(model.named_modules())
    blocks = getattr(model, 'blocks', None)
    if 'patch_embed' not in named or not isinstance(blocks, nn.Sequential):
        raise ValueError(f'{type(model).__name__} is not a timm ViT (patch_embed + blocks): pass modules=')
    prefix = num_prefix_tokens(model)
    points = OrderedDict(patch_embed=Point(named['patch_embed'], 'post', 'stem', 0))
    if len(blocks):  # the first block's input is the embedded tokens after position embedding (and norm_pre)
        points['pos_embed'] = Point(blocks[0], 'pre', 'embed', prefix)
    for i, block in enumerate(blocks):
        points[f'blocks.{i}'] = Point(block, 'post', 'block', prefix)
    return points


def token_cosine_similarity(
        model: nn.Module,
        images: Any,
        modules: Optional[Sequence[str]] = None,
) -> Dict[str, float]:
    """Mean pairwise cosine similarity of patch tokens per layer, ``{point: value}`` in forward order.

    ``modules`` names other (B, N, C) outputs to read instead of :func:`token_points`.
    """
    points = token_points(model) if modules is None else select_points(model, modules)
    sums: Dict[str, float] = {name: 0.0 for name in points}
    counts: Dict[str, int] = {name: 0 for name in points}

    def fn(name: str, x: torch.Tensor) -> None:
        if x.ndim == 4:  # a (B, C, H, W) map: its H * W positions are the tokens
            x = x.flatten(2).transpose(1, 2)
        sim = cosine_similarity_tokens(x[:, points[name].prefix:])
        sums[name] += float(sim.sum())
        counts[name] += sim.shape[0]

    with eval_mode(model), hooks() as handles:
        capture(points, fn, handles)
        forward_batches(model, images)
    return OrderedDict((name, sums[name] / counts[name]) for name in points)
