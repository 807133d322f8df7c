""" Scaled-ReLU convolutional stem: a drop-in for timm's ``PatchEmbed``.

Paper: 'Scaled ReLU Matters for Training Vision Transformers' (Wang et al., AAAI 2022),
https://arxiv.org/abs/2109.03810

The paper replaces ViT's patchify stem (one P x P, stride-P conv) with VOLO's conv stem,
3Conv+3BN+3ReLU+1Proj: three convs of 64 channels, kernels (7, 3, 3, P/2) and strides
(2, 1, 1, P/2), each followed by BatchNorm + ReLU, which act as a *scaled ReLU*
``beta * max(x + alpha / beta, 0)`` on the normalised conv output (alpha, beta: BN bias and weight).
That lets DeiT-S train at lr 1e-3 and lifts it 79.8 -> 81.9 top-1.

Every stem of the paper's ablations (Tables 2, 3 and the GELU row of Table 5) is one ``stem=``
name, spelled like the table row (see ``STEM_VARIANTS``, ``resolve_stem``). Choices where a row is
ambiguous (ours, not the paper's):

* ``3conv_1proj_1relu``: the single ReLU sits after the projection, as in ``1proj_1relu``
  (the row names list it after Proj, while ``3conv_3relu_1proj`` lists ReLU before Proj).
* Removing BN keeps the three convs bias-free, as in VOLO's code with the BN lines deleted, so a
  variant differs from the full stem by exactly the layers its row names.
* ``1proj_1bn_1relu``: BatchNorm2d(embed_dim) and ReLU on the projected (B, D, H/P, W/P) grid.
* ``_s2222`` (Table 3): same kernels, strides (2, 2, 2, P/8), padding ``(k - s + 1) // 2`` so every
  layer maps a size divisible by its stride to exactly size / stride.

All convs keep VOLO's module indices (``conv.0/1/2``, ``conv.3/4/5``, ``conv.6/7/8`` = conv, norm,
act; ``nn.Identity`` where a row removes a layer), so every variant has VOLO's key layout and
``conv.0`` is always the first conv.
"""
import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Format, _assert, nchw_to, to_2tuple

__all__ = ['ConvStemPatchEmbed', 'StemVariant', 'STEM_VARIANTS', 'STEM_ALIASES', 'resolve_stem']


@dataclass(frozen=True)
class StemVariant:
    """ Which layers a stem has: three convs (each optionally + norm, + act) then the projection. """
    convs: bool = True          # 3 convs (kernels 7, 3, 3) before the projection
    conv_norm: bool = True      # BatchNorm2d after each conv
    conv_act: bool = True       # activation after each conv
    proj_norm: bool = False     # BatchNorm2d after the projection
    proj_act: bool = False      # activation after the projection
    act: str = 'relu'           # 'relu' or 'gelu' (Table 5)
    even_strides: bool = False  # strides (2, 2, 2, P/8) instead of (2, 1, 1, P/2) (Table 3)
    paper_row: str = ''         # the row as printed in the paper

    def strides(self, patch_size: int) -> Tuple[int, ...]:
        if not self.convs:
            return (patch_size,)
        return (2, 2, 2, patch_size // 8) if self.even_strides else (2, 1, 1, patch_size // 2)

    def kernels(self, patch_size: int) -> Tuple[int, ...]:
        return (7, 3, 3, patch_size // 2) if self.convs else (patch_size,)


def _conv_variants(suffix: str, paper_suffix: str, **kwargs) -> Dict[str, StemVariant]:
    return {
        f'3conv_3bn_3relu_1proj{suffix}': StemVariant(paper_row=f'3Conv+3BN+3ReLU+1Proj {paper_suffix}', **kwargs),
        f'3conv_3bn_1proj{suffix}': StemVariant(conv_act=False, paper_row=f'3Conv+3BN+1Proj {paper_suffix}', **kwargs),
        f'3conv_3relu_1proj{suffix}': StemVariant(
            conv_norm=False, paper_row=f'3Conv+3ReLU+1Proj {paper_suffix}', **kwargs),
        f'3conv_1proj{suffix}': StemVariant(
            conv_norm=False, conv_act=False, paper_row=f'3Conv+1Proj {paper_suffix}', **kwargs),
        f'3conv_1proj_1relu{suffix}': StemVariant(
            conv_norm=False, conv_act=False, proj_act=True, paper_row=f'3Conv+1Proj+1ReLU {paper_suffix}', **kwargs),
    }


STEM_VARIANTS: Dict[str, StemVariant] = {
    # Table 2 (DeiT-S, DINO-S/16, VOLO-d1), strides (2, 1, 1, P/2)
    **_conv_variants('', '(2,1,1,P/2)'),
    '1proj_1bn_1relu': StemVariant(convs=False, proj_norm=True, proj_act=True, paper_row='1Proj+1BN+1ReLU (P)'),
    '1proj_1relu': StemVariant(convs=False, proj_act=True, paper_row='1Proj+1ReLU (P)'),
    '1proj': StemVariant(convs=False, paper_row='1Proj (baseline) (P)'),
    # Table 3: the even stride schedule (2, 2, 2, P/8), for every conv row
    **_conv_variants('_s2222', '(2,2,2,2) for P=16', even_strides=True),
    # Table 5: ReLU -> GELU in the conv stem
    '3conv_3bn_3gelu_1proj': StemVariant(act='gelu', paper_row='3Conv+3BN+3ReLU+1Proj, ReLU->GELU in conv-stem'),
}
STEM_ALIASES: Dict[str, str] = {'conv': '3conv_3bn_3relu_1proj', 'patch': '1proj'}
_ACT_LAYERS: Dict[str, Callable[[], nn.Module]] = {'relu': partial(nn.ReLU, inplace=True), 'gelu': nn.GELU}


def resolve_stem(stem: str) -> str:
    """ Canonical variant name of ``stem``: a ``STEM_VARIANTS`` key, an alias ('conv', 'patch') or the
    paper's spelling ('3Conv+3BN+3ReLU+1Proj', case and spaces ignored). """
    if not isinstance(stem, str):
        raise ValueError(f'stem must be a variant name (str), got {stem!r}; valid: {", ".join(_valid_names())}.')
    name = stem.strip().lower().replace('+', '_').replace(' ', '').replace('(baseline)', '')
    name = STEM_ALIASES.get(name, name)
    if name not in STEM_VARIANTS:
        raise ValueError(f'Unknown stem {stem!r}; valid: {", ".join(_valid_names())}.')
    return name


def _valid_names() -> Tuple[str, ...]:
    return tuple(STEM_ALIASES) + tuple(STEM_VARIANTS)


def _check_img_size(img_size: Optional[Union[int, Tuple[int, int]]], stride: int, dynamic_img_pad: bool) -> None:
    if img_size is None or dynamic_img_pad:
        return
    size = to_2tuple(img_size)
    if size[0] % stride or size[1] % stride:
        raise ValueError(
            f'img_size {tuple(size)} is not divisible by the stem total stride {stride}; use a multiple of {stride} '
            f'or dynamic_img_pad=True.')


def _same_padding(kernel_size: int, stride: int) -> int:
    """Padding that maps a size divisible by ``stride`` to exactly size / stride (odd kernels or stride >= 2)."""
    return (kernel_size - stride + 1) // 2


class ConvStemPatchEmbed(nn.Module):
    """ Conv-stem image to patch embedding: (B, C, H, W) -> (B, H/P * W/P, D) (or NHWC / NCHW).

    Exposes the interface a timm ViT needs from its ``embed_layer`` (as timm's ``PatchEmbed`` and
    ``HybridEmbed`` do): ``img_size``, ``patch_size``, ``grid_size``, ``num_patches``, ``feat_ratio()``,
    ``dynamic_feat_size()``, ``set_input_size()``, ``flatten`` / ``output_fmt``, ``strict_img_size`` and
    ``dynamic_img_pad``; so ``VisionTransformer(embed_layer=ConvStemPatchEmbed)`` works, incl.
    ``dynamic_img_size``. The total stride of every variant is ``patch_size``.

    Args (besides PatchEmbed's):
        stem: variant name, see ``STEM_VARIANTS`` / ``resolve_stem``; default the paper's full stem.
        hidden_dim: channels of the three convs (64 in the paper and VOLO-d1..d4).
    """
    output_fmt: Format
    dynamic_img_pad: torch.jit.Final[bool]

    def __init__(
            self,
            img_size: Optional[Union[int, Tuple[int, int]]] = 224,
            patch_size: Union[int, Tuple[int, int]] = 16,
            in_chans: int = 3,
            embed_dim: int = 768,
            norm_layer: Optional[Callable[..., nn.Module]] = None,
            flatten: bool = True,
            output_fmt: Optional[str] = None,
            bias: bool = True,
            strict_img_size: bool = True,
            dynamic_img_pad: bool = False,
            stem: str = '3conv_3bn_3relu_1proj',
            hidden_dim: int = 64,
            device=None,
            dtype=None,
    ) -> None:
        dd = {'device': device, 'dtype': dtype}
        super().__init__()
        stem = resolve_stem(stem)
        variant = STEM_VARIANTS[stem]
        patch = to_2tuple(patch_size)
        step = 16 if variant.even_strides else (2 if variant.convs else 1)
        if patch[0] != patch[1] or patch[0] < step or patch[0] % step:
            raise ValueError(f'stem {stem!r} needs a square patch_size divisible by {step}, got {patch_size!r}.')
        _check_img_size(img_size, patch[0], dynamic_img_pad)
        self.stem = stem
        self.hidden_dim = hidden_dim
        self.patch_size = patch
        self.dynamic_img_pad = dynamic_img_pad
        self.strict_img_size = strict_img_size
        self.img_size, self.grid_size, self.num_patches = self._init_img_size(img_size)
        if output_fmt is not None:
            self.flatten = False
            self.output_fmt = Format(output_fmt)
        else:  # timm's convention: flatten to (B, N, D) unless a format is asked for
            self.flatten = flatten
            self.output_fmt = Format.NCHW

        kernels, strides = variant.kernels(patch[0]), variant.strides(patch[0])
        act_layer = _ACT_LAYERS[variant.act]
        chs = in_chans
        if variant.convs:
            layers = []
            for k, s in zip(kernels[:3], strides[:3]):
                layers += [
                    nn.Conv2d(chs, hidden_dim, k, stride=s, padding=_same_padding(k, s), bias=False, **dd),
                    nn.BatchNorm2d(hidden_dim, **dd) if variant.conv_norm else nn.Identity(),
                    act_layer() if variant.conv_act else nn.Identity(),
                ]
                chs = hidden_dim
            self.conv = nn.Sequential(*layers)
        else:
            self.conv = None
        k, s = kernels[-1], strides[-1]
        self.proj = nn.Conv2d(chs, embed_dim, k, stride=s, padding=_same_padding(k, s), bias=bias, **dd)
        self.proj_norm = nn.BatchNorm2d(embed_dim, **dd) if variant.proj_norm else nn.Identity()
        self.proj_act = act_layer() if variant.proj_act else nn.Identity()
        self.norm = norm_layer(embed_dim, **dd) if norm_layer else nn.Identity()

    def _init_img_size(self, img_size: Optional[Union[int, Tuple[int, int]]]):
        if img_size is None:
            return None, None, None
        img_size = to_2tuple(img_size)
        grid_size = self.dynamic_feat_size(img_size)
        return img_size, grid_size, grid_size[0] * grid_size[1]

    def set_input_size(
            self,
            img_size: Optional[Union[int, Tuple[int, int]]] = None,
            patch_size: Optional[Union[int, Tuple[int, int]]] = None,
    ) -> None:
        """New image size (any multiple of the total stride); the patch size of a conv stem is fixed."""
        if patch_size is not None and to_2tuple(patch_size) != self.patch_size:
            raise ValueError(
                f'The patch size of a conv stem cannot be changed ({self.patch_size} -> {to_2tuple(patch_size)}): '
                f'its strides are built for it. Build a new model with patch_size={patch_size!r} instead.')
        if img_size is not None:
            _check_img_size(img_size, self.patch_size[0], self.dynamic_img_pad)
            self.img_size, self.grid_size, self.num_patches = self._init_img_size(img_size)

    def feat_ratio(self, as_scalar: bool = True) -> Union[Tuple[int, int], int]:
        return max(self.patch_size) if as_scalar else self.patch_size

    def dynamic_feat_size(self, img_size: Tuple[int, int]) -> Tuple[int, int]:
        """Token grid for an image size: ceil with ``dynamic_img_pad`` (the input is padded), floor otherwise."""
        if self.dynamic_img_pad:
            return math.ceil(img_size[0] / self.patch_size[0]), math.ceil(img_size[1] / self.patch_size[1])
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        if self.img_size is not None and self.strict_img_size:
            _assert(H == self.img_size[0], f'Input height {H} does not match the model img_size {self.img_size}; '
                                           f'create the model with this img_size or dynamic_img_size=True.')
            _assert(W == self.img_size[1], f'Input width {W} does not match the model img_size {self.img_size}; '
                                           f'create the model with this img_size or dynamic_img_size=True.')
        elif not self.dynamic_img_pad:
            _assert(H % self.patch_size[0] == 0, f'Input height {H} is not divisible by the stem total stride '
                                                 f'{self.patch_size[0]}; resize or use dynamic_img_pad=True.')
            _assert(W % self.patch_size[1] == 0, f'Input width {W} is not divisible by the stem total stride '
                                                 f'{self.patch_size[1]}; resize or use dynamic_img_pad=True.')
        if self.dynamic_img_pad:
            pad_h = (self.patch_size[0] - H % self.patch_size[0]) % self.patch_size[0]
            pad_w = (self.patch_size[1] - W % self.patch_size[1]) % self.patch_size[1]
            x = F.pad(x, (0, pad_w, 0, pad_h))
        if self.conv is not None:
            x = self.conv(x)
        x = self.proj_act(self.proj_norm(self.proj(x)))
        if self.flatten:
            x = x.flatten(2).transpose(1, 2)  # NCHW -> NLC
        elif self.output_fmt != Format.NCHW:
            x = nchw_to(x, self.output_fmt)
        return self.norm(x)

    def extra_repr(self) -> str:
        return f'stem={self.stem!r}, hidden_dim={self.hidden_dim}, patch_size={self.patch_size}'
