""" Retrofit Context Broadcasting into an existing timm ViT, MLP-Mixer or PiT model, in place.

CB goes at the end of the MLP branch of the chosen blocks (the paper's "End" placement). For
plain CB no parameter or buffer is added, so ``state_dict`` keys stay those of the base model
and its pretrained timm weights load unchanged; CB_S adds one ``...cb.gamma`` vector per block.
"""
import logging
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import Mlp
from timm.models.mlp_mixer import MixerBlock, MlpMixer
from timm.models.pit import PoolingVisionTransformer
from timm.models.vision_transformer import Block, VisionTransformer

from timm_ext.layers import CBMlp
from timm_ext.layers.context_broadcast import check_cb_init

__all__ = [
    'add_context_broadcast', 'cb_scale_names', 'fill_missing_cb_scales', 'mlp_branches',
    'resolve_cb_layers', 'CBLayers',
]

_logger = logging.getLogger(__name__)

CBLayers = Union[str, Sequence[int], None]
_SUPPORTED = 'VisionTransformer (timm Block), MlpMixer (MixerBlock), PoolingVisionTransformer (PiT)'


def mlp_branches(model: nn.Module) -> List[Tuple[nn.Module, str]]:
    """(parent block, attribute name) of the MLP branch of every block, in depth order."""
    if isinstance(model, VisionTransformer):
        blocks, attr, block_type = list(model.blocks), 'mlp', Block
    elif isinstance(model, MlpMixer):
        blocks, attr, block_type = list(model.blocks), 'mlp_channels', MixerBlock
    elif isinstance(model, PoolingVisionTransformer):
        blocks = [blk for stage in model.transformers for blk in stage.blocks]
        attr, block_type = 'mlp', Block
    else:
        raise ValueError(f'Context Broadcasting cannot be added to a {type(model).__name__}; supported: {_SUPPORTED}.')
    for i, blk in enumerate(blocks):
        if not isinstance(blk, block_type) or not isinstance(getattr(blk, attr, None), Mlp):
            raise ValueError(
                f'Block {i} of this {type(model).__name__} is a {type(blk).__name__} whose MLP branch is not a '
                f'timm Mlp; Context Broadcasting supports {_SUPPORTED}.')
    return [(blk, attr) for blk in blocks]


def resolve_cb_layers(cb_layers: CBLayers, depth: int) -> Tuple[int, ...]:
    """Block indices from 'all' / None (every block), 'upper' (second half) or a list/tuple of block indices."""
    if cb_layers is None or (isinstance(cb_layers, str) and cb_layers == 'all'):
        return tuple(range(depth))
    if isinstance(cb_layers, str):
        if cb_layers == 'upper':
            return tuple(range(depth // 2, depth))
        raise ValueError(f"Unknown cb_layers {cb_layers!r}; use 'all', 'upper' or a list of block indices.")
    if not isinstance(cb_layers, (list, tuple, range)):
        raise ValueError(
            f"cb_layers must be 'all', 'upper' or a list of block indices (ints), got a {type(cb_layers).__name__}: "
            f'{cb_layers!r}.')
    layers = tuple(cb_layers)
    if not layers:
        raise ValueError(
            f'cb_layers {cb_layers!r} is empty: a CB model needs at least one CB block (indices 0..{depth - 1}); '
            f'use the timm base model for none.')
    not_int = [i for i in layers if isinstance(i, bool) or not isinstance(i, int)]
    if not_int:
        raise ValueError(f'cb_layers {not_int} are not block indices: use ints in 0..{depth - 1}.')
    bad = [i for i in layers if not 0 <= i < depth]
    if bad:
        raise ValueError(f'cb_layers {bad} outside the model depth: block indices must be in 0..{depth - 1}.')
    return tuple(sorted(set(layers)))


def add_context_broadcast(
        model: nn.Module,
        layers: CBLayers = 'all',
        scaled: bool = False,
        init_value: Optional[float] = None,
        patch_mean: bool = False,
) -> nn.Module:
    """Add CB (or CB_S with ``scaled=True``) at the end of the MLP branch of ``layers``, in place.

    Each chosen MLP is rebuilt as a ``CBMlp`` with the same weights, so create optimizers afterwards.

    Args:
        model: a timm VisionTransformer, MlpMixer or PoolingVisionTransformer (or a subclass).
        layers: 'all', 'upper' (the second half of the blocks) or block indices (PiT: counted over
            all stages).
        scaled: use CB_S (learnable per-channel Lambda) instead of CB.
        init_value: initial Lambda of CB_S (default 1.0); CB_S only.
        patch_mean: average only patch tokens, leaving out class/register/distillation tokens.

    Returns:
        The same model object, modified.
    """
    check_cb_init(init_value, scaled, 'init_value')
    branches = mlp_branches(model)
    chosen = resolve_cb_layers(layers, len(branches))
    num_prefix = getattr(model, 'num_prefix_tokens', getattr(model, 'num_tokens', 0)) if patch_mean else 0
    for i in chosen:
        parent, attr = branches[i]
        cb_mlp = CBMlp.from_mlp(
            getattr(parent, attr), cb_scaled=scaled, cb_init=init_value, cb_num_prefix_tokens=num_prefix)
        setattr(parent, attr, cb_mlp)
    return model


def cb_scale_names(model: nn.Module) -> Set[str]:
    """Parameter names of every CB_S Lambda in ``model`` (for ``no_weight_decay``)."""
    return {n for n, _ in model.named_parameters() if n.endswith('.cb.gamma')}


def fill_missing_cb_scales(state_dict: Dict[str, torch.Tensor], model: nn.Module) -> Dict[str, torch.Tensor]:
    """Give CB_S scales absent from a base-model checkpoint their init value, and say so.

    Lets timm weights of the base architecture (which have no ``cb.gamma``) load into a CB_S
    model with ``strict=True``; every key filled is logged, never silently.
    """
    missing = [k for k, v in model.state_dict().items() if k.endswith('.cb.gamma') and k not in state_dict]
    if missing:
        _logger.warning(
            f'{len(missing)} CB_S scale(s) not in the checkpoint keep their init value '
            f'({missing[0]}{", ..." if len(missing) > 1 else ""}).')
        state_dict = dict(state_dict)
        for k in missing:
            state_dict[k] = model.state_dict()[k].detach().clone()
    return state_dict
