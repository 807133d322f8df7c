""" MLP-Mixer with 8x8 patches: Mixer-S/8 and Mixer-B/8

Paper: 'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., ICLR 2022), https://arxiv.org/abs/2106.01548, Table 8: Mixer-S/8 (20M params, 784
tokens, token MLP 256, channel MLP 2048) and Mixer-B/8 (64M, token MLP 384, channel MLP 3072).

timm registers Mixer-S/32, S/16, B/32 and B/16 only, and its entrypoints fix ``patch_size``, so a
recipe cannot reach the 8x8 variants through ``model_kwargs``. What is ours: two entrypoints that
build timm's own ``MlpMixer`` with 8x8 patches (no published weights). The ViT-SAM recipes import
this module through ``device_modules``.
"""
from typing import Any, Dict, Set

import torch
from timm.models import generate_default_cfgs, register_model
from timm.models.mlp_mixer import MlpMixer, checkpoint_filter_fn

from timm_ext.models._builder import build_timm_ext_model

__all__ = []  # model_registry will add each entrypoint fn to this


class MlpMixerP8(MlpMixer):
    """timm's ``MlpMixer``, naming its weight-decay exemptions like every timm-ext model."""

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """None: a Mixer has no position embedding or class token (timm's factory still skips 1-d tensors)."""
        return set()


def _create_mixer(variant: str, pretrained: bool = False, **kwargs) -> MlpMixer:
    out_indices = kwargs.pop('out_indices', 3)
    return build_timm_ext_model(
        MlpMixerP8,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
        **kwargs,
    )


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return {
        'url': url,
        'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None,
        'crop_pct': 0.875, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': (0.5, 0.5, 0.5), 'std': (0.5, 0.5, 0.5),
        'first_conv': 'stem.proj', 'classifier': 'head',
        'license': 'apache-2.0', 'paper_ids': 'arXiv:2106.01548',
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    'mixer_s8_224': _cfg(),
    'mixer_b8_224': _cfg(),
})


@register_model
def mixer_s8_224(pretrained: bool = False, **kwargs) -> MlpMixer:
    """ Mixer-S/8 (ViT-SAM Table 8): timm's mixer_s16_224 with 8x8 patches. """
    model_args = dict(patch_size=8, num_blocks=8, embed_dim=512)
    return _create_mixer('mixer_s8_224', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def mixer_b8_224(pretrained: bool = False, **kwargs) -> MlpMixer:
    """ Mixer-B/8 (ViT-SAM Table 8): timm's mixer_b16_224 with 8x8 patches. """
    model_args = dict(patch_size=8, num_blocks=12, embed_dim=768)
    return _create_mixer('mixer_b8_224', pretrained=pretrained, **dict(model_args, **kwargs))
