"""What every timm-ext MLP-Mixer entrypoint shares: timm's Mixer pretrained cfg and its build call."""
from typing import Any, Callable, Dict, Optional, Type

import torch.nn as nn
from timm.models.mlp_mixer import MlpMixer

from timm_ext.models._builder import build_timm_ext_model
from timm_ext.models._cfgs import model_cfg
from timm_ext.models._head import head_like_model


def mixer_cfg(paper: str, url: str = '', **kwargs: Any) -> Dict[str, Any]:
    """timm's Mixer-S/B pretrained cfg (224 px, bicubic, mean/std 0.5) citing ``paper`` (a key of PAPERS)."""
    return model_cfg(paper, 'stem.proj', url, crop_pct=0.875, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), **kwargs)


def create_mixer(
        model_cls: Type[MlpMixer],
        variant: str,
        pretrained: bool,
        pretrained_filter_fn: Callable[..., Dict[str, Any]],
        **kwargs: Any,
) -> MlpMixer:
    """Build through timm's builder with Mixer's feature cfg (blocks read by getter, 4th by default)."""
    out_indices = kwargs.pop('out_indices', 3)
    return build_timm_ext_model(
        model_cls,
        variant,
        pretrained,
        pretrained_filter_fn=pretrained_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
        **kwargs,
    )


def reset_mixer_classifier(model: MlpMixer, num_classes: int, global_pool: Optional[str] = None) -> None:
    """``MlpMixer.reset_classifier`` on every timm release: the new ``head`` on the model's device and dtype (timm
    1.0.23 ... 1.0.28 read them from the old head, which raises once ``reset_classifier(0)`` made it an Identity)."""
    if global_pool is not None:
        if global_pool not in ('', 'avg'):
            raise ValueError(f'global_pool={global_pool!r}: a Mixer pools by averaging the tokens (\'avg\') or not '
                             f'at all (\'\')')
        model.global_pool = global_pool
    model.num_classes = num_classes
    with head_like_model(model):
        model.head = nn.Linear(model.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
