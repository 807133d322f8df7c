"""reproduction/plan.py: the pre-registered arms and claims agree with each other and with the supporting runs."""
import pytest
from _reproduction import plan, supporting_runs


def test_plan_arms_and_claims_are_consistent():
    names = {a.name for a in plan.ARMS}
    assert len(names) == len(plan.ARMS) == 13
    for claim in plan.CLAIMS:
        sides = [s for s in (claim.a, claim.b) if s is not None]
        for side in sides:
            for arm in (side if isinstance(side, tuple) else (side,)):
                assert arm in names, (claim.key, arm)
        assert claim.direction in ('increase', 'decrease', 'unchanged') and claim.margin > 0
    assert set(plan.V1_VERDICTS) <= {c.key for c in plan.CLAIMS}
    # arms that share an architecture differ only in what the comparison is about
    assert plan.ARM_BY_NAME['vit'].model == plan.ARM_BY_NAME['vit_sam'].model
    assert plan.ARM_BY_NAME['vit_quarter'].epochs == 4 * plan.VIT_EPOCHS == 240  # the same steps as the full data
    assert plan.ARM_BY_NAME['vit'].epochs == 60 and plan.ARM_BY_NAME['resnet'].epochs == plan.EPOCHS == 30
    # revision 2.1: the ETA's cost follows the schedule (a 60-epoch ViT costs two 30-epoch units, plus measuring)
    assert plan.ARM_BY_NAME['vit'].cost == pytest.approx(2.0 + 0.35)
    assert supporting_runs.ALL_ARMS_BY_NAME['vit_e30'].cost == pytest.approx(1.0 + 0.05)
    assert not {a.name for a in supporting_runs.SUPPORT_ARMS} & names  # an arm is a claim arm or a supporting run


# v3's 5-seed differences of the claims revision 3 extends (docs/reproduction/measurements.json before its runs)
V3_DIFFS = {
    'sam_vit_top1': [-0.27855153203343264, 1.39275604503068, 0.27854991689697783, 1.3927576601671205,
                     0.27855072446520523],
    'sam_active_neurons': [-0.07056382123161764, 0.004423253676470618, -0.117584228515625, -0.10006354836856618,
                           0.03399478687959556],
}


def test_revision_3_fixes_each_claims_seeds_within_reach_and_trains_only_their_arms():
    claims = {c.key: c for c in plan.CLAIMS}
    assert set(plan.EXTENDED_SEEDS) <= set(claims)
    assert all(len(plan.SEEDS) < n <= plan.REACH for n in plan.EXTENDED_SEEDS.values())
    # the claims on the ViT pair read its 16 seeds; the ResNet pair trains for the gain comparison's 14 only
    assert plan.extended_seeds('vit') == plan.extended_seeds('vit_sam') == tuple(range(5, 16))
    assert plan.extended_seeds('resnet') == plan.extended_seeds('resnet_sam') == tuple(range(5, 14))
    assert plan.extended_seeds('vit_convstem') == tuple(range(5, 9))
    assert [a.name for a in plan.ARMS if plan.extended_seeds(a.name)] == ['vit', 'vit_sam', 'resnet', 'resnet_sam',
                                                                          'vit_convstem']


@pytest.mark.parametrize('key', sorted(V3_DIFFS))
def test_revision_3_numbers_follow_from_the_power_analysis_of_the_5_seeds(key):
    from _reproduction import power

    claim = next(c for c in plan.CLAIMS if c.key == key)
    p = power.claim_power(key, V3_DIFFS[key], claim.margin, claim.direction)
    assert p.settle <= plan.EXTENDED_SEEDS[key] and p.exclude_zero <= plan.EXTENDED_SEEDS[key]
    assert p.settle_now < plan.POWER  # inconclusive at 5 seeds, and unlikely to be settled there
