""" VOLO-D1 with the Scaled-ReLU conv stem ablations (the paper's VOLO-d1 rows of Table 2)

Paper: 'Scaled ReLU Matters for Training Vision Transformers' (Wang et al., AAAI 2022),
https://arxiv.org/abs/2109.03810

timm's ``VOLO`` already uses the paper's conv stem (3Conv+3BN+3ReLU+1Proj, kernels (7, 3, 3, 4),
strides (2, 1, 1, 4), 64 channels). ``VOLOConvStem`` swaps it for a ``ConvStemPatchEmbed`` so any
stem row is one ``stem=`` name away; the full stem keeps VOLO's exact keys, so timm's
``volo_d1_224`` weights load into ``volo_d1_convstem`` unchanged.
"""
from functools import partial
from typing import Any, Dict, List, Optional

import torch
from timm.models import generate_default_cfgs, register_model
from timm.models.volo import VOLO

from timm_ext.layers.conv_stem import ConvStemPatchEmbed, resolve_stem
from timm_ext.models._builder import build_timm_ext_model
from timm_ext.models._cfgs import model_cfg
from timm_ext.models._head import head_like_model
from timm_ext.models._stem import reconcile_stem_keys, with_stem_first_conv

__all__ = ['VOLOConvStem']  # model_registry will add each entrypoint fn to this


class VOLOConvStem(VOLO):
    """ timm VOLO whose patch embedding is a ``ConvStemPatchEmbed`` of variant ``stem``.

    Args (besides VOLO's):
        stem: a ``timm_ext.layers.STEM_VARIANTS`` name; default the full stem (VOLO's own).
    """

    def __init__(
            self,
            layers: List[int],
            img_size: int = 224,
            in_chans: int = 3,
            patch_size: int = 8,
            stem_hidden_dim: int = 64,
            embed_dims: Optional[List[int]] = None,
            stem: str = 'conv',
            device=None,
            dtype=None,
            **kwargs,
    ) -> None:
        patch_embed = ConvStemPatchEmbed(  # built first: a bad stem or img_size fails before the network is built
            img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dims[0],
            output_fmt='NCHW', stem=stem, hidden_dim=stem_hidden_dim, device=device, dtype=dtype)
        super().__init__(
            layers, img_size=img_size, in_chans=in_chans, patch_size=patch_size, stem_hidden_dim=stem_hidden_dim,
            embed_dims=embed_dims, device=device, dtype=dtype, **kwargs)
        self.patch_embed = patch_embed

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        with head_like_model(self):  # timm < 1.0.29 reads them from the old head (none after reset_classifier(0))
            super().reset_classifier(num_classes, global_pool)


def checkpoint_filter_fn(
        state_dict: Dict[str, torch.Tensor],
        model: VOLOConvStem,
        strict: bool = True,
) -> Dict[str, torch.Tensor]:
    """Unwrap a training checkpoint; a patchify <-> conv stem mismatch keeps this model's stem (warned),
    any other stem mismatch raises unless ``strict=False`` (timm's ``pretrained_strict``)."""
    state_dict = state_dict.get('model', state_dict.get('state_dict', state_dict))
    return reconcile_stem_keys(state_dict, model, strict=strict)


def _create_volo_convstem(variant: str, pretrained: bool = False, **kwargs) -> VOLOConvStem:
    out_indices = kwargs.pop('out_indices', 3)
    kwargs['stem'] = resolve_stem(kwargs.get('stem') or 'conv')
    kwargs = with_stem_first_conv(kwargs, kwargs['stem'])
    return build_timm_ext_model(
        VOLOConvStem,
        variant,
        pretrained,
        pretrained_filter_fn=partial(checkpoint_filter_fn, strict=kwargs.get('pretrained_strict', True)),
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
        **kwargs,
    )


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return model_cfg('scaled-relu', 'patch_embed.conv.0', url, crop_pct=.96, classifier=('head', 'aux_head'),
                     **kwargs)


default_cfgs = generate_default_cfgs({
    'volo_d1_convstem': _cfg(),
})


@register_model
def volo_d1_convstem(pretrained: bool = False, **kwargs) -> VOLOConvStem:
    """ VOLO-D1 (224) with a selectable conv stem (``stem=``, default VOLO's own full stem), 26.6M params. """
    model_args = dict(layers=(4, 4, 8, 2), embed_dims=(192, 384, 384, 384), num_heads=(6, 12, 12, 12))
    return _create_volo_convstem('volo_d1_convstem', pretrained=pretrained, **dict(model_args, **kwargs))
