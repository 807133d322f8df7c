"""reproduction/claims.py: each claim a paired difference over the seeds, with the pre-registered verdict."""
import math

import pytest
from _reproduction import claims, fake_runs, plan, run_results

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def test_claims_are_paired_differences_with_the_preregistered_verdicts(tmp_path):
    r = run_results.load_results(fake_runs(tmp_path / 'runs'), plan.ARMS, [0, 1, 2])
    found = {c.claim.key: c for c in claims.read(r, plan.CLAIMS)}
    assert len(found) == len(plan.CLAIMS)
    top1 = found['sam_vit_top1']  # +2 points in every seed: interval [2, 2] > margin 1
    assert top1.diff.diffs == (2.0, 2.0, 2.0) and top1.label == 'reproduced' and top1.agree == 3
    assert found['sam_vit_gain_larger'].diff.diffs == (0.0, 0.0, 0.0)  # same gain for both architectures
    assert found['sam_vit_gain_larger'].label == 'not reproduced'  # [0, 0] lies inside +-1 point
    lam = found['sam_lambda_max']
    assert lam.diff.diffs == pytest.approx([math.log((20 + s) / (40 + s)) for s in range(3)])
    assert lam.label == 'reproduced'
    assert found['msa_variance'].diff.diffs == pytest.approx([math.log(0.75)] * 3)  # the MSA block only
    assert found['msa_variance'].label == 'reproduced'
    assert found['msa_lowpass'].diff.diffs == pytest.approx([-0.4] * 3)
    assert found['hessian_vit_nep'].diff.diffs == pytest.approx([0.2] * 3)
    assert found['cb_entropy_all'].diff.diffs == pytest.approx([-0.1] * 3)  # -0.2 in layer 3, mean of layers 3-4
    assert found['cb_distance'].label == 'reproduced'  # unchanged: [0, 0] inside +-0.02
    assert found['cb_top1'].label == 'not reproduced'


def test_unchanged_verdict_branches():
    from timm_ext.analysis.stats import paired_difference

    inside = paired_difference([0.0, 0.0, 0.0], [0.001, -0.001, 0.0])
    beyond = paired_difference([0.0, 0.0, 0.0], [0.5, 0.6, 0.55])
    wide = paired_difference([0.0, 0.0, 0.0], [0.5, -0.6, 0.05])
    assert claims.unchanged_verdict(inside, 0.02) == ('reproduced', 3)
    assert claims.unchanged_verdict(beyond, 0.02) == ('not reproduced', 0)
    assert claims.unchanged_verdict(wide, 0.02) == ('inconclusive', 0)


def test_extended_claims_are_read_at_exactly_their_fixed_seeds(tmp_path):
    seeds = range(18)
    r = run_results.load_results(fake_runs(tmp_path / 'runs', seeds=seeds), plan.ARMS, list(seeds))
    found = {c.claim.key: c for c in claims.read_revision(plan.PLAN_BY_NAME['3'], r)}
    assert {k: c.n for k, c in found.items()} == plan.EXTENDED_SEEDS  # the 18 seeds there are not all read
    assert found['sam_vit_top1'].diff.diffs == (2.0,) * 16 and found['sam_vit_top1'].label == 'reproduced'
    short = {a: ms[:13] if a == 'resnet' else ms for a, ms in r.items()}
    with pytest.raises(ValueError, match=r'claim sam_vit_gain_larger is read at seeds 0-13 \(plan revision 3\) but '
                                         r'these arms have others: resnet \(\[0, 1, .*, 12\]\); train them first'):
        claims.read_revision(plan.PLAN_BY_NAME['3'], short)
    assert claims.read_revision(plan.PLAN_BY_NAME['3'], {'vit_cb': r['vit_cb']}) == []  # a study without its arms


def test_each_claim_keeps_the_label_the_rule_before_revision_4_gave(tmp_path):
    r = run_results.load_results(fake_runs(tmp_path / 'runs'), plan.ARMS, [0, 1, 2])
    for m, gain in zip(r['vit_sam'], (0.3, 0.4, 0.5)):  # SAM above AdamW by 0.3-0.5 points: inside the 1-pt margin
        m['top1'] = r['vit'][m['seed']]['top1'] + gain
    top1 = next(c for c in claims.read(r, plan.CLAIMS) if c.claim.key == 'sam_vit_top1')
    assert (top1.label, top1.before_revision_4) == ('smaller than claimed', 'reproduced')
    assert top1.verdict_text() == '**smaller than claimed** (by the rule before revision 4: reproduced)'
    lam = next(c for c in claims.read(r, plan.CLAIMS) if c.claim.key == 'sam_lambda_max')
    assert lam.old_label == '' and lam.verdict_text() == '**reproduced**'  # the same under both rules


def test_revision_4_reads_the_pair_at_exactly_its_16_seeds(tmp_path):
    from _reproduction import longer_schedules
    runs = tmp_path / 'runs'
    from _reproduction import write_run
    for arm in longer_schedules.LONG_ARMS:
        for seed in plan.LONG_SEEDS:
            write_run(runs, arm, seed)
    r = run_results.load_results(runs, longer_schedules.LONG_ARMS, list(plan.LONG_SEEDS))
    (long,) = claims.read_revision(plan.PLAN_BY_NAME['4'], r)
    assert long.claim is plan.LONG_CLAIM and long.n == 16 and long.diff.diffs == (2.0,) * 16
    assert claims.read_revision(plan.PLAN_BY_NAME['4'], {}) == []  # a study from before revision 4
    with pytest.raises(ValueError, match=r'^claim sam_vit_top1_120 is read at seeds 0-15 \(plan revision 4\) but '
                                         r'these arms have others: vit_x2 \(\[0, 1'):
        claims.read_revision(plan.PLAN_BY_NAME['4'], {a: ms[:15] for a, ms in r.items()})
