"""reproduction/convergence_text.py: "converged" only as the rule's label, every run that misses it named."""

import pytest
from _reproduction import convergence_text as ct

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def _run(arm, seed, tail_gain, epochs=10, top1=90.0):
    curve = [80.0] * (epochs - 2) + [80.0 + tail_gain, 80.0]  # the last 20 % of 10 epochs: the last 2
    return dict(arm=arm, seed=seed, top1=top1, top1_curve=curve, converged=tail_gain <= 0.6)


def test_cells_and_counts_name_every_run_that_misses_the_rule():
    runs = [_run('vit_cb_e30', 0, 0.0), _run('vit_cb_e30', 2, 0.84), _run('vit_cb_e30', 4, 1.39)]
    assert ct.converged_cell(runs) == '1/3 (seed 2 +0.8, seed 4 +1.4)'
    assert ct.missed(runs) == ['vit_cb_e30 seed 2 (+0.8)', 'vit_cb_e30 seed 4 (+1.4)']
    assert ct.rule_count(runs) == '1 of 3 (missing it: vit_cb_e30 seed 2 (+0.8), vit_cb_e30 seed 4 (+1.4))'
    warmup = [dict(arm='vit_warmup', seed=0, top1=20.0, top1_curve=[20.0], converged=False)]
    assert ct.converged_cell(warmup) == 'end of warmup (rule n/a)' and ct.judged(warmup) == []
    assert ct.rule_count(runs + warmup) == ct.rule_count(runs)  # a 1-epoch checkpoint is not judged


def test_doubling_text_says_not_converged_where_twice_the_schedule_still_gains():
    short = [_run('vit_sam', s, 0.0, top1=97.0) for s in range(4)]
    long = [_run('vit_sam_x2', s, 0.0, epochs=20, top1=97.8 + 0.1 * s) for s in range(4)]
    flat_short = [_run('vit_convstem_e30', 0, 0.84, top1=98.0)] + [_run('vit_convstem_e30', s, 0.0, top1=98.0)
                                                                   for s in (1, 2)]
    flat_long = [_run('vit_convstem', s, 0.0, epochs=20, top1=98.0 + 0.01 * s) for s in range(3)]
    text = ct.doubling_text([('ViT + SAM', short, long), ('ViT conv stem', flat_short, flat_long)])
    assert 'ViT + SAM 10 -> 20 epochs +0.95 pt' in text and '(4 seeds)' in text
    assert ('By that test these had not converged, the rule notwithstanding: ViT + SAM at 10 epochs (4 of 4 runs meet '
            'the rule there): "converged" in this report means "meets the rule"') in text
    # less than a point from doubling, but the run still improving at the shorter schedule is named
    assert ('Doubling gained less than 1 point (the whole interval) for ViT conv stem from 10 epochs (though '
            'vit_convstem_e30 seed 0 (+0.8) misses the rule).') in text
    assert 'already enough' not in text
    assert ct.doubling_text([]) == ''
