""" The ``stem=`` model kwarg shared by every timm-ext ViT creator, and stem-aware checkpoint loading.

``stem`` picks the patch embedding: ``'patch'`` / ``'1proj'`` is timm's patchify ``PatchEmbed``,
any other ``timm_ext.layers.STEM_VARIANTS`` name (e.g. ``'conv'``) a ``ConvStemPatchEmbed``.
``stem_hidden_dim`` sets the conv stem's width (64). Loading a checkpoint whose stem differs from
the model's (e.g. fine-tuning a conv-stem ViT from patchify ViT weights) keeps the model's own stem
weights and reports the skipped keys in one warning.
"""
import logging
from functools import partial
from typing import Any

import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import checkpoint_filter_fn as _vit_checkpoint_filter_fn
from torch import nn

from timm_ext.layers.conv_stem import STEM_VARIANTS, ConvStemPatchEmbed, resolve_stem

__all__ = [
    'apply_stem_kwargs', 'stem_first_conv', 'with_stem_first_conv', 'reconcile_stem_keys',
    'vit_stem_checkpoint_filter_fn',
]

_logger = logging.getLogger(__name__)
_STEM_PREFIX = 'patch_embed.'


def stem_first_conv(stem: str) -> str:
    """Module name of the first conv of ``stem`` (timm's ``first_conv``, adapted for ``in_chans != 3``)."""
    return 'patch_embed.conv.0' if STEM_VARIANTS[resolve_stem(stem)].convs else 'patch_embed.proj'


def with_stem_first_conv(kwargs: dict[str, Any], stem: str) -> dict[str, Any]:
    """Model kwargs whose ``pretrained_cfg_overlay`` points ``first_conv`` at ``stem``'s first conv."""
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    overlay.setdefault('first_conv', stem_first_conv(stem))  # an explicit user overlay wins
    kwargs['pretrained_cfg_overlay'] = overlay
    return kwargs


def apply_stem_kwargs(kwargs: dict[str, Any], default: str | None = None) -> dict[str, Any]:
    """Turn ``stem=`` / ``stem_hidden_dim=`` of a ViT entrypoint into ``embed_layer`` + ``first_conv``.

    ``default`` is the family's stem when ``stem`` is not given (None: leave the kwargs untouched).
    """
    kwargs = dict(kwargs)
    stem = kwargs.pop('stem', None)
    if stem is None and 'embed_layer' not in kwargs:  # a user's own embed_layer replaces the family default
        stem = default
    hidden_dim = kwargs.pop('stem_hidden_dim', None)
    if stem is None:
        if hidden_dim is not None:
            raise ValueError('stem_hidden_dim is only used by a conv stem; pass stem="conv" (or another variant) too.')
        return kwargs
    stem = resolve_stem(stem)
    if 'embed_layer' in kwargs:
        raise ValueError(f'Pass either stem={stem!r} or embed_layer=, not both.')
    if not STEM_VARIANTS[stem].convs and hidden_dim is not None:
        raise ValueError(f'stem_hidden_dim={hidden_dim} has no effect with stem={stem!r}, which has no hidden convs.')
    if stem != '1proj':
        kwargs['embed_layer'] = partial(ConvStemPatchEmbed, stem=stem, hidden_dim=hidden_dim or 64)
    else:
        kwargs['embed_layer'] = PatchEmbed  # the baseline is timm's own patchify stem
    return with_stem_first_conv(kwargs, stem)


def _fits(key: str, ckpt: torch.Tensor, mine: torch.Tensor, first_conv_weight: str) -> bool:
    if key == first_conv_weight and ckpt.ndim == mine.ndim == 4:  # in_chans is adapted after filtering
        return ckpt.shape[0] == mine.shape[0] and ckpt.shape[2:] == mine.shape[2:]
    return ckpt.shape == mine.shape


def reconcile_stem_keys(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Keep the model's own ``patch_embed.*`` tensors when the checkpoint's stem does not fit, and say so.

    Everything outside the stem is left to the strict load, so a mismatch there still fails loudly.
    """
    model_stem = {k: v for k, v in model.state_dict().items() if k.startswith(_STEM_PREFIX)}
    ckpt_stem = {k: v for k, v in state_dict.items() if k.startswith(_STEM_PREFIX)}
    first_conv_weight = stem_first_conv(getattr(model.patch_embed, 'stem', 'patch')) + '.weight'
    if set(ckpt_stem) == set(model_stem) and all(
            _fits(k, ckpt_stem[k], v, first_conv_weight) for k, v in model_stem.items()):
        return state_dict
    out = {k: v for k, v in state_dict.items() if not k.startswith(_STEM_PREFIX)}
    out.update(model_stem)
    kept_modules = sorted({k.rsplit('.', 1)[0] for k in model_stem})
    _logger.warning(
        f'Checkpoint stem does not fit this model\'s {type(model.patch_embed).__name__} '
        f'(stem={getattr(model.patch_embed, "stem", "patch")!r}): skipped checkpoint keys '
        f'[{", ".join(sorted(ckpt_stem))}] and kept the initial weights of [{", ".join(kept_modules)}]; '
        f'everything else was loaded. Fine-tune before relying on the model.')
    return out


def vit_stem_checkpoint_filter_fn(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """timm's ViT checkpoint filter, made safe for a stem that differs between checkpoint and model."""
    state_dict = dict(state_dict.get('model', state_dict.get('state_dict', state_dict)))
    proj = state_dict.get('patch_embed.proj.weight')
    skipped_proj = None
    if proj is not None and proj.ndim == 4 and proj.shape[1] != model.patch_embed.proj.weight.shape[1]:
        if 'patch_embed.conv.0.weight' in state_dict or isinstance(model.patch_embed, ConvStemPatchEmbed):
            # patchify <-> conv stem: keep timm's filter from resampling a kernel that cannot be used
            skipped_proj = state_dict.pop('patch_embed.proj.weight')
    state_dict = _vit_checkpoint_filter_fn(state_dict, model)
    if skipped_proj is not None:
        state_dict['patch_embed.proj.weight'] = skipped_proj  # put back so it is reported as skipped
    return reconcile_stem_keys(state_dict, model)
