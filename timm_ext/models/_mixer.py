"""What every timm-ext MLP-Mixer entrypoint shares: timm's Mixer pretrained cfg and its build call."""
from typing import Any, Callable, Dict, Type

from timm.models.mlp_mixer import MlpMixer

from timm_ext.models._builder import build_timm_ext_model
from timm_ext.models._cfgs import model_cfg


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
