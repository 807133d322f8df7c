""" Pooling-based Vision Transformer (PiT) with Context Broadcasting

Paper: 'Scratching Visual Transformer's Back with Uniform Attention' (Hyeon-Woo et al., ICCV 2023),
https://arxiv.org/abs/2210.08457, Table 11: CB at the MLP of PiT-B (73.8M params, 82.0 -> 82.6).

timm's ``PoolingVisionTransformer`` with CB at the end of the MLP branch. What is ours: the paper
does not say which PiT blocks get CB; ``pit_b_cb`` puts it in every block of all three stages
(13 blocks, indices counted across stages); ``cb_layers=`` overrides. The mean covers the class
token(s) too, as in the ViT models. timm's PiT has neither gradient checkpointing nor a
``group_matcher``; the subclass adds both so PiT-CB trains like timm's other models.
"""
from typing import Any, Dict, Optional, Set

import torch
import torch.nn as nn
from timm.models import checkpoint_seq, generate_default_cfgs, register_model
from timm.models.pit import PoolingVisionTransformer
from timm.models.pit import checkpoint_filter_fn as _pit_checkpoint_filter_fn

from timm_ext.layers.context_broadcast import check_cb_init
from timm_ext.models._builder import build_timm_ext_model
from timm_ext.models._cfgs import model_cfg
from timm_ext.models._head import head_like_model
from timm_ext.models.cb_retrofit import (
    CBLayers,
    add_context_broadcast,
    cb_scale_names,
    fill_missing_cb_scales,
    resolve_cb_layers,
)

__all__ = ['PoolingVisionTransformerCB']  # model_registry will add each entrypoint fn to this


class _CheckpointableBlocks(nn.Sequential):
    """The blocks of one PiT stage, re-computed in backward when ``grad_checkpointing`` is on."""

    def __init__(self, *blocks: nn.Module) -> None:
        super().__init__(*blocks)
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self, x)
        for block in self:  # nn.Sequential's loop (TorchScript cannot call super().forward)
            x = block(x)
        return x


class PoolingVisionTransformerCB(PoolingVisionTransformer):
    """ timm PiT with Context Broadcasting at the end of the MLP of ``cb_layers`` (see VisionTransformerCB). """

    def __init__(
            self,
            *args,
            cb_layers: CBLayers = 'all',
            cb_scaled: bool = False,
            cb_init: Optional[float] = None,
            cb_patch_mean: bool = False,
            **kwargs,
    ) -> None:
        check_cb_init(cb_init, cb_scaled)
        super().__init__(*args, **kwargs)
        for stage in self.transformers:
            stage.blocks = _CheckpointableBlocks(*stage.blocks)
        num_blocks = sum(len(stage.blocks) for stage in self.transformers)
        self.cb_layers = resolve_cb_layers(cb_layers, num_blocks)
        add_context_broadcast(
            self, layers=self.cb_layers, scaled=cb_scaled, init_value=cb_init, patch_mean=cb_patch_mean)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(
            stem=r'^cls_token|pos_embed|patch_embed',
            blocks=[(r'^transformers\.(\d+)', None)] if coarse else [
                (r'^transformers\.(\d+)\.pool', (-1,)),
                (r'^transformers\.(\d+)\.blocks\.(\d+)', None),
                (r'^norm', (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.transformers:
            stage.blocks.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        with head_like_model(self):  # timm < 1.0.29 builds the new head on torch's defaults
            super().reset_classifier(num_classes, global_pool)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """timm's PiT set plus the CB_S scales (1-D, so timm's factory already skips them; named for clarity)."""
        return set(super().no_weight_decay()) | cb_scale_names(self)


def checkpoint_filter_fn(
        state_dict: Dict[str, torch.Tensor],
        model: PoolingVisionTransformer,
) -> Dict[str, torch.Tensor]:
    """timm's PiT filter (original-repo layout), then CB_S scales a base PiT lacks."""
    return fill_missing_cb_scales(_pit_checkpoint_filter_fn(state_dict, model), model)


def _create_pit_cb(variant: str, pretrained: bool = False, **kwargs) -> PoolingVisionTransformerCB:
    out_indices = kwargs.pop('out_indices', (0, 1, 2))
    return build_timm_ext_model(
        PoolingVisionTransformerCB,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(feature_cls='hook', out_indices=out_indices),
        **kwargs,
    )


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return model_cfg('context-broadcasting', 'patch_embed.conv', url, **kwargs)


default_cfgs = generate_default_cfgs({
    'pit_b_cb': _cfg(),
})


@register_model
def pit_b_cb(pretrained: bool = False, **kwargs) -> PoolingVisionTransformerCB:
    """ PiT-B (73.8M params) with CB in every block. """
    model_args = dict(
        patch_size=14, stride=7, base_dims=[64, 64, 64], depth=[3, 6, 4], heads=[4, 8, 16], mlp_ratio=4,
        cb_layers='all')
    return _create_pit_cb('pit_b_cb', pretrained=pretrained, **dict(model_args, **kwargs))
