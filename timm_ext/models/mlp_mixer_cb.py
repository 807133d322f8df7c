""" MLP-Mixer with Context Broadcasting

Paper: 'Scratching Visual Transformer's Back with Uniform Attention' (Hyeon-Woo et al., ICCV 2023),
https://arxiv.org/abs/2210.08457, Table 11: CB at the channel MLP of Mixer-S/16 (18.5M params).

timm's ``MlpMixer`` with CB at the end of the channel-mixing MLP (``mlp_channels``) of chosen
blocks; the token-mixing MLP is unchanged. What is ours: the paper does not say which Mixer blocks
get CB; ``mixer_s16_cb`` puts it in all 8 blocks; ``cb_layers=`` overrides.
"""
from typing import Dict, Optional, Set

import torch
from timm.models import generate_default_cfgs, register_model
from timm.models.mlp_mixer import MlpMixer
from timm.models.mlp_mixer import checkpoint_filter_fn as _mixer_checkpoint_filter_fn

from timm_ext.layers.context_broadcast import check_cb_init
from timm_ext.models._mixer import create_mixer, mixer_cfg, reset_mixer_classifier
from timm_ext.models.cb_retrofit import (
    CBLayers,
    add_context_broadcast,
    cb_scale_names,
    fill_missing_cb_scales,
    resolve_cb_layers,
)

__all__ = ['MlpMixerCB']  # model_registry will add each entrypoint fn to this


class MlpMixerCB(MlpMixer):
    """ timm MlpMixer with Context Broadcasting at the end of the channel MLP of ``cb_layers``. """

    def __init__(
            self,
            *args,
            cb_layers: CBLayers = 'all',
            cb_scaled: bool = False,
            cb_init: Optional[float] = None,
            **kwargs,
    ) -> None:
        check_cb_init(cb_init, cb_scaled)
        super().__init__(*args, **kwargs)
        self.cb_layers = resolve_cb_layers(cb_layers, len(self.blocks))
        add_context_broadcast(self, layers=self.cb_layers, scaled=cb_scaled, init_value=cb_init)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        reset_mixer_classifier(self, num_classes, global_pool)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """The CB_S scales (empty for plain CB): a Mixer has no position embedding or class token to exempt."""
        return cb_scale_names(self)


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: MlpMixer) -> Dict[str, torch.Tensor]:
    """timm's Mixer filter, then CB_S scales a base Mixer lacks."""
    return fill_missing_cb_scales(_mixer_checkpoint_filter_fn(state_dict, model), model)


def _create_mixer_cb(variant: str, pretrained: bool = False, **kwargs) -> MlpMixerCB:
    return create_mixer(MlpMixerCB, variant, pretrained, checkpoint_filter_fn, **kwargs)


default_cfgs = generate_default_cfgs({
    'mixer_s16_cb': mixer_cfg('context-broadcasting'),
})


@register_model
def mixer_s16_cb(pretrained: bool = False, **kwargs) -> MlpMixerCB:
    """ Mixer-S/16 (18.5M params) with CB at the channel MLP of every block. """
    model_args = dict(patch_size=16, num_blocks=8, embed_dim=512, cb_layers='all')
    return _create_mixer_cb('mixer_s16_cb', pretrained=pretrained, **dict(model_args, **kwargs))
