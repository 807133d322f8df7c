"""Earlier verdicts of the reproduction study, for the report's comparison columns.

v1 lives in ``plan.V1_VERDICTS`` (it was written there before v2's runs). v2 (30 epochs for
every arm, 5 seeds) is recorded here rather than in the plan, so that the plan's last commit stays
the one that fixed revision 2.1 before its runs.
"""
from typing import Dict

V2_VERDICTS: Dict[str, str] = {
    'sam_vit_top1': 'inconclusive', 'sam_resnet_top1': 'reproduced', 'sam_vit_gain_larger': 'inconclusive',
    'sam_gain_half': 'inconclusive', 'sam_gain_quarter': 'inconclusive', 'sam_lambda_max': 'reproduced',
    'sam_noisy_loss': 'reproduced', 'sam_active_neurons': 'inconclusive', 'stem_lr_1e-3': 'reproduced',
    'stem_lr_3e-3': 'reproduced', 'stem_early': 'reproduced', 'stem_tokens': 'the opposite',
    'cb_entropy_cls': 'inconclusive', 'cb_entropy_all': 'inconclusive', 'cb_distance': 'reproduced',
    'cb_top1': 'inconclusive', 'msa_variance': 'the opposite', 'msa_lowpass': 'reproduced',
    'hessian_vit_nep': 'reproduced', 'hessian_vit_ape': 'the opposite', 'hessian_small_data_nep': 'inconclusive',
    'alternet_ape': 'the opposite',
}
