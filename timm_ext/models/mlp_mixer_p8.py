""" MLP-Mixer with 8x8 patches: Mixer-S/8 and Mixer-B/8

Paper: 'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., ICLR 2022), https://arxiv.org/abs/2106.01548, Table 8: Mixer-S/8 (20M params, 784
tokens, token MLP 256, channel MLP 2048) and Mixer-B/8 (64M, token MLP 384, channel MLP 3072).

timm registers Mixer-S/32, S/16, B/32 and B/16 only, and its entrypoints fix ``patch_size``, so a
recipe cannot reach the 8x8 variants through ``model_kwargs``. What is ours: two entrypoints that
build timm's own ``MlpMixer`` with 8x8 patches (no published weights), registered by ``import timm_ext``
like every timm-ext model.
"""
from typing import Optional, Set

import torch
from timm.models import generate_default_cfgs, register_model
from timm.models.mlp_mixer import MlpMixer, checkpoint_filter_fn

from timm_ext.models._mixer import create_mixer, mixer_cfg, reset_mixer_classifier

__all__ = []  # model_registry will add each entrypoint fn to this


class MlpMixerP8(MlpMixer):
    """timm's ``MlpMixer``, naming its weight-decay exemptions like every timm-ext model."""

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        reset_mixer_classifier(self, num_classes, global_pool)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """None: a Mixer has no position embedding or class token (timm's factory still skips 1-d tensors)."""
        return set()


def _create_mixer(variant: str, pretrained: bool = False, **kwargs) -> MlpMixer:
    return create_mixer(MlpMixerP8, variant, pretrained, checkpoint_filter_fn, **kwargs)


default_cfgs = generate_default_cfgs({
    'mixer_s8_224': mixer_cfg('vit-sam'),
    'mixer_b8_224': mixer_cfg('vit-sam'),
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
