"""The official how-do-vits-work AlterNet, loaded from a checkout, for timing ours against it with the same weights.

``bench_alternet.py --official PATH`` and ``gpu_report.py --official PATH`` both build the official model,
give its BatchNorms non-trivial statistics, load the converted weights into ours and check that both give the
same outputs before timing them. Nothing of the official code is copied into timm-ext.
"""
import importlib
import sys
import types
from functools import partial
from pathlib import Path
from typing import Tuple

import torch
import torch.nn as nn

__all__ = ['check_same_outputs', 'official_model', 'randomize_norms']


def _import_official(path: Path) -> Tuple[types.ModuleType, types.ModuleType]:
    """models.alternet and models.preresnet_dnn_block of the official checkout, without running its
    models/__init__.py (that one imports the whole zoo, requests and tqdm)."""
    if not (path / 'models' / 'alternet.py').is_file():
        raise SystemExit(f'--official {path}: no models/alternet.py there (expected a how-do-vits-work checkout)')
    package = types.ModuleType('models')
    package.__path__ = [str(path / 'models')]
    sys.modules['models'] = package
    sys.path.insert(0, str(path))
    return importlib.import_module('models.alternet'), importlib.import_module('models.preresnet_dnn_block')


def official_model(path: Path, imagenet: bool) -> nn.Module:
    """The official AlterNet-50: ``dnn_50`` for ImageNet, or the paper's CIFAR-100 MSA layout (Fig. 11)."""
    alternet, preresnet = _import_official(path)
    if imagenet:
        return alternet.dnn_50(num_classes=1000, stem=True, window_size=7)
    return alternet.AlterNet(  # dnn_50 with the paper's CIFAR MSA layout (Fig. 11)
        preresnet.Bottleneck, alternet.AttentionBlockB, stem=partial(alternet.StemB, pool=False),
        num_blocks=(3, 4, 6, 4), num_blocks2=(0, 1, 1, 2), heads=(3, 6, 12, 24), num_classes=100, window_size=4)


def randomize_norms(model: nn.Module, seed: int = 0) -> None:
    """Non-trivial BatchNorm statistics and affines, so that the output check means something."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=gen))
                m.weight.copy_(1 + 0.1 * torch.randn(m.num_features, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.num_features, generator=gen))


def check_same_outputs(official: nn.Module, ours: nn.Module, x: torch.Tensor) -> float:
    """Max |difference| of the logits, eval and train mode (BatchNorm on batch statistics); raises if not close."""
    worst = 0.
    for training in (False, True):
        official.train(training)
        ours.train(training)
        with torch.no_grad():
            a, b = official(x), ours(x)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        worst = max(worst, (a - b).abs().max().item())
    return worst
