"""The pretrained cfg every timm-ext model starts from, so each model module states only what differs."""
from typing import Any, Dict

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from timm_ext.papers import paper_cfg

__all__ = ['model_cfg']


def model_cfg(paper: str, first_conv: str, url: str = '', **overrides: Any) -> Dict[str, Any]:
    """timm's ViT-style ImageNet-1k cfg (224 px, crop 0.9, bicubic, fixed input size, ImageNet mean/std,
    classifier ``head``, Apache-2.0) citing ``paper`` (a key of :data:`timm_ext.papers.PAPERS`);
    ``overrides`` replace any entry."""
    return {
        'url': url,
        'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None,
        'crop_pct': .9, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': first_conv, 'classifier': 'head',
        'license': 'apache-2.0', **paper_cfg(paper),
        **overrides,
    }
