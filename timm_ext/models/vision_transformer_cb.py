""" Vision Transformer with Context Broadcasting (CB / CB_S)

Paper: 'Scratching Visual Transformer's Back with Uniform Attention' (Hyeon-Woo et al., ICCV 2023),
https://arxiv.org/abs/2210.08457

timm's ``VisionTransformer`` (DeiT-Ti/S/B shapes, patch 16, 224) with CB at the end of the MLP
branch of chosen blocks (paper Fig. 6 / Table 4b "End"). Plain CB adds no parameters, so the
state_dict keys are exactly timm's and timm ViT/DeiT weights load unchanged.

What is ours: the CB layer choice. The paper's best setting puts CB in the "upper layers" without
listing them; ``vit_*_cb`` use the second half of the blocks (6..11 of 12), ``vit_*_cb_all`` every
block (the paper's CB-dagger) and ``vit_*_cbs`` CB_S in every block. ``cb_layers=`` overrides.
"""
from typing import Any, Dict, Optional, Set

import torch
from timm.models import generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer

from timm_ext.layers.context_broadcast import check_cb_init
from timm_ext.models._cfgs import model_cfg
from timm_ext.models._head import head_like_model
from timm_ext.models._stem import create_stem_vit, vit_stem_checkpoint_filter_fn
from timm_ext.models.cb_retrofit import (
    CBLayers,
    add_context_broadcast,
    cb_scale_names,
    fill_missing_cb_scales,
    resolve_cb_layers,
)

__all__ = ['VisionTransformerCB']  # model_registry will add each entrypoint fn to this


class VisionTransformerCB(VisionTransformer):
    """ timm VisionTransformer with Context Broadcasting at the end of the MLP of ``cb_layers``.

    Args (besides VisionTransformer's):
        cb_layers: 'all', 'upper' (second half of the blocks) or a list of block indices.
        cb_scaled: CB_S (learnable per-channel Lambda) instead of CB.
        cb_init: initial Lambda of CB_S (default 1.0, see ``timm_ext.layers.ContextBroadcast``); CB_S only.
        cb_patch_mean: average only the patch tokens (the class/register tokens still receive it).
    """

    def __init__(
            self,
            *args,
            cb_layers: CBLayers = 'all',
            cb_scaled: bool = False,
            cb_init: Optional[float] = None,
            cb_patch_mean: bool = False,
            **kwargs,
    ) -> None:
        check_cb_init(cb_init, cb_scaled)
        super().__init__(*args, **kwargs)
        self.cb_layers = resolve_cb_layers(cb_layers, len(self.blocks))
        add_context_broadcast(
            self, layers=self.cb_layers, scaled=cb_scaled, init_value=cb_init, patch_mean=cb_patch_mean)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        with head_like_model(self):  # timm < 1.0.29 builds the new head on torch's defaults
            super().reset_classifier(num_classes, global_pool)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """timm's ViT set plus the CB_S scales (1-D, so timm's factory already skips them; named for clarity)."""
        return super().no_weight_decay() | cb_scale_names(self)


def checkpoint_filter_fn(
        state_dict: Dict[str, torch.Tensor],
        model: VisionTransformer,
        strict: bool = True,
) -> Dict[str, torch.Tensor]:
    """timm's ViT filter (foreign layouts, resampling, stem mismatch), then CB_S scales a base ViT lacks."""
    state_dict = vit_stem_checkpoint_filter_fn(state_dict, model, strict=strict)
    return fill_missing_cb_scales(state_dict, model)


def _create_vision_transformer_cb(variant: str, pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    # stem='conv' etc. swaps in a conv stem (default: timm's patchify stem)
    return create_stem_vit(VisionTransformerCB, variant, pretrained, checkpoint_filter_fn, **kwargs)


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return model_cfg('context-broadcasting', 'patch_embed.proj', url, **kwargs)


default_cfgs = generate_default_cfgs({
    'vit_tiny_cb': _cfg(),
    'vit_small_cb': _cfg(),
    'vit_base_cb': _cfg(),
    'vit_tiny_cb_all': _cfg(),
    'vit_small_cb_all': _cfg(),
    'vit_base_cb_all': _cfg(),
    'vit_tiny_cbs': _cfg(),
    'vit_small_cbs': _cfg(),
    'vit_base_cbs': _cfg(),
})

_TINY = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
_SMALL = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
_BASE = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
_CB_UPPER = dict(cb_layers='upper')
_CB_ALL = dict(cb_layers='all')
_CBS_ALL = dict(cb_layers='all', cb_scaled=True)


@register_model
def vit_tiny_cb(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-Ti/16 (DeiT-Ti) with CB in the upper half of the blocks (6..11), 5.7M params. """
    model_args = dict(**_TINY, **_CB_UPPER)
    return _create_vision_transformer_cb('vit_tiny_cb', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_small_cb(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-S/16 (DeiT-S) with CB in the upper half of the blocks (6..11), 22.1M params. """
    model_args = dict(**_SMALL, **_CB_UPPER)
    return _create_vision_transformer_cb('vit_small_cb', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_base_cb(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-B/16 (DeiT-B) with CB in the upper half of the blocks (6..11), 86.6M params. """
    model_args = dict(**_BASE, **_CB_UPPER)
    return _create_vision_transformer_cb('vit_base_cb', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_tiny_cb_all(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-Ti/16 with CB in every block (the paper's CB-dagger). """
    model_args = dict(**_TINY, **_CB_ALL)
    return _create_vision_transformer_cb('vit_tiny_cb_all', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_small_cb_all(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-S/16 with CB in every block (the paper's CB-dagger). """
    model_args = dict(**_SMALL, **_CB_ALL)
    return _create_vision_transformer_cb('vit_small_cb_all', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_base_cb_all(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-B/16 with CB in every block (the paper's CB-dagger). """
    model_args = dict(**_BASE, **_CB_ALL)
    return _create_vision_transformer_cb('vit_base_cb_all', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_tiny_cbs(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-Ti/16 with CB_S (learnable per-channel Lambda) in every block, +12 x 192 params. """
    model_args = dict(**_TINY, **_CBS_ALL)
    return _create_vision_transformer_cb('vit_tiny_cbs', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_small_cbs(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-S/16 with CB_S in every block, +12 x 384 = 4,608 params (the paper's +0.02%). """
    model_args = dict(**_SMALL, **_CBS_ALL)
    return _create_vision_transformer_cb('vit_small_cbs', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_base_cbs(pretrained: bool = False, **kwargs) -> VisionTransformerCB:
    """ ViT-B/16 with CB_S in every block, +12 x 768 params. """
    model_args = dict(**_BASE, **_CBS_ALL)
    return _create_vision_transformer_cb('vit_base_cbs', pretrained=pretrained, **dict(model_args, **kwargs))
