""" Thin layer over timm's ``build_model_with_cfg`` shared by every timm-ext family.

It adds one rule timm leaves to a warning: ``pretrained=True`` on a model with no published
weights raises, instead of silently returning a randomly initialised model.
"""
from typing import Any, Callable, Dict

import torch.nn as nn
from timm.models import build_model_with_cfg, resolve_pretrained_cfg

__all__ = ['build_timm_ext_model']


def _check_weights_available(variant: str, kwargs: Dict[str, Any]) -> None:
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=kwargs.get('pretrained_cfg'), pretrained_cfg_overlay=overlay)
    if not (cfg.url or cfg.file or cfg.hf_hub_id or cfg.state_dict is not None):
        tag = f'.{cfg.tag}' if cfg.tag else ''
        raise RuntimeError(
            f'No pretrained weights are published for {variant}{tag} yet: create it with pretrained=False, or '
            f'load your own with pretrained_cfg_overlay=dict(file="path/to/weights.safetensors").')


def build_timm_ext_model(model_cls: Callable[..., nn.Module], variant: str, pretrained: bool = False, **kwargs):
    """``build_model_with_cfg`` that refuses ``pretrained=True`` when no weights exist."""
    if pretrained:
        _check_weights_available(variant, kwargs)
    return build_model_with_cfg(model_cls, variant, pretrained, **kwargs)
