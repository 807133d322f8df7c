"""What timm-ext registers with timm: every model with its family, size, cost and paper.

Parameters and MACs are measured, not copied: each model is built on the ``meta`` device (shapes
only, no memory, no weights) and run once at its native input size (``pretrained_cfg['input_size']``)
under ``torch.utils.flop_counter.FlopCounterMode``. MACs count matrix multiplies and convolutions,
attention's QK^T and AV included (on ``meta`` scaled-dot-product attention runs as explicit batched
matmuls; the fused CPU kernel would go uncounted); norms, activations and softmax are left out, as in
fvcore and the papers' tables.
"""
import fnmatch
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import timm
import torch
from timm.models import model_entrypoint
from torch.utils.flop_counter import FlopCounterMode

import timm_ext  # noqa: F401  (registers the models)

__all__ = ['FAMILIES', 'ModelInfo', 'list_timm_ext_models', 'model_info']


@dataclass(frozen=True)
class Family:
    name: str
    paper: str
    arxiv: str

    @property
    def cite(self) -> str:
        """``Hyeon-Woo et al., ICCV 2023``: the authors and venue of ``paper``."""
        authors, *_, venue = self.paper.split(', ')
        return f'{authors}, {venue}'


_CB = Family('Context Broadcasting', 'Hyeon-Woo et al., Scratching Visual Transformer\'s Back with Uniform '
             'Attention, ICCV 2023', '2210.08457')
_STEM = Family('Scaled-ReLU conv stem', 'Wang et al., Scaled ReLU Matters for Training Vision Transformers, '
               'AAAI 2022', '2109.03810')
_ALTERNET = Family('AlterNet', 'Park & Kim, How Do Vision Transformers Work?, ICLR 2022', '2202.06709')
_VIT_SAM = Family('ViT-SAM Mixer /8', 'Chen et al., When Vision Transformers Outperform ResNets without Pretraining '
                   'or Strong Data Augmentations, ICLR 2022', '2106.01548')
_HDVW = Family('how-do-vits-work baselines', 'Park & Kim, How Do Vision Transformers Work?, ICLR 2022', '2202.06709')

# the module that registers a model -> its family (a new family module must be added here; a test checks it)
FAMILIES: Dict[str, Family] = {
    'timm_ext.models.vision_transformer_cb': _CB,
    'timm_ext.models.mlp_mixer_cb': _CB,
    'timm_ext.models.pit_cb': _CB,
    'timm_ext.models.vision_transformer_convstem': _STEM,
    'timm_ext.models.volo_convstem': _STEM,
    'timm_ext.models.alternet': _ALTERNET,
    'timm_ext.models.hdvw_baselines': _HDVW,
    'timm_ext.models.mlp_mixer_p8': _VIT_SAM,
}


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    params: int
    gmacs: float
    input_size: Tuple[int, int, int]
    num_classes: int
    paper: str
    cite: str
    arxiv: str

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def list_timm_ext_models(pattern: Optional[str] = None) -> List[str]:
    """Names of the models timm-ext registers (sorted as timm sorts), optionally filtered by a wildcard."""
    names = [n for n in timm.list_models() if model_entrypoint(n).__module__.startswith('timm_ext.')]
    if pattern:
        names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    return names


def model_info(name: str) -> ModelInfo:
    """Family, exact parameter count, GMACs of one image at the native size, and the paper of ``name``."""
    module = model_entrypoint(name).__module__
    family = FAMILIES.get(module, Family(module.rsplit('.', 1)[-1], '', ''))
    with torch.device('meta'):
        model = timm.create_model(name, pretrained=False)
    # no parameter needs a gradient: FlopCounterMode's module tracker hooks every tensor that does,
    # and PiT's forward passes parameters through tuples where no_grad leaves them without a grad_fn
    model.requires_grad_(False)
    input_size = tuple(model.pretrained_cfg['input_size'])
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.eval()(torch.empty((1,) + input_size, device='meta'))
    return ModelInfo(
        name=name,
        family=family.name,
        params=sum(p.numel() for p in model.parameters()),
        gmacs=counter.get_total_flops() / 2e9,
        input_size=input_size,
        num_classes=model.num_classes,
        paper=family.paper,
        cite=family.cite if family.paper else '',
        arxiv=family.arxiv,
    )
