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
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import timm
import torch
from timm.models import model_entrypoint
from torch.utils.flop_counter import FlopCounterMode

import timm_ext.models  # noqa: F401  (registers the models)
from timm_ext.papers import PAPERS, Paper

__all__ = ['FAMILIES', 'ModelInfo', 'list_timm_ext_models', 'model_info', 'models_table_text', 'write_models_table']


@dataclass(frozen=True)
class Family:
    name: str
    slug: Optional[str] = None  # the paper's key in timm_ext.papers.PAPERS

    @property
    def source(self) -> Optional[Paper]:
        return PAPERS[self.slug] if self.slug else None

    @property
    def paper(self) -> str:
        """``Park & Kim, How Do Vision Transformers Work?, ICLR 2022`` ('' without a paper)."""
        return self.source.cite if self.source else ''

    @property
    def cite(self) -> str:
        """``Hyeon-Woo et al., ICCV 2023``: the authors and venue of ``paper``."""
        return self.source.short_cite if self.source else ''

    @property
    def arxiv(self) -> str:
        return self.source.arxiv if self.source else ''


_CB = Family('Context Broadcasting', 'context-broadcasting')
_STEM = Family('Scaled-ReLU conv stem', 'scaled-relu')
_ALTERNET = Family('AlterNet', 'how-do-vits-work')
_VIT_SAM = Family('ViT-SAM Mixer /8', 'vit-sam')
_HDVW = Family('how-do-vits-work baselines', 'how-do-vits-work')

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
    family = FAMILIES.get(module, Family(module.rsplit('.', 1)[-1]))
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
        cite=family.cite,
        arxiv=family.arxiv,
    )


def models_table_text() -> str:
    """``timm_ext/_data/models.tsv`` as measured now: every model's :class:`ModelInfo`, one row each. The
    command line reads the file (``timm-ext models`` answers without torch); ``tests/test_catalog.py`` checks
    that it is this text."""
    from timm_ext_cli.commands import MODEL_FIELDS

    lines = ['\t'.join(MODEL_FIELDS)]
    for name in list_timm_ext_models():
        info = model_info(name).as_dict()
        info['input_size'] = 'x'.join(map(str, info['input_size']))
        info['gmacs'] = repr(info['gmacs'])
        lines.append('\t'.join(str(info[field]) for field in MODEL_FIELDS))
    return '\n'.join(lines) + '\n'


def write_models_table() -> Path:
    """Write :func:`models_table_text` to ``timm_ext/_data/models.tsv`` (after adding or changing a model)."""
    from timm_ext_cli.commands import MODELS_TABLE, package_dir

    path = package_dir() / MODELS_TABLE
    path.write_text(models_table_text())
    return path
