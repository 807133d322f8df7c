""" Thin layer over timm's ``build_model_with_cfg`` shared by every timm-ext family.

It adds one rule timm leaves to a warning: ``pretrained=True`` on a model with no published
weights raises, instead of silently returning a randomly initialised model. And weights that fail
to load from an ``hf-hub:`` or ``local-dir:`` checkpoint (``timm.create_model('local-dir:DIR')``)
give the same one-line error as :func:`timm_ext.hub.load_model`, not timm's traceback.
"""
from typing import Any, Callable, Dict, Optional

import torch.nn as nn
from timm.models import build_model_with_cfg, resolve_pretrained_cfg

from timm_ext.load_errors import HubError, explain_load_error

__all__ = ['build_timm_ext_model']


def _check_weights_available(variant: str, kwargs: Dict[str, Any]) -> None:
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=kwargs.get('pretrained_cfg'), pretrained_cfg_overlay=overlay)
    if not (cfg.url or cfg.file or cfg.hf_hub_id or cfg.state_dict is not None):
        tag = f'.{cfg.tag}' if cfg.tag else ''
        raise RuntimeError(
            f'No pretrained weights are published for {variant}{tag} yet: create it with pretrained=False, or '
            f'load your own with pretrained_cfg_overlay=dict(file="path/to/weights.safetensors").')


def _hub_model_name(kwargs: Dict[str, Any]) -> Optional[str]:
    """``local-dir:DIR`` / ``hf-hub:ID`` when timm builds the model from such a checkpoint (its pretrained_cfg)."""
    cfg = kwargs.get('pretrained_cfg')
    get = cfg.get if isinstance(cfg, dict) else lambda key: getattr(cfg, key, None)
    if get('source') == 'local-dir' and get('file'):
        return f'local-dir:{get("file")}'
    if get('source') == 'hf-hub' and get('hf_hub_id'):
        return f'hf-hub:{get("hf_hub_id")}'
    return None


def build_timm_ext_model(model_cls: Callable[..., nn.Module], variant: str, pretrained: bool = False, **kwargs):
    """``build_model_with_cfg`` that refuses ``pretrained=True`` when no weights exist, and names a hub
    checkpoint that does not load in one line."""
    if pretrained:
        _check_weights_available(variant, kwargs)
    try:
        return build_model_with_cfg(model_cls, variant, pretrained, **kwargs)
    except Exception as e:
        name = _hub_model_name(kwargs) if pretrained else None
        if name is None:
            raise
        message = explain_load_error(name, kwargs.get('cache_dir'), e, pretrained)
        if message is None:
            raise
        raise HubError(message) from None
