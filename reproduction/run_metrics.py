"""The per-run quantities the claims compare (top-1, lambda_max, entropy in the CB layers, ...), by name.

Shared by the claims (:mod:`claims`), the report's tables and the paragraphs on failed claims
(:mod:`why_failed`), so each quantity is computed the same way wherever it is read.
"""
import math
import statistics
from typing import Any, Callable, Dict, List, Sequence

from run_results import Results


def deep_layers(r: Results) -> List[int]:
    """The CB layers of ``vit_cb`` (0-based): where the CB paper reads the entropy and distance."""
    layers = r['vit_cb'][0].get('cb_layers') if 'vit_cb' in r else None
    return list(layers) if layers else [len(r['vit'][0]['entropy']) - 1]


def mean_over(values: Sequence[float], idx: Sequence[int]) -> float:
    return statistics.fmean(values[i] for i in idx)


def _msa_mean(m: Dict[str, Any], fn: Callable[[Dict[str, Any], str], float]) -> float:
    blocks = [n for n, k in m['kinds'].items() if k == 'msa' and n in m['variance_ratio']]
    return statistics.fmean(fn(m, b) for b in blocks)


def delta_pi(m: Dict[str, Any], block: str) -> float:
    names = list(m['fourier_at_pi'])
    prev = names[names.index(block) - 1]
    return m['fourier_at_pi'][block] - m['fourier_at_pi'][prev]


def early_epoch(m: Dict[str, Any]) -> int:
    """The epoch (1-based) at 1/10 of the run: the scaled-ReLU paper's epoch 5 of 300 is earlier still."""
    return max(1, int(round(len(m['top1_curve']) / 10)))


def metric_fn(name: str, r: Results) -> Callable[[Dict[str, Any]], float]:
    """The per-run quantity ``name`` of a claim."""
    deep = deep_layers(r) if 'vit' in r else []
    fns: Dict[str, Callable[[Dict[str, Any]], float]] = {
        'top1': lambda m: m['top1'],
        'top1_early': lambda m: m['top1_curve'][early_epoch(m) - 1],
        'log_lambda_max': lambda m: math.log(m['lambda_max']),
        'noisy_loss': lambda m: m['noisy_loss'],
        'active_first': lambda m: next(iter(m['activity'].values())),
        'token_similarity_stem': lambda m: m['tokens']['patch_embed'],
        'entropy_cls_deep': lambda m: mean_over(m['cls_entropy'], deep),
        'entropy_all_deep': lambda m: mean_over(m['entropy'], deep),
        'distance_deep': lambda m: mean_over(m['distance'], deep),
        'msa_log_variance_ratio': lambda m: _msa_mean(m, lambda mm, b: math.log(mm['variance_ratio'][b])),
        'msa_delta_pi': lambda m: _msa_mean(m, delta_pi),
        'nep': lambda m: m['nep'],
        'log_ape': lambda m: math.log(m['ape']),
    }
    return fns[name]
