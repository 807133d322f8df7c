""" AlterNet: pre-activation ResNet whose stages end with local-MSA blocks

Paper: 'How Do Vision Transformers Work?' (Park & Kim, ICLR 2022), https://arxiv.org/abs/2202.06709
Official code (not timm-registered): https://github.com/xxxnell/how-do-vits-work (models/alternet.py)

A pre-activation ResNet (timm's ``PreActBottleneck`` / ``PreActBasic`` with BatchNorm + ReLU; depths
34-152 get a fourth block in the last stage) in which Conv blocks are replaced by MSA blocks alternately
from the end of each stage: BN -> GELU -> 1x1 conv C->C/4 -> BN -> windowed MSA (heads 3/6/12/24 of
dim 64, one relative-position-bias table shared by heads) -> 1x1 projection, identity residual.
Head: BN -> ReLU -> global average pool -> Linear. Stochastic depth linear over all blocks.

What is ours: timm registration and behaviour, padding + masking for maps the window does not
divide (the official code crashes, its issues 22/38), CIFAR models at every depth, and the
``*_nomsa`` pre-activation ResNet baselines built by the same class. ``alternet_50`` uses the
paper's 6 ImageNet MSAs (0, 1, 3, 2); ``alternet_*_cifar`` the paper's CIFAR rule (Fig. 11:
one MSA at the end of stages 2 and 3, two in stage 4). Official checkpoints load through
``checkpoint_filter_fn`` (see ``timm_ext.models.alternet_convert``).
"""
from collections import OrderedDict
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import (
    BatchNormAct2d,
    ClassifierHead,
    DropPath,
    calculate_drop_path_rates,
    create_conv2d,
    register_notrace_function,
)
from timm.models import FeatureListNet, checkpoint_seq, generate_default_cfgs, register_model
from timm.models.resnetv2 import DownsampleConv, PreActBasic, PreActBottleneck

from timm_ext._timm_compat import feature_take_indices
from timm_ext.arg_types import is_positive_int, positive_int
from timm_ext.layers.memory_format import contiguous_like
from timm_ext.layers.small_map_conv import create_small_map_conv2d
from timm_ext.layers.window_attention import WindowAttention2d
from timm_ext.models._builder import build_timm_ext_model
from timm_ext.models._cfgs import model_cfg
from timm_ext.models._head import head_like_model
from timm_ext.models.alternet_convert import convert_official_alternet, is_official_alternet_state_dict

# model_registry will add each entrypoint fn to this
__all__ = ['AlterNet', 'AlterNetFeatureList', 'LocalMsaBlock', 'alternet_msa_indices']

CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)

# ResNet depth -> (Conv block type, blocks per stage, default MSA blocks per stage = the official code's).
# The last stage has one block more than ResNet's (paper App. E: "We add one CNN block to the last stage
# of ResNet to make the number of blocks even").
_DEPTHS: Dict[int, Tuple[str, Tuple[int, ...], Tuple[int, ...]]] = {
    18: ('basic', (2, 2, 2, 2), (0, 1, 1, 1)),
    34: ('basic', (3, 4, 6, 4), (0, 1, 3, 2)),
    50: ('bottleneck', (3, 4, 6, 4), (0, 1, 3, 2)),
    101: ('bottleneck', (3, 4, 23, 4), (0, 1, 3, 2)),
    152: ('bottleneck', (3, 8, 36, 4), (0, 1, 3, 2)),
}
_STEM_TYPES = ('imagenet', 'cifar')


class AlterNetBasic(PreActBasic):
    """ timm's ``PreActBasic`` (same layers and state-dict keys); the residual sum is written into the last conv's
    fresh output instead of a new tensor (that conv's backward does not need its output). """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_preact = self.norm1(x)
        shortcut = x if self.downsample is None else self.downsample(x_preact)
        x = self.conv2(self.norm2(self.conv1(x_preact)))
        return self.drop_path(x).add_(shortcut)


class AlterNetBottleneck(PreActBottleneck):
    """ timm's ``PreActBottleneck`` (same layers and state-dict keys); the residual sum is written into the last
    conv's fresh output instead of a new tensor (that conv's backward does not need its output). """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_preact = self.norm1(x)
        shortcut = x if self.downsample is None else self.downsample(x_preact)
        x = self.conv2(self.norm2(self.conv1(x_preact)))
        x = self.conv3(self.norm3(x))
        return self.drop_path(x).add_(shortcut)


_BLOCK_TYPES = {'basic': (AlterNetBasic, 1.0), 'bottleneck': (AlterNetBottleneck, 0.25)}


def alternet_msa_indices(num_blocks: int, num_msa: int) -> Tuple[int, ...]:
    """Indices of the MSA blocks in a stage: alternating with Conv blocks from the end (..., C, M, C, M)."""
    if not 0 <= 2 * num_msa <= num_blocks:
        raise ValueError(
            f'A stage of {num_blocks} blocks fits at most {num_blocks // 2} MSA blocks (each follows a Conv '
            f'block), got {num_msa}.')
    return tuple(range(num_blocks - 2 * num_msa + 1, num_blocks, 2))


class LocalMsaBlock(nn.Module):
    """ Pre-activation local-MSA block: x + DropPath(Attn(BN(Conv1x1(GELU(BN(x)))))) on (B, C, H, W).

    No MLP: the Conv blocks before it play that role (paper Fig. 3). Identity residual, stride 1.
    """

    def __init__(
            self,
            dim: int,
            num_heads: int,
            head_dim: int = 64,
            bottle_ratio: float = 0.25,
            window_size: int = 7,
            pad_to_window: bool = True,
            proj_drop: float = 0.,
            drop_path_rate: float = 0.,
            norm_layer: Callable[..., nn.Module] = BatchNormAct2d,
            device=None,
            dtype=None,
    ) -> None:
        dd = {'device': device, 'dtype': dtype}
        super().__init__()
        width = int(dim * bottle_ratio)
        self.norm1 = norm_layer(dim, act_layer='gelu', **dd)
        self.proj_in = create_small_map_conv2d(dim, width, 1, **dd)
        self.norm2 = norm_layer(width, apply_act=False, **dd)
        self.attn = WindowAttention2d(
            width, dim, num_heads=num_heads, head_dim=head_dim, window_size=window_size,
            pad_to_window=pad_to_window, proj_drop=proj_drop, **dd)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.attn(self.norm2(self.proj_in(self.norm1(x))))
        # out of place: the attention hands back a view (channels-last rows), and an in-place sum on a view makes
        # autograd copy the whole gradient back in the view's base layout
        return self.drop_path(x) + shortcut


class AlterNetStage(nn.Module):
    """ One stage: a strided Conv block, more Conv blocks, MSA blocks at ``msa_indices``. """

    def __init__(
            self,
            in_chs: int,
            out_chs: int,
            depth: int,
            stride: int,
            msa_indices: Sequence[int],
            block_fn: Callable[..., nn.Module],
            bottle_ratio: float,
            block_dpr: Sequence[float],
            conv_kwargs: Dict[str, Any],
            msa_kwargs: Dict[str, Any],
            device=None,
            dtype=None,
    ) -> None:
        dd = {'device': device, 'dtype': dtype}
        super().__init__()
        self.grad_checkpointing = False
        blocks = []
        for i in range(depth):
            if i in msa_indices:
                blocks.append(LocalMsaBlock(
                    out_chs, bottle_ratio=bottle_ratio, drop_path_rate=block_dpr[i], **msa_kwargs, **dd))
                continue
            block_in, block_stride = (in_chs, stride) if i == 0 else (out_chs, 1)
            # projection shortcut only where the shape changes (as the official code; timm's stage always adds one)
            needs_proj = block_stride != 1 or block_in != out_chs
            blocks.append(block_fn(
                block_in, out_chs, bottle_ratio=bottle_ratio, stride=block_stride,
                proj_layer=DownsampleConv if needs_proj else None, drop_path_rate=block_dpr[i], **conv_kwargs, **dd))
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)


@register_notrace_function  # reason: branches on the input's memory format
def _memory_format_like(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` in ``like``'s memory format (channels-last when ``like`` is, else contiguous); no copy if it already is."""
    return contiguous_like(x, like)


def _create_stem(stem_type: str, in_chans: int, out_chs: int, **dd) -> nn.Sequential:
    if stem_type == 'cifar':
        return nn.Sequential(OrderedDict(conv=create_conv2d(in_chans, out_chs, 3, stride=1, **dd)))
    return nn.Sequential(OrderedDict(
        conv=create_conv2d(in_chans, out_chs, 7, stride=2, **dd),
        pool=nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
    ))


def _check_args(
        depth, layers, msa_blocks, num_heads, head_dim, channels, window_size, stem_type) -> Tuple[tuple, tuple]:
    """Resolve ``layers`` / ``msa_blocks`` from ``depth`` and reject what would build a wrong model."""
    if depth not in _DEPTHS:
        raise ValueError(f'Unknown AlterNet depth {depth!r}: choose one of {", ".join(map(str, _DEPTHS))}.')
    layers = tuple(_DEPTHS[depth][1] if layers is None else layers)
    msa_blocks = tuple(_DEPTHS[depth][2] if msa_blocks is None else msa_blocks)
    if not isinstance(num_heads, Sequence):
        raise ValueError(f'num_heads must be a sequence with one entry per stage, got {num_heads!r}.')
    for name, value in (('msa_blocks', msa_blocks), ('num_heads', num_heads), ('channels', channels)):
        if value is not None and len(value) != len(layers):
            raise ValueError(f'{name}={tuple(value)} needs one entry per stage ({len(layers)} stages: {layers}).')
    for stage_idx, (n, m) in enumerate(zip(layers, msa_blocks)):
        if not 0 <= 2 * m <= n:
            raise ValueError(
                f'msa_blocks={tuple(msa_blocks)}: stage {stage_idx + 1} has {n} blocks, which fits at most '
                f'{n // 2} MSA blocks (each MSA block follows a Conv block), got {m}.')
    if any(msa_blocks):
        positive_int('window_size', window_size)
        positive_int('head_dim', head_dim)
        if not all(is_positive_int(h) for h in num_heads):
            raise ValueError(f'num_heads must be positive ints, one per stage, got {tuple(num_heads)!r}.')
    if stem_type not in _STEM_TYPES:
        raise ValueError(f'Unknown stem_type {stem_type!r}: choose one of {", ".join(_STEM_TYPES)}.')
    return layers, msa_blocks


class AlterNet(nn.Module):
    """ AlterNet (and, with ``msa_blocks`` all zero, the paper's pre-activation ResNet baseline).

    Args:
        depth: ResNet depth (18, 34, 50, 101, 152); picks the Conv block and the blocks per stage.
        layers: blocks per stage, overriding those of ``depth`` (the block type still comes from ``depth``).
        msa_blocks: MSA blocks per stage, placed alternately from the end of the stage (default: the
            official code's, (0, 1, 1, 1) for depth 18 and (0, 1, 3, 2) otherwise).
        channels: output channels per stage (default 64/128/256/512 x block expansion).
        num_heads: heads of the MSA blocks per stage; ``head_dim`` channels each.
        window_size: side of the square attention windows (7 for 224 px ImageNet, 4 for 32 px CIFAR).
        pad_to_window: pad + mask maps the window does not divide; False raises on them.
        stem_type: 'imagenet' (7x7/2 conv + 3x3/2 max-pool) or 'cifar' (3x3/1 conv). Pre-activation: no norm.
        stem_chs: stem output channels.
        proj_drop: dropout after the MSA output projection (the official ``dropout``).
        drop_rate: classifier dropout. drop_path_rate: stochastic depth, linear over all blocks.
        channels_last: run the trunk in channels-last memory whatever the input's format (one copy of the
            input), so that oneDNN's convolutions and the window attention need no layout copies (faster on
            CPU, same numbers; docs/alternet.md#speed). ``forward_features`` and ``forward_intermediates`` hand
            back the input's memory format. False keeps the input's format throughout.
    """

    def __init__(
            self,
            depth: int = 50,
            layers: Optional[Sequence[int]] = None,
            msa_blocks: Optional[Sequence[int]] = None,
            channels: Optional[Sequence[int]] = None,
            num_heads: Sequence[int] = (3, 6, 12, 24),
            head_dim: int = 64,
            window_size: int = 7,
            pad_to_window: bool = True,
            stem_type: str = 'imagenet',
            stem_chs: int = 64,
            num_classes: int = 1000,
            in_chans: int = 3,
            global_pool: str = 'avg',
            proj_drop: float = 0.,
            drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            channels_last: bool = True,
            device=None,
            dtype=None,
    ) -> None:
        dd = {'device': device, 'dtype': dtype}
        super().__init__()
        layers, msa_blocks = _check_args(
            depth, layers, msa_blocks, num_heads, head_dim, channels, window_size, stem_type)
        block_fn, bottle_ratio = _BLOCK_TYPES[_DEPTHS[depth][0]]
        channels = tuple(channels or (int(c / bottle_ratio) for c in (64, 128, 256, 512)))
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.msa_blocks = tuple(msa_blocks)
        self.channels_last = channels_last

        norm_act_layer = partial(BatchNormAct2d, act_layer='relu')
        self.stem = _create_stem(stem_type, in_chans, stem_chs, **dd)
        # level 0 is the stem conv's output (before the ImageNet stem's max-pool), as timm's pre-activation
        # ResNetV2 ('stem.conv'), so that resnet50's out_indices pick the same reductions
        stem_reduction, stride = (1, 1) if stem_type == 'cifar' else (2, 4)

        block_dprs = calculate_drop_path_rates(drop_path_rate, list(layers), stagewise=True)
        conv_kwargs = dict(conv_layer=create_small_map_conv2d, norm_layer=norm_act_layer)
        self.feature_info = [dict(num_chs=stem_chs, reduction=stem_reduction, module='stem.conv')]
        stages = []
        prev_chs = stem_chs
        for stage_idx, (n, m, out_chs, heads) in enumerate(zip(layers, msa_blocks, channels, num_heads)):
            stage_stride = 1 if stage_idx == 0 else 2
            msa_kwargs = dict(
                num_heads=heads, head_dim=head_dim, window_size=window_size, pad_to_window=pad_to_window,
                proj_drop=proj_drop, norm_layer=BatchNormAct2d)
            stages.append(AlterNetStage(
                prev_chs, out_chs, n, stage_stride, alternet_msa_indices(n, m), block_fn, bottle_ratio,
                block_dprs[stage_idx], conv_kwargs, msa_kwargs, **dd))
            prev_chs = out_chs
            stride *= stage_stride
            self.feature_info.append(dict(num_chs=out_chs, reduction=stride, module=f'stages.{stage_idx}'))
        self.stages = nn.Sequential(*stages)

        self.num_features = self.head_hidden_size = prev_chs
        self.norm = norm_act_layer(prev_chs, **dd)
        self.head = ClassifierHead(prev_chs, num_classes, pool_type=global_pool, drop_rate=drop_rate, **dd)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        return {n for n, _ in self.named_parameters() if 'relative_position_bias_table' in n}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(
            stem=r'^stem',
            blocks=r'^stages\.(\d+)' if coarse else [
                (r'^stages\.(\d+)\.blocks\.(\d+)', None),
                (r'^norm', (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.stages:
            stage.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        with head_like_model(self):  # ClassifierHead.reset: torch's defaults, or its fc's (none after reset(0))
            self.head.reset(num_classes, global_pool)

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NCHW',
            intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """ Forward features that returns intermediates: index 0 is the stem conv's output, index i the output of
        stage i - 1 (the levels of ``feature_info``, as timm's ResNetV2).

        Args:
            x: Input image tensor.
            indices: Take last n levels if int, all if None, select matching indices if sequence.
            norm: Apply the final norm (BN + ReLU) to the last stage's output.
            stop_early: Stop iterating over stages when the last desired intermediate is hit.
            output_fmt: Only 'NCHW'.
            intermediates_only: Only return intermediate features.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}.")
        intermediates = []
        take_indices, max_index = self._take_indices(indices, 'indices')
        last_idx = len(self.stages)
        stages = self.stages if torch.jit.is_scripting() or not stop_early else self.stages[:max_index]

        x_in = x
        x = self._to_trunk_format(x)
        for i, layer in enumerate(self.stem):
            x = layer(x)
            if i == 0 and 0 in take_indices:  # the stem conv, before the ImageNet stem's max-pool
                intermediates.append(_memory_format_like(x, x_in))
        feat_idx = 0
        for feat_idx, stage in enumerate(stages, start=1):
            x = stage(x)
            if feat_idx in take_indices:
                feat = self.norm(x) if norm and feat_idx == last_idx else x
                intermediates.append(_memory_format_like(feat, x_in))

        if intermediates_only:
            return intermediates
        if feat_idx == last_idx:
            x = self.norm(x)
        return _memory_format_like(x, x_in), intermediates

    def prune_intermediate_layers(
            self,
            indices: Union[int, List[int]] = 1,
            prune_norm: bool = False,
            prune_head: bool = True,
    ) -> List[int]:
        """ Drop the stages (and the norm and head when they no longer fit, or when asked) not needed for
        ``indices``. """
        take_indices, max_index = self._take_indices(indices, 'indices')
        prune_end = max_index < len(self.stages)
        if prune_norm or prune_end:
            self.norm = nn.Identity()  # sized for (and applied to) the last stage only
        self.stages = self.stages[:max_index]
        if max_index == 0:
            self.stem = self.stem[:1]  # the stem feature is taken before the ImageNet stem's max-pool
        if prune_end:
            self.num_features = self.head_hidden_size = self.feature_info[max_index]['num_chs']
        if prune_head or prune_end:
            self.reset_classifier(0, '')
        return take_indices

    @torch.jit.ignore
    def _take_indices(self, indices: Optional[Union[int, Sequence[int]]], arg: str) -> Tuple[List[int], int]:
        levels = self.feature_info[:len(self.stages) + 1]  # the stem and the stages left after pruning
        _check_feature_indices(levels, indices, arg)
        return feature_take_indices(len(levels), indices)

    def _to_trunk_format(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _forward_trunk(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(self._to_trunk_format(x))
        x = self.stages(x)
        return self.norm(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return _memory_format_like(self._forward_trunk(x), x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits) if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # = forward_head(forward_features(x)) without handing the features back in the input's format first
        return self.forward_head(self._forward_trunk(x))


def _check_feature_indices(
        feature_info: Sequence[Dict[str, Any]], indices: Optional[Union[int, Sequence[int]]], arg: str) -> None:
    """A one-line ValueError naming the levels (module, reduction, channels) when ``indices`` (n: the last n
    levels; a sequence: the levels, negative from the end) asks for a level ``feature_info`` does not have.
    timm's own check is a bare IndexError (``features_only``) or an assert (``forward_intermediates``)."""
    n = len(feature_info)
    if indices is None or (0 < indices <= n if isinstance(indices, int) else all(-n <= i < n for i in indices)):
        return
    levels = ', '.join(
        f'{i} {f["module"]} (reduction {f["reduction"]}, {f["num_chs"]} chs)' for i, f in enumerate(feature_info))
    raise ValueError(
        f'{arg}={indices!r} is out of range: this AlterNet has {n} feature levels, {levels}; use indices 0 to '
        f'{n - 1} (negative ones count from the end) or an int n <= {n} for the last n.')


class AlterNetFeatureList(FeatureListNet):
    """ timm's ``FeatureListNet`` (what ``features_only=True`` builds) that names AlterNet's feature levels when
    ``out_indices`` asks for one the model does not have, instead of timm's bare IndexError. """

    def __init__(self, model: AlterNet, out_indices: Union[int, Tuple[int, ...]] = (0, 1, 2, 3, 4), **kwargs) -> None:
        _check_feature_indices(model.feature_info, out_indices, 'out_indices')
        super().__init__(model, out_indices=out_indices, **kwargs)


def checkpoint_filter_fn(state_dict: Dict[str, Any], model: AlterNet) -> Dict[str, torch.Tensor]:
    """Accept our layout as is and the official code's layout (a bare or ``{'state_dict': ...}`` checkpoint)."""
    if 'state_dict' in state_dict and not torch.is_tensor(state_dict['state_dict']):
        state_dict = state_dict['state_dict']
    if is_official_alternet_state_dict(state_dict):
        return convert_official_alternet(state_dict, model)
    return state_dict


def _create_alternet(variant: str, pretrained: bool = False, **kwargs) -> AlterNet:
    return build_timm_ext_model(
        AlterNet,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(flatten_sequential=True, feature_cls=AlterNetFeatureList),
        **kwargs,
    )


_CFG = dict(pool_size=(7, 7), crop_pct=0.875, interpolation='bilinear', fixed_input_size=False, classifier='head.fc')


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return model_cfg('how-do-vits-work', 'stem.conv', url, **{**_CFG, **kwargs})


def _cifar_cfg(**kwargs) -> Dict[str, Any]:
    return _cfg(
        num_classes=100, input_size=(3, 32, 32), pool_size=(4, 4), crop_pct=1.0,
        mean=CIFAR100_MEAN, std=CIFAR100_STD, **kwargs)


default_cfgs = generate_default_cfgs({
    **{f'alternet_{d}': _cfg() for d in _DEPTHS},
    **{f'alternet_{d}_cifar': _cifar_cfg() for d in _DEPTHS},
    **{f'alternet_{d}_nomsa': _cfg() for d in _DEPTHS},
    **{f'alternet_{d}_nomsa_cifar': _cifar_cfg() for d in _DEPTHS},
})

_NO_MSA = dict(msa_blocks=(0, 0, 0, 0))
_CIFAR = dict(stem_type='cifar', window_size=4)


@register_model
def alternet_18(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-18 (ImageNet): basic blocks (2, 2, 2, 2), MSA blocks (0, 1, 1, 1), window 7, 9.97M params. """
    model_args = dict(depth=18, msa_blocks=(0, 1, 1, 1))
    return _create_alternet('alternet_18', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_34(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-34 (ImageNet): basic blocks (3, 4, 6, 4), MSA blocks (0, 1, 3, 2), window 7, 22.83M params. """
    model_args = dict(depth=34, msa_blocks=(0, 1, 3, 2))
    return _create_alternet('alternet_34', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_50(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-50 (ImageNet, paper Fig. D.5): bottlenecks (3, 4, 6, 4), MSA blocks (0, 1, 3, 2), 35.92M params. """
    model_args = dict(depth=50, msa_blocks=(0, 1, 3, 2))
    return _create_alternet('alternet_50', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_101(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-101 (ImageNet): bottlenecks (3, 4, 23, 4), MSA blocks (0, 1, 3, 2), 54.91M params. """
    model_args = dict(depth=101, msa_blocks=(0, 1, 3, 2))
    return _create_alternet('alternet_101', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_152(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-152 (ImageNet): bottlenecks (3, 8, 36, 4), MSA blocks (0, 1, 3, 2), 70.55M params. """
    model_args = dict(depth=152, msa_blocks=(0, 1, 3, 2))
    return _create_alternet('alternet_152', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_18_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-18 for 32 px CIFAR: 3x3 stem, window 4, MSA blocks (0, 1, 1, 1). """
    model_args = dict(depth=18, msa_blocks=(0, 1, 1, 1), **_CIFAR)
    return _create_alternet('alternet_18_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_34_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-34 for 32 px CIFAR: 3x3 stem, window 4, the paper's CIFAR MSA layout (0, 1, 1, 2). """
    model_args = dict(depth=34, msa_blocks=(0, 1, 1, 2), **_CIFAR)
    return _create_alternet('alternet_34_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_50_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Alter-ResNet-50 for CIFAR-100 (paper Fig. 11): MSA blocks (0, 1, 1, 2), window 4, 33.01M params. """
    model_args = dict(depth=50, msa_blocks=(0, 1, 1, 2), **_CIFAR)
    return _create_alternet('alternet_50_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_101_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-101 for 32 px CIFAR: 3x3 stem, window 4, the paper's CIFAR MSA layout (0, 1, 1, 2). """
    model_args = dict(depth=101, msa_blocks=(0, 1, 1, 2), **_CIFAR)
    return _create_alternet('alternet_101_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_152_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ AlterNet-152 for 32 px CIFAR: 3x3 stem, window 4, the paper's CIFAR MSA layout (0, 1, 1, 2). """
    model_args = dict(depth=152, msa_blocks=(0, 1, 1, 2), **_CIFAR)
    return _create_alternet('alternet_152_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_18_nomsa(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-18 baseline of AlterNet-18 (no MSA, BatchNorm), ImageNet. """
    model_args = dict(depth=18, **_NO_MSA)
    return _create_alternet('alternet_18_nomsa', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_34_nomsa(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-34 baseline, blocks (3, 4, 6, 4), no MSA, ImageNet. """
    model_args = dict(depth=34, **_NO_MSA)
    return _create_alternet('alternet_34_nomsa', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_50_nomsa(pretrained: bool = False, **kwargs) -> AlterNet:
    """ The paper's modified pre-activation ResNet-50 (3, 4, 6, 4), no MSA, ImageNet: 30.01M params. """
    model_args = dict(depth=50, **_NO_MSA)
    return _create_alternet('alternet_50_nomsa', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_101_nomsa(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-101 baseline, blocks (3, 4, 23, 4), no MSA, ImageNet. """
    model_args = dict(depth=101, **_NO_MSA)
    return _create_alternet('alternet_101_nomsa', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_152_nomsa(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-152 baseline, blocks (3, 8, 36, 4), no MSA, ImageNet. """
    model_args = dict(depth=152, **_NO_MSA)
    return _create_alternet('alternet_152_nomsa', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_18_nomsa_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-18 baseline for 32 px CIFAR (3x3 stem, no MSA). """
    model_args = dict(depth=18, **_NO_MSA, **_CIFAR)
    return _create_alternet('alternet_18_nomsa_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_34_nomsa_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-34 (3, 4, 6, 4) baseline for 32 px CIFAR (3x3 stem, no MSA). """
    model_args = dict(depth=34, **_NO_MSA, **_CIFAR)
    return _create_alternet('alternet_34_nomsa_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_50_nomsa_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ The paper's modified pre-activation ResNet-50 (3, 4, 6, 4) for CIFAR-100: 28.16M params. """
    model_args = dict(depth=50, **_NO_MSA, **_CIFAR)
    return _create_alternet('alternet_50_nomsa_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_101_nomsa_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-101 (3, 4, 23, 4) baseline for 32 px CIFAR (3x3 stem, no MSA). """
    model_args = dict(depth=101, **_NO_MSA, **_CIFAR)
    return _create_alternet('alternet_101_nomsa_cifar', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def alternet_152_nomsa_cifar(pretrained: bool = False, **kwargs) -> AlterNet:
    """ Pre-activation ResNet-152 (3, 8, 36, 4) baseline for 32 px CIFAR (3x3 stem, no MSA). """
    model_args = dict(depth=152, **_NO_MSA, **_CIFAR)
    return _create_alternet('alternet_152_nomsa_cifar', pretrained=pretrained, **dict(model_args, **kwargs))
