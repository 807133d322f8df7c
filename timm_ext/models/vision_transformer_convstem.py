""" Vision Transformer with the Scaled-ReLU conv stem (the paper's ViT_c / DeiT_c)

Paper: 'Scaled ReLU Matters for Training Vision Transformers' (Wang et al., AAAI 2022),
https://arxiv.org/abs/2109.03810

timm's ``VisionTransformer`` (DeiT-Ti/S/B shapes, patch 16, 224) whose patchify stem is replaced by
VOLO's conv stem, 3Conv+3BN+3ReLU+1Proj (``timm_ext.layers.ConvStemPatchEmbed``); all else is
unchanged, so every key but ``patch_embed.*`` is timm's. DeiT-S_c has 23,412,136 parameters
(the paper's "22M -> 23M"); the stem adds ~1.04 GMACs at 224 whatever the width.

``stem=`` picks any ablation row of the paper (``timm_ext.layers.STEM_VARIANTS``), e.g.
``timm.create_model('vit_small_convstem', stem='3conv_3relu_1proj')``; the CB ViTs take the same
kwarg. Fine-tuning from patchify ViT weights loads everything except the stem (reported in one
warning): ``pretrained=True, pretrained_cfg_overlay=dict(file='vit_small_patch16_224.safetensors')``.
A checkpoint of another conv-stem variant or width raises, naming both stems (timm's
``pretrained_strict=False`` opts in to keeping this model's stem).
"""
from typing import Any, Dict

from timm.models import generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer

from timm_ext.models._cfgs import model_cfg
from timm_ext.models._stem import create_stem_vit, vit_stem_checkpoint_filter_fn

__all__ = []  # model_registry will add each entrypoint fn to this; the model class is timm's VisionTransformer

checkpoint_filter_fn = vit_stem_checkpoint_filter_fn


def _create_vit_convstem(variant: str, pretrained: bool = False, **kwargs) -> VisionTransformer:
    return create_stem_vit(VisionTransformer, variant, pretrained, checkpoint_filter_fn, default_stem='conv',
                           **kwargs)


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return model_cfg('scaled-relu', 'patch_embed.conv.0', url, **kwargs)


default_cfgs = generate_default_cfgs({
    'vit_tiny_convstem': _cfg(),
    'vit_small_convstem': _cfg(),
    'vit_base_convstem': _cfg(),
})


@register_model
def vit_tiny_convstem(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ ViT-Ti/16 (DeiT-Ti) with the 3Conv+3BN+3ReLU+1Proj stem, 6.4M params. """
    model_args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return _create_vit_convstem('vit_tiny_convstem', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_small_convstem(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ ViT-S/16 (DeiT-S_c of the paper) with the 3Conv+3BN+3ReLU+1Proj stem, 23.4M params. """
    model_args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return _create_vit_convstem('vit_small_convstem', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_base_convstem(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ ViT-B/16 (DeiT-B) with the 3Conv+3BN+3ReLU+1Proj stem, 89.2M params. """
    model_args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return _create_vit_convstem('vit_base_convstem', pretrained=pretrained, **dict(model_args, **kwargs))
