"""Fourier analysis and variance of feature maps per block (how-do-vits-work, Park & Kim 2022, Fig. 2, 8 and 9).

* Delta log amplitude: ``log(|fft2(x)| + 1e-6)`` averaged over images and channels, read along the
  half diagonal of the frequency plane from 0 to pi, minus its value at 0 (App. A.2; the official
  notebook). ``Delta[-1]`` (at pi, for an even map side) is Fig. 8's high-frequency amplitude: MSAs
  lower it, Convs/MLPs raise it. The notebook reads the shifted diagonal, which stops one bin short of
  pi; here the half diagonal is ``(k, k)`` for ``k = 0 .. side // 2`` of the unshifted spectrum, pi included.
* Feature-map variance: the variance over spatial positions of each image and channel, averaged
  (``x.var(dim=(-2, -1)).mean()``, the official notebook): MSAs lower it, Convs raise it (Fig. 9).

ViT tokens are laid out as their square patch grid, prefix (class) tokens dropped. The reading points
are :func:`timm_ext.analysis._hooks.feature_points` (stem, then MSA and MLP of each ViT block, or every
block of a staged model) unless ``modules`` names others.
"""
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from timm_ext.analysis._hooks import capture, eval_mode, forward_batches, hooks, select_points, to_map

__all__ = [
    'delta_log_amplitude', 'feature_map_variance', 'feature_variance_per_block', 'fourier_per_block',
    'normalized_frequencies',
]


def delta_log_amplitude(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Delta log amplitude of a (B, C, H, W) map along the half diagonal, (min(H, W) // 2 + 1,), 0 at 0 frequency."""
    if x.ndim != 4:
        raise ValueError(f'expected a (B, C, H, W) feature map, got shape {tuple(x.shape)}')
    f = torch.log(torch.fft.fft2(x.float()).abs() + eps).mean(dim=(0, 1))
    k = torch.arange(min(x.shape[-2], x.shape[-1]) // 2 + 1, device=x.device)
    diag = f[k, k]
    return diag - diag[0]


def normalized_frequencies(side: int) -> torch.Tensor:
    """The frequencies of :func:`delta_log_amplitude`'s entries for a map of ``side``, in units of pi."""
    return torch.arange(side // 2 + 1, dtype=torch.float32) * 2.0 / side


def feature_map_variance(x: torch.Tensor) -> torch.Tensor:
    """Spatial variance of each image and channel of a (B, C, H, W) map, averaged over both: a scalar."""
    if x.ndim != 4:
        raise ValueError(f'expected a (B, C, H, W) feature map, got shape {tuple(x.shape)}')
    return x.float().var(dim=(-2, -1)).mean()


def _per_block(model: nn.Module, images: Any, modules: Optional[Sequence[str]], fn) -> Dict[str, Any]:
    points = select_points(model, modules)
    values: Dict[str, List[Any]] = {name: [] for name in points}

    def record(name: str, x: torch.Tensor) -> None:
        values[name].append((fn(to_map(x, points[name].prefix)), x.shape[0]))

    with eval_mode(model), hooks() as handles:
        capture(points, record, handles)
        forward_batches(model, images)
    out = OrderedDict()
    for name, parts in values.items():
        total = sum(n for _, n in parts)
        out[name] = sum(v * (n / total) for v, n in parts)
    return out


def fourier_per_block(
        model: nn.Module, images: Any, modules: Optional[Sequence[str]] = None,
) -> Dict[str, torch.Tensor]:
    """``{point: Delta log amplitude}`` per reading point (Fig. 2a curves; ``[-1]`` is Fig. 8), image-weighted."""
    return _per_block(model, images, modules, lambda m: delta_log_amplitude(m).cpu())


def feature_variance_per_block(
        model: nn.Module, images: Any, modules: Optional[Sequence[str]] = None,
) -> Dict[str, float]:
    """``{point: feature-map variance}`` per reading point (Fig. 9), image-weighted over batches."""
    return OrderedDict((k, float(v)) for k, v in _per_block(
        model, images, modules, lambda m: feature_map_variance(m)).items())
