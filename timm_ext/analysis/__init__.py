"""The papers' diagnostics on any timm model: attention, tokens, Hessian, Fourier, landscapes, CKA, lesions.

One module per idea, each citing the figure it reproduces; the functions need only torch and timm
(plots: :mod:`timm_ext.analysis.plots`, matplotlib). Every function leaves the model as it found it:
mode, hooks, timm's ``fused_attn`` flags and the weights.
"""
from timm_ext.analysis._hooks import feature_points, math_attention
from timm_ext.analysis.activity import active_neuron_fraction
from timm_ext.analysis.attention import attention_distance, attention_entropy, attention_stats
from timm_ext.analysis.cka import cka, cka_matrix
from timm_ext.analysis.fourier import delta_log_amplitude, feature_variance_per_block, fourier_per_block
from timm_ext.analysis.hessian import (
    hessian_lambda_max,
    hessian_max_eigenvalue_spectrum,
    hessian_spectrum_density,
    hessian_top_eigenvalues,
    hessian_trace,
    nep_ape,
    noisy_loss,
)
from timm_ext.analysis.landscape import filter_normalized_direction, loss_landscape_1d, loss_landscape_2d
from timm_ext.analysis.lesion import lesion_study
from timm_ext.analysis.stats import (
    VERDICT_RULE,
    VERDICTS,
    PairedDifference,
    Verdict,
    format_difference,
    paired_difference,
    t_quantile,
    verdict,
)
from timm_ext.analysis.tokens import token_cosine_similarity

__all__ = [
    'active_neuron_fraction', 'attention_distance', 'attention_entropy', 'attention_stats', 'cka', 'cka_matrix',
    'delta_log_amplitude', 'feature_variance_per_block', 'filter_normalized_direction', 'fourier_per_block',
    'hessian_lambda_max', 'hessian_max_eigenvalue_spectrum', 'hessian_spectrum_density', 'hessian_top_eigenvalues',
    'hessian_trace', 'feature_points', 'lesion_study', 'loss_landscape_1d', 'loss_landscape_2d', 'math_attention',
    'nep_ape', 'noisy_loss', 'token_cosine_similarity',
    'VERDICTS', 'VERDICT_RULE', 'PairedDifference', 'Verdict', 'format_difference', 'paired_difference', 't_quantile',
    'verdict',
]
