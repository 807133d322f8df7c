""" The CIFAR-100 baselines of 'How Do Vision Transformers Work?' (Park & Kim, ICLR 2022) with their released weights

The official repository (xxxnell/how-do-vits-work) released CIFAR-100 checkpoints of four baselines
(GitHub release ``xxxnell/how-do-vits-work-storage`` v0.1). Three of them are timm models built with
CIFAR arguments (the official README builds them from timm's classes); the fourth is the repository's own
post-activation ResNet-50 with a CIFAR stem, which is timm's ResNet-50 except for the stem:

* ``vit_tiny_patch2_32``: timm ``VisionTransformer`` (img 32, patch 2, dim 192, depth 12, 3 heads, no qkv bias);
* ``pit_ti_patch2_32``: timm ``PoolingVisionTransformer`` (img 32, patch 2, stride 1, dims 32 x (2, 4, 8), depths
  2, 6, 4);
* ``swin_tiny_patch1_window4_32``: timm ``SwinTransformer`` (img 32, patch 1, window 4, dim 96, depths 2, 2, 6, 2,
  no qkv bias);
* ``resnet50_cifar``: timm ``ResNet`` (Bottleneck, 3-4-6-3) with a 3x3 stride-1 stem conv and no max-pool.

Each has the tag ``hdvw_cifar100`` whose ``url`` is the release asset. The checkpoints were saved by the
official code as ``{'state_dict': ...}`` in the layout of timm 0.4/0.5 (PiT pools and Swin patch merging at
the end of a stage, Swin's head as ``head``) and of the official ResNet (``layer0``, ``conv1.0``, ``shortcut``,
``classifier.0.dense``); ``checkpoint_filter_fn``-s below convert them. The weights' licence is not stated
by their authors (the code is Apache-2.0), and the authors report no test accuracy for them.
"""
import re
from functools import partial
from typing import Any, Dict, Optional, Set

import torch
import torch.nn as nn
from timm.models import generate_default_cfgs, register_model
from timm.models.pit import PoolingVisionTransformer
from timm.models.pit import checkpoint_filter_fn as _pit_checkpoint_filter_fn
from timm.models.resnet import Bottleneck, ResNet
from timm.models.swin_transformer import SwinTransformer
from timm.models.swin_transformer import checkpoint_filter_fn as _swin_checkpoint_filter_fn
from timm.models.vision_transformer import VisionTransformer

from timm_ext.models._builder import build_timm_ext_model
from timm_ext.models._cfgs import model_cfg
from timm_ext.models._head import head_like_model
from timm_ext.models._stem import apply_stem_kwargs, vit_stem_checkpoint_filter_fn

__all__ = ['CifarStemResNet']

_RELEASE = 'https://github.com/xxxnell/how-do-vits-work-storage/releases/download/v0.1/'
_CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)  # configs/cifar100_*.yaml of the official code
_CIFAR100_STD = (0.2675, 0.2565, 0.2761)


class CifarStemResNet(ResNet):
    """timm's ResNet with a CIFAR stem (3x3 stride-1 conv + BN + ReLU, no max-pool): 32 px images keep their
    resolution through the stem, so the stages run at 32, 16, 8 and 4 px."""

    def __init__(self, *args: Any, in_chans: int = 3, device=None, dtype=None, **kwargs: Any) -> None:
        super().__init__(*args, in_chans=in_chans, device=device, dtype=dtype, **kwargs)
        stem_chs = self.bn1.num_features
        self.conv1 = nn.Conv2d(in_chans, stem_chs, 3, stride=1, padding=1, bias=False, device=device, dtype=dtype)
        self.maxpool = nn.Identity()
        # timm's stages believe the stem reduced by 4; here it reduces by 1
        self.feature_info = [dict(self.feature_info[0], reduction=1)] + [
            dict(info, reduction=info['reduction'] // 4) for info in self.feature_info[1:]]
        nn.init.kaiming_normal_(self.conv1.weight, mode='fan_out', nonlinearity='relu')  # as timm's ResNet

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new classifier; ``global_pool=None`` keeps the current pooling (timm < 1.0.31's ResNet resets it to
        'avg'), on the model's device and dtype (timm < 1.0.29 builds it on torch's defaults)."""
        with head_like_model(self):
            super().reset_classifier(num_classes, self.global_pool.pool_type if global_pool is None else global_pool)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """None by name: timm's optimizer factory already keeps BN and bias (1-D) parameters out of weight decay."""
        return set()


def _unwrap(state_dict: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """The weights of an official ``{'state_dict': ..., 'name': ...}`` checkpoint (a bare state_dict as is)."""
    return state_dict['state_dict'] if isinstance(state_dict.get('state_dict'), dict) else state_dict


_PIT_OLD_POOL = re.compile(r'^transformers\.(\d+)\.pool\.')


def pit_checkpoint_filter_fn(
        state_dict: Dict[str, Any],
        model: PoolingVisionTransformer,
) -> Dict[str, torch.Tensor]:
    """timm < 0.9 pooled at the end of a stage (``transformers.i.pool``), timm now at the start of the next
    (``transformers.{i+1}.pool``); stage 0 has a pool only in the old layout. timm's filter maps the layout older
    still (``pools.i``)."""
    state_dict = _unwrap(state_dict)
    if any(k.startswith('transformers.0.pool.') for k in state_dict):
        state_dict = {_PIT_OLD_POOL.sub(lambda m: f'transformers.{int(m.group(1)) + 1}.pool.', k): v
                      for k, v in state_dict.items()}
    return _pit_checkpoint_filter_fn(state_dict, model)


def swin_checkpoint_filter_fn(state_dict: Dict[str, Any], model: SwinTransformer) -> Dict[str, torch.Tensor]:
    """timm's Swin filter knows the timm < 0.9 layout (downsample at the end of a stage, ``head``) and drops the
    ``relative_position_index`` / ``attn_mask`` buffers that layout saved."""
    return _swin_checkpoint_filter_fn(_unwrap(state_dict), model)


# official ResNet (models/resnet.py, resnet_dnn_block.py) -> timm's ResNet, applied in order
_RESNET_KEYS = (
    (re.compile(r'^layer0\.0\.'), 'conv1.'),
    (re.compile(r'^layer0\.1\.'), 'bn1.'),
    (re.compile(r'^(layer\d\.\d+)\.conv(\d)\.0\.'), r'\1.conv\2.'),
    (re.compile(r'^(layer\d\.\d+)\.conv(\d)\.1\.'), r'\1.bn\2.'),
    (re.compile(r'^(layer\d\.\d+)\.shortcut\.'), r'\1.downsample.'),
    (re.compile(r'^classifier\.0\.dense\.'), 'fc.'),
)


def resnet_checkpoint_filter_fn(state_dict: Dict[str, Any], model: CifarStemResNet) -> Dict[str, torch.Tensor]:
    """The official ResNet's keys to timm's: ``layer0.{0,1}`` -> ``conv1``/``bn1``, ``convN.{0,1}`` ->
    ``convN``/``bnN``, ``shortcut`` -> ``downsample``, ``classifier.0.dense`` -> ``fc``."""
    out = {}
    for key, value in _unwrap(state_dict).items():
        for pattern, replacement in _RESNET_KEYS:
            key = pattern.sub(replacement, key)
        out[key] = value
    return out


def _create(model_cls, variant: str, pretrained: bool, filter_fn, feature_cfg: Dict[str, Any], **kwargs):
    return build_timm_ext_model(
        model_cls, variant, pretrained, pretrained_filter_fn=filter_fn, feature_cfg=feature_cfg, **kwargs)


def _hdvw_cfg(filename: str, first_conv: str, **kwargs) -> Dict[str, Any]:
    return model_cfg(  # the official CIFAR-100 test transform: crop_pct 1.0, bilinear (ops/datasets.py)
        'how-do-vits-work', first_conv, _RELEASE + filename, license=None, input_size=(3, 32, 32), crop_pct=1.0,
        num_classes=100, mean=_CIFAR100_MEAN, std=_CIFAR100_STD, interpolation='bilinear',
        origin_url='https://github.com/xxxnell/how-do-vits-work',
        notes=('CIFAR-100 weights released by the authors (v0.1); licence not stated, no test accuracy reported',),
        **kwargs)


default_cfgs = generate_default_cfgs({
    'vit_tiny_patch2_32.hdvw_cifar100': _hdvw_cfg(
        'vit_ti_cifar100_9857b21357.pth.tar', first_conv='patch_embed.proj', classifier='head'),
    'pit_ti_patch2_32.hdvw_cifar100': _hdvw_cfg(
        'pit_ti_cifar100_0645889efb.pth.tar', first_conv='patch_embed.conv', classifier='head'),
    'swin_tiny_patch1_window4_32.hdvw_cifar100': _hdvw_cfg(
        'swin_ti_cifar100_ec2894492b.pth.tar', first_conv='patch_embed.proj', classifier='head.fc', pool_size=(4, 4)),
    'resnet50_cifar.hdvw_cifar100': _hdvw_cfg(
        'resnet_50_cifar100_691cc9a9e4.pth.tar', first_conv='conv1', classifier='fc', pool_size=(4, 4),
        fixed_input_size=False),
})


@register_model
def vit_tiny_patch2_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ ViT-Ti for 32 px images with 2 px patches (256 tokens), no qkv bias: how-do-vits-work's CIFAR ViT-Ti. """
    model_args = dict(img_size=32, patch_size=2, embed_dim=192, depth=12, num_heads=3, qkv_bias=False)
    out_indices = kwargs.pop('out_indices', 3)
    # stem= takes a conv stem as every timm-ext ViT does; the official keys are timm's (the filter unwraps them)
    kwargs = apply_stem_kwargs(dict(model_args, **kwargs))
    filter_fn = partial(vit_stem_checkpoint_filter_fn, strict=kwargs.get('pretrained_strict', True))
    return _create(VisionTransformer, 'vit_tiny_patch2_32', pretrained, filter_fn,
                   dict(out_indices=out_indices, feature_cls='getter'), **kwargs)


@register_model
def pit_ti_patch2_32(pretrained: bool = False, **kwargs) -> PoolingVisionTransformer:
    """ PiT-Ti for 32 px images: 2 px patches at stride 1 (31 x 31 tokens): how-do-vits-work's CIFAR PiT-Ti. """
    model_args = dict(img_size=32, patch_size=2, stride=1, base_dims=[32, 32, 32], depth=[2, 6, 4], heads=[2, 4, 8],
                      mlp_ratio=4)
    out_indices = kwargs.pop('out_indices', (0, 1, 2))
    return _create(PoolingVisionTransformer, 'pit_ti_patch2_32', pretrained, pit_checkpoint_filter_fn,
                   dict(feature_cls='hook', out_indices=out_indices), **dict(model_args, **kwargs))


@register_model
def swin_tiny_patch1_window4_32(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """ Swin-T for 32 px images: 1 px patches, 4 x 4 windows, no qkv bias: how-do-vits-work's CIFAR Swin-Ti. """
    model_args = dict(img_size=32, patch_size=1, window_size=4, embed_dim=96, depths=(2, 2, 6, 2),
                      num_heads=(3, 6, 12, 24), qkv_bias=False)
    out_indices = kwargs.pop('out_indices', (0, 1, 2, 3))
    return _create(SwinTransformer, 'swin_tiny_patch1_window4_32', pretrained, swin_checkpoint_filter_fn,
                   dict(flatten_sequential=True, out_indices=out_indices), **dict(model_args, **kwargs))


@register_model
def resnet50_cifar(pretrained: bool = False, **kwargs) -> CifarStemResNet:
    """ ResNet-50 (post-activation Bottleneck, 3-4-6-3) with a CIFAR stem: how-do-vits-work's CIFAR ResNet-50. """
    model_args = dict(block=Bottleneck, layers=(3, 4, 6, 3))
    return _create(CifarStemResNet, 'resnet50_cifar', pretrained, resnet_checkpoint_filter_fn, {},
                   **dict(model_args, **kwargs))
