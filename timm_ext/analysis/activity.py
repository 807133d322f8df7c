"""Fraction of active neurons per layer (SAM paper, Chen et al. 2022, Fig. 2 right and Sec. 4.4).

A neuron is active when its GELU/ReLU output is greater than zero (for GELU, where its derivative is
not small). Counted over every element of every activation module's output, images included; the
paper counts on 10 % of the ImageNet training set and finds SAM lowers the share in the first layers.
"""
from collections import OrderedDict
from typing import Any, Dict, Tuple, Type

import torch
import torch.nn as nn
from timm.layers.activations import GELU, GELUTanh, QuickGELU

from timm_ext.analysis._hooks import eval_mode, forward_batches, hooks

__all__ = ['ACTIVATIONS', 'active_neuron_fraction']

ACTIVATIONS: Tuple[Type[nn.Module], ...] = (nn.ReLU, nn.GELU, GELU, GELUTanh, QuickGELU)


def active_neuron_fraction(model: nn.Module, images: Any, threshold: float = 0.0) -> Dict[str, float]:
    """``{activation module name: share of its outputs > threshold}`` in forward order (a value in [0, 1])."""
    acts = [(name, m) for name, m in model.named_modules() if isinstance(m, ACTIVATIONS)]
    if not acts:
        raise ValueError(
            f'{type(model).__name__} has no GELU/ReLU module (nn.GELU, nn.ReLU or timm\'s GELU); '
            f'functional activations cannot be hooked')
    active: Dict[str, int] = {name: 0 for name, _ in acts}
    total: Dict[str, int] = {name: 0 for name, _ in acts}
    order = []

    def hook(name: str, out: torch.Tensor) -> None:
        if name not in order:
            order.append(name)
        active[name] += int((out > threshold).sum())
        total[name] += out.numel()

    with eval_mode(model), hooks() as handles:
        for name, m in acts:
            handles.append(m.register_forward_hook(lambda mod, args, out, n=name: hook(n, out)))
        forward_batches(model, images)
    return OrderedDict((name, active[name] / total[name]) for name in order)
