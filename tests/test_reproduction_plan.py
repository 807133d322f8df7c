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
