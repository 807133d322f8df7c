"""A new classifier on the model's device and dtype, in its training mode, on every timm release.

timm 1.0.31's model contract (its tests/test_models.py): ``reset_classifier`` builds the new head on the device and
dtype of the model's parameters and in the model's training mode, so ``model.to(torch.float64)`` then
``reset_classifier(5)`` still runs. timm 1.0.23 ... 1.0.28 build it on torch's defaults (ResNet, ViT, Swin), or read
them from the old head, which ``reset_classifier(0)`` has made an ``nn.Identity`` (PiT, VOLO; the Mixer then raises);
timm 1.0.29 takes them from the model. ``ClassifierHead.reset`` (AlterNet's head) takes them from the head itself,
also in 1.0.31: torch's defaults after ``reset_classifier(0)``. Every model class of timm-ext resets its classifier
through here.
"""
from contextlib import contextmanager
from typing import Any, Dict, Iterator

import torch.nn as nn

__all__ = ['device_dtype_of', 'head_like_model']


def device_dtype_of(model: nn.Module) -> Dict[str, Any]:
    """``device=`` and ``dtype=`` of the model's first parameter (both None for a model without parameters)."""
    param = next(model.parameters(), None)
    return {'device': None if param is None else param.device, 'dtype': None if param is None else param.dtype}


@contextmanager
def head_like_model(model: nn.Module) -> Iterator[None]:
    """The modules the block adds to ``model`` (its new head) are moved to the device and dtype the model's
    parameters had before it, and set to the model's training mode."""
    dd = device_dtype_of(model)
    before = set(model.modules())  # the modules themselves: a new one cannot reuse a dropped one's id
    yield
    for module in model.modules():
        if module not in before:
            if dd['device'] is not None:
                module.to(**dd)
            module.train(model.training)
