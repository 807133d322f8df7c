""" The ``stem=`` model kwarg shared by every timm-ext ViT creator, and stem-aware checkpoint loading.

``stem`` picks the patch embedding: ``'patch'`` / ``'1proj'`` is timm's patchify ``PatchEmbed``,
any other ``timm_ext.layers.STEM_VARIANTS`` name (e.g. ``'conv'``) a ``ConvStemPatchEmbed``.
``stem_hidden_dim`` sets the conv stem's width (64).

Loading a checkpoint is lenient in one case only, the one it exists for: a patchify checkpoint into
a conv-stem model or the reverse (fine-tuning a ViT_c from timm ViT weights). The model then keeps
its own stem weights and one warning lists the skipped keys. A checkpoint of another conv-stem
variant or width (or another patchify variant) raises one error naming both stems, unless the
user opts in with timm's ``pretrained_strict=False``.
"""
import logging
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Type

import torch
import torch.nn as nn
from timm.layers import PatchEmbed
from timm.models.vision_transformer import checkpoint_filter_fn as _vit_checkpoint_filter_fn

from timm_ext.layers.conv_stem import STEM_VARIANTS, ConvStemPatchEmbed, resolve_stem
from timm_ext.models._builder import build_timm_ext_model

__all__ = [
    'apply_stem_kwargs', 'stem_first_conv', 'with_stem_first_conv', 'reconcile_stem_keys',
    'vit_stem_checkpoint_filter_fn',
]

_logger = logging.getLogger(__name__)
_STEM_PREFIX = 'patch_embed.'
_CONV_PREFIX = 'patch_embed.conv.'


def stem_first_conv(stem: str) -> str:
    """Module name of the first conv of ``stem`` (timm's ``first_conv``, adapted for ``in_chans != 3``)."""
    return 'patch_embed.conv.0' if STEM_VARIANTS[resolve_stem(stem)].convs else 'patch_embed.proj'


def with_stem_first_conv(kwargs: Dict[str, Any], stem: str) -> Dict[str, Any]:
    """Model kwargs whose ``pretrained_cfg_overlay`` points ``first_conv`` at ``stem``'s first conv."""
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    overlay.setdefault('first_conv', stem_first_conv(stem))  # an explicit user overlay wins
    kwargs['pretrained_cfg_overlay'] = overlay
    return kwargs


def apply_stem_kwargs(kwargs: Dict[str, Any], default: Optional[str] = None) -> Dict[str, Any]:
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


def _model_stem_name(model: nn.Module) -> str:
    embed = model.patch_embed
    if isinstance(embed, ConvStemPatchEmbed):
        if STEM_VARIANTS[embed.stem].convs:
            return f'stem={embed.stem!r}, stem_hidden_dim={embed.hidden_dim}'
        return f'stem={embed.stem!r}'
    return f"stem='patch' ({type(embed).__name__})"


def _matching_variants(ckpt_stem: Dict[str, torch.Tensor], model: nn.Module) -> List[str]:
    """The stem variants (at the model's patch size) whose keys and shapes are those of ``ckpt_stem``."""
    proj = ckpt_stem.get('patch_embed.proj.weight')
    if proj is None or proj.ndim != 4:
        return []
    conv0 = ckpt_stem.get('patch_embed.conv.0.weight')
    hidden_dim = conv0.shape[0] if conv0 is not None else 64
    first = 'patch_embed.conv.0.weight' if conv0 is not None else 'patch_embed.proj.weight'
    names = []
    for name, variant in STEM_VARIANTS.items():
        if variant.convs != (conv0 is not None):
            continue
        try:
            candidate = ConvStemPatchEmbed(
                img_size=None, patch_size=model.patch_embed.patch_size, embed_dim=proj.shape[0], stem=name,
                hidden_dim=hidden_dim, bias='patch_embed.proj.bias' in ckpt_stem, device='meta')
        except ValueError:  # a variant that cannot be built at this patch size
            continue
        keys = {_STEM_PREFIX + k: v for k, v in candidate.state_dict().items()}
        ckpt = {k: v for k, v in ckpt_stem.items() if not k.startswith('patch_embed.norm.')}
        if set(keys) == set(ckpt) and all(_fits(k, ckpt[k], v, first) for k, v in keys.items()):
            names.append(repr(name))
    return names


def _checkpoint_stem_name(ckpt_stem: Dict[str, torch.Tensor], model: nn.Module) -> str:
    names = _matching_variants(ckpt_stem, model)
    conv0 = ckpt_stem.get('patch_embed.conv.0.weight')
    if not names:
        return f'an unknown stem with keys [{", ".join(sorted(ckpt_stem))}]'
    if conv0 is None:
        return f'stem={" or ".join(names)}'
    return f'stem={" or ".join(names)}, stem_hidden_dim={conv0.shape[0]}'


def _first_mismatch(ckpt_stem: Dict[str, torch.Tensor], model_stem: Dict[str, torch.Tensor], first: str) -> str:
    for k in sorted(set(ckpt_stem) | set(model_stem)):
        if k not in model_stem:
            return f'{k} is not in this model'
        if k not in ckpt_stem:
            return f'{k} is not in the checkpoint'
        if not _fits(k, ckpt_stem[k], model_stem[k], first):
            return f'{k} is {tuple(ckpt_stem[k].shape)} in the checkpoint, {tuple(model_stem[k].shape)} here'
    return ''


def reconcile_stem_keys(
        state_dict: Dict[str, torch.Tensor],
        model: nn.Module,
        strict: bool = True,
) -> Dict[str, torch.Tensor]:
    """Check the checkpoint's ``patch_embed.*`` against the model's stem.

    Same stem: unchanged. Patchify checkpoint into a conv-stem model or the reverse: keep the model's
    own stem tensors and warn. Any other mismatch: a RuntimeError naming both stems, or with
    ``strict=False`` (timm's ``pretrained_strict=False``) the same keep-and-warn. Everything outside
    the stem is left to the load itself, so a mismatch there still fails loudly.
    """
    model_stem = {k: v for k, v in model.state_dict().items() if k.startswith(_STEM_PREFIX)}
    ckpt_stem = {k: v for k, v in state_dict.items() if k.startswith(_STEM_PREFIX)}
    first_conv_weight = stem_first_conv(getattr(model.patch_embed, 'stem', 'patch')) + '.weight'
    if not ckpt_stem or (set(ckpt_stem) == set(model_stem) and all(
            _fits(k, ckpt_stem[k], v, first_conv_weight) for k, v in model_stem.items())):
        return state_dict
    ckpt_is_conv = any(k.startswith(_CONV_PREFIX) for k in ckpt_stem)
    model_is_conv = any(k.startswith(_CONV_PREFIX) for k in model_stem)
    if strict and ckpt_is_conv == model_is_conv:
        raise RuntimeError(
            f'The checkpoint stem ({_checkpoint_stem_name(ckpt_stem, model)}) does not fit this model\'s '
            f'({_model_stem_name(model)}): {_first_mismatch(ckpt_stem, model_stem, first_conv_weight)}. '
            f'Create the model with the checkpoint\'s stem, or pass pretrained_strict=False to load everything '
            f'else and keep this model\'s initial stem.')
    out = {k: v for k, v in state_dict.items() if not k.startswith(_STEM_PREFIX)}
    out.update(model_stem)
    kept_modules = sorted({k.rsplit('.', 1)[0] for k in model_stem})
    _logger.warning(
        f'Checkpoint stem does not fit this model\'s {type(model.patch_embed).__name__} '
        f'({_model_stem_name(model)}): skipped checkpoint keys '
        f'[{", ".join(sorted(ckpt_stem))}] and kept the initial weights of [{", ".join(kept_modules)}]; '
        f'everything else was loaded. Fine-tune before relying on the model.')
    return out


def vit_stem_checkpoint_filter_fn(
        state_dict: Dict[str, torch.Tensor],
        model: nn.Module,
        strict: bool = True,
) -> Dict[str, torch.Tensor]:
    """timm's ViT checkpoint filter, made safe for a stem that differs between checkpoint and model."""
    state_dict = dict(state_dict.get('model', state_dict.get('state_dict', state_dict)))
    proj = state_dict.get('patch_embed.proj.weight')
    skipped_proj = None
    if proj is not None and proj.ndim == 4 and proj.shape[1] != model.patch_embed.proj.weight.shape[1]:
        if 'patch_embed.conv.0.weight' in state_dict or isinstance(model.patch_embed, ConvStemPatchEmbed):
            # a conv stem on either side: keep timm's filter from resampling a kernel that cannot be used
            skipped_proj = state_dict.pop('patch_embed.proj.weight')
    state_dict = _vit_checkpoint_filter_fn(state_dict, model)
    if skipped_proj is not None:
        state_dict['patch_embed.proj.weight'] = skipped_proj  # put back so it is checked and reported
    return reconcile_stem_keys(state_dict, model, strict=strict)


def create_stem_vit(cls: Type[nn.Module], variant: str, pretrained: bool, filter_fn: Callable,
                    default_stem: Optional[str] = None, **kwargs: Any) -> nn.Module:
    """A ViT-family model whose entrypoint takes ``stem=`` (:func:`apply_stem_kwargs`, ``default_stem`` when not
    given), with ``filter_fn(strict=pretrained_strict)`` for pretrained weights and timm's ViT feature getter."""
    out_indices = kwargs.pop('out_indices', 3)
    kwargs = apply_stem_kwargs(kwargs, default=default_stem)
    return build_timm_ext_model(
        cls,
        variant,
        pretrained,
        pretrained_filter_fn=partial(filter_fn, strict=kwargs.get('pretrained_strict', True)),
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
        **kwargs,
    )
