"""Attention entropy and mean attention distance per layer and head (CB paper, Hyeon-Woo et al. 2023, Fig. 4 and 7).

The attention probabilities are recomputed from the input of each timm ``Attention`` module by a forward
hook (its own ``qkv``, ``q_norm``/``k_norm`` and ``scale``), so the model runs its normal path: fused SDPA
included, which never materialises the map. Only statistics are accumulated, never the (B, heads, N, N) maps.

* entropy of a query's attention row, ``H_i = -sum_j a_ij log a_ij`` in nats (the bound is ``log N``,
  about 5.28 for the 197 tokens of a 224 px ViT-S/16);
* distance, ``sum_{j != i} a_ij ||p_i - p_j||_1 / sum_{j != i} a_ij`` over patch queries and patch keys,
  with token coordinates ``p`` normalised by the grid side (a neighbour is 1/side away, opposite corners 2 apart).
  It excludes the self-interaction, as the paper does, and prefix (class) tokens, which have no position.
"""
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
from timm.layers import Attention

from timm_ext.analysis._hooks import eval_mode, forward_batches, hooks, num_prefix_tokens

__all__ = [
    'attention_distance', 'attention_entropy', 'attention_modules', 'attention_probs', 'attention_stats',
    'entropy_per_query', 'grid_distances', 'head_distances',
]

_QUERIES = ('all', 'cls', 'patches')


def attention_modules(model: nn.Module) -> List[nn.Module]:
    """The model's timm ``Attention`` modules (subclasses included) in forward order."""
    mods = [m for m in model.modules() if isinstance(m, Attention)]
    if not mods:
        raise ValueError(
            f'{type(model).__name__} has no timm.layers.Attention module: attention statistics need a ViT-style '
            f'model (vit_*, deit_*, vit_*_cb, vit_*_convstem, ...)')
    return mods


def attention_probs(module: Attention, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The (B, heads, N, N) attention probabilities ``module`` computes for its input ``x`` (B, N, C)."""
    from timm.layers.attention import maybe_add_mask

    B, N, _ = x.shape
    qkv = module.qkv(x).reshape(B, N, 3, module.num_heads, module.head_dim).permute(2, 0, 3, 1, 4)
    q, k, _ = qkv.unbind(0)
    q, k = module.q_norm(q), module.k_norm(k)
    logits = (q * module.scale) @ k.transpose(-2, -1)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=logits.dtype).masked_fill(~attn_mask, float('-inf'))
        logits = maybe_add_mask(logits, attn_mask)
    return logits.float().softmax(dim=-1)


def entropy_per_query(attn: torch.Tensor) -> torch.Tensor:
    """``-sum_j a_ij log a_ij`` (nats) of each row of ``attn`` (..., N_q, N_k), with ``0 log 0 = 0``."""
    return torch.special.entr(attn).sum(dim=-1)


def grid_distances(side: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """(side**2, side**2) L1 distances between the row-major cells of a side x side grid, normalised by ``side``."""
    idx = torch.arange(side, device=device, dtype=torch.float32)
    rows, cols = torch.meshgrid(idx, idx, indexing='ij')
    p = torch.stack([rows.flatten(), cols.flatten()], dim=-1) / side
    return torch.cdist(p, p, p=1)


def head_distances(attn: torch.Tensor, prefix: int) -> torch.Tensor:
    """Mean distance of each head (B, heads) over patch queries; self and prefix tokens excluded."""
    a = attn[..., prefix:, prefix:]
    n = a.shape[-1]
    side = int(round(n ** 0.5))
    if side * side != n:
        raise ValueError(f'attention distance needs a square patch grid, got {n} patch tokens (prefix {prefix})')
    dist = grid_distances(side, device=a.device)
    others = a * (1.0 - torch.eye(n, device=a.device, dtype=a.dtype))
    per_query = (others * dist).sum(-1) / others.sum(-1).clamp_min(torch.finfo(a.dtype).tiny)
    return per_query.mean(-1)


def attention_stats(
        model: nn.Module,
        images: Any,
        queries: str = 'all',
        percentile: float = 15.0,
) -> Dict[str, torch.Tensor]:
    """Per-layer, per-head attention statistics of ``model`` on ``images`` (a tensor or an iterable of batches).

    Args:
        queries: whose rows to average the entropy over: 'all' tokens, the 'cls' (first) token as in the
            CB paper's Fig. 7a, or the 'patches'.
        percentile: the low percentile of the per-query entropies reported with the mean (Fig. 4 uses 15).

    Returns:
        ``entropy`` [layers, heads] (nats, mean over queries and images), ``entropy_percentile`` [layers]
        (over heads, queries and images), ``distance`` [layers, heads] (see the module docstring),
        ``max_entropy`` [layers] (``log N``).
    """
    if queries not in _QUERIES:
        raise ValueError(f'queries must be one of {", ".join(_QUERIES)}, got {queries!r}')
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f'percentile must be in [0, 100], got {percentile!r}')
    modules = attention_modules(model)
    prefix = num_prefix_tokens(model)
    if queries == 'cls' and prefix < 1:
        raise ValueError(f"queries='cls' needs a class token, and {type(model).__name__} has no prefix tokens")
    sums: List[Any] = [0.0] * len(modules)
    dists: List[Any] = [0.0] * len(modules)
    rows: List[List[torch.Tensor]] = [[] for _ in modules]
    tokens = [0] * len(modules)
    queries_seen = [0] * len(modules)
    images_seen = [0] * len(modules)

    def hook(idx: int, module: Attention, args: tuple, kwargs: dict, out: Any) -> None:
        x = args[0] if args else kwargs['x']
        attn = attention_probs(module, x, kwargs.get('attn_mask', args[1] if len(args) > 1 else None))
        ent = entropy_per_query(attn)  # (B, heads, N)
        ent = ent[..., :1] if queries == 'cls' else ent[..., prefix:] if queries == 'patches' else ent
        sums[idx] = sums[idx] + ent.sum(dim=(0, 2))
        dists[idx] = dists[idx] + head_distances(attn, prefix).sum(0)
        rows[idx].append(ent.flatten().cpu())
        tokens[idx] = attn.shape[-1]
        queries_seen[idx] += ent.shape[0] * ent.shape[2]
        images_seen[idx] += ent.shape[0]

    with eval_mode(model), hooks() as handles:
        for i, m in enumerate(modules):
            handles.append(m.register_forward_hook(
                lambda mod, args, kwargs, out, i=i: hook(i, mod, args, kwargs, out), with_kwargs=True))
        forward_batches(model, images)
    return dict(
        entropy=torch.stack([s / n for s, n in zip(sums, queries_seen)]).cpu(),
        entropy_percentile=torch.stack([torch.quantile(torch.cat(r), percentile / 100.0) for r in rows]),
        distance=torch.stack([d / n for d, n in zip(dists, images_seen)]).cpu(),
        max_entropy=torch.log(torch.tensor(tokens, dtype=torch.float32)),
    )


def attention_entropy(model: nn.Module, images: Any, queries: str = 'all') -> torch.Tensor:
    """Entropy (nats) of the attention rows, [layers, heads], averaged over queries and images (CB Fig. 4/7a)."""
    return attention_stats(model, images, queries=queries)['entropy']


def attention_distance(model: nn.Module, images: Any) -> torch.Tensor:
    """Mean attention distance between patch tokens, [layers, heads], self excluded (CB paper Fig. 7b)."""
    return attention_stats(model, images)['distance']
