"""A forward pre-hook that displaces an optimizer's weights at the first training forward after its step.

Momentum-SAM (w - rho v / ||v||) and bSAM (w + eps) take their gradient at weights displaced from w. Given the model,
the displacement waits for the forward that takes that gradient, so between steps (evaluation, checkpoints, timm's
model EMA) the weights are w. The hook holds the optimizer weakly (the model does not keep it alive) and acts only
for the optimizer's own model: a deep copy of the model (timm's ModelEma) carries the hook but is left alone.
"""
import weakref
from typing import Any, Callable, Protocol

import torch
import torch.nn as nn

__all__ = ['Displacing', 'displace_on_training_forward']


class Displacing(Protocol):
    model: Any
    _due: bool  # a step was taken since the last displacement

    def displace(self) -> Any: ...


def displace_on_training_forward(optimizer: Displacing) -> Callable[[nn.Module, Any], None]:
    """The hook for ``model.register_forward_pre_hook``: a forward of ``optimizer.model`` in training mode with
    gradients enabled, after a step, calls ``optimizer.displace()``."""
    ref = weakref.ref(optimizer)

    @torch.compiler.disable  # Python-side state: run eagerly, before the (compiled) forward
    def displace_before_forward(module: nn.Module, args: Any) -> None:
        opt = ref()
        if opt is not None and opt._due and opt.model is module and module.training and torch.is_grad_enabled():
            opt.displace()
    return displace_before_forward
