"""Lesion study: remove one unit of a trained model at test time, measure the accuracy (how-do-vits-work Fig. 10b).

After Bhojanapalli et al. (2021), as how-do-vits-work does it: a residual unit is removed by letting
its residual connection carry the input alone. In a timm ViT the units are each block's MSA
(``blocks.i.attn``) and MLP (``blocks.i.mlp``), removed by zeroing their branch output; in a staged
model (AlterNet, ResNetV2) each block whose output has its input's shape is replaced by the identity.
"""
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from timm_ext.analysis._hooks import as_batches, eval_mode, hooks, model_device

__all__ = ['lesion_study', 'lesion_units', 'top1_accuracy']


def lesion_units(model: nn.Module, example: torch.Tensor) -> List[Tuple[str, str]]:
    """``(module name, 'zero' | 'identity')`` of the units that can be removed; ``example``: one input batch."""
    blocks = getattr(model, 'blocks', None)
    if isinstance(blocks, nn.Sequential) and all(hasattr(b, 'attn') and hasattr(b, 'mlp') for b in blocks):
        return [(f'blocks.{i}.{part}', 'zero') for i in range(len(blocks)) for part in ('attn', 'mlp')]
    candidates = [(n, m) for n, m in model.named_modules() if n.count('.') == 3 and n.startswith('stages.')
                  and n.split('.')[2] == 'blocks']
    if not candidates:
        candidates = [(n, m) for n, m in model.named_modules() if n.startswith('blocks.') and n.count('.') == 1]
    same_shape = {}
    with eval_mode(model), hooks() as handles, torch.no_grad():
        for name, m in candidates:
            handles.append(m.register_forward_hook(
                lambda mod, args, out, n=name: same_shape.__setitem__(n, args[0].shape == out.shape)))
        model(example[:1].to(model_device(model)))
    units = [(n, 'identity') for n, _ in candidates if same_shape.get(n)]
    if not units:
        raise ValueError(f'{type(model).__name__} has no removable unit (ViT blocks, stages.N.blocks.M, blocks.N)')
    return units


def top1_accuracy(model: nn.Module, batches) -> float:
    """Top-1 accuracy (%) of ``model`` over ``(images, labels)`` batches, on the model's device."""
    device = model_device(model)
    correct, count = 0, 0
    with torch.no_grad():
        for x, y in batches:
            pred = model(x.to(device)).argmax(dim=-1)
            correct += int((pred == y.to(device)).sum())
            count += y.shape[0]
    return 100.0 * correct / count


def lesion_study(
        model: nn.Module,
        batches: Any,
        units: Optional[Sequence[Tuple[str, str]]] = None,
        progress: Optional[Any] = None,
) -> Dict[str, Any]:
    """Top-1 (%) of the intact model and with each unit removed: ``{'baseline', 'accuracy': {unit: top1}}``."""
    batches = as_batches(batches)
    units = list(units) if units is not None else lesion_units(model, batches[0][0])
    named = dict(model.named_modules())
    result: Dict[str, float] = OrderedDict()
    with eval_mode(model):
        baseline = top1_accuracy(model, batches)
        for name, how in units:
            if name not in named or how not in ('zero', 'identity'):
                raise ValueError(f"bad lesion unit {(name, how)!r}: a module name and 'zero' or 'identity'")
            fn = (lambda mod, args, out: torch.zeros_like(out)) if how == 'zero' else \
                (lambda mod, args, out: args[0])
            with hooks() as handles:
                handles.append(named[name].register_forward_hook(fn))
                result[name] = top1_accuracy(model, batches)
            if progress is not None:
                progress(1)
    return dict(baseline=baseline, accuracy=result)
