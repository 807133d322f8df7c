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


def test_revision_5_trains_every_sam_family_the_package_ships_against_revision_4s_pair():
    import inspect

    from timm.optim import get_optimizer_class, list_optimizers

    from timm_ext.optim import SAM

    def over_adamw(name):  # a SAM family's name over AdamW ('samonadamw' too, not 'samnadamw'); timm's own names
        try:               # may need a GPU to resolve (bitsandbytes'): none of them is ours
            cls = get_optimizer_class(name, bind_defaults=False)
        except Exception:
            return False
        return issubclass(cls, SAM) and inspect.signature(cls).parameters['base'].default == 'adamw'

    shipped = {n[:-len('adamw')] for n in list_optimizers() if n.endswith('adamw') and over_adamw(n)}
    rev = plan.PLAN_BY_NAME['5']
    arms = [plan.ARM_BY_NAME.get(n) or next(a for a in plan.R5_ARMS if a.name == n) for n in rev.arms]
    prefixes = {a.opt[:-len('adamw')] for a in arms if a.opt.endswith('adamw')}
    # SAM itself is revision 4's vit_sam_x2; interval SAM and GC-SAM are samadamw with their settings; MESA, bSAM
    assert len(shipped) >= 9 and shipped <= prefixes and {'mesa', 'sam'} <= prefixes
    assert 'bsam' in {a.opt for a in arms} and len(arms) == 12
    assert {'interval': 10, 'rho': 0.5} == plan.R5_ARMS[4].opt_kwargs and plan.R5_ARMS[10].opt_kwargs['use_gc']
    assert all(a.epochs == 120 and a.model == 'vit_tiny_patch16_224' and a.model_kwargs == plan.VIT for a in arms)
    # the cheap variants first, as the issue orders them; each claim compares its arm with SAM, paired by seed
    assert rev.arms[:5] == plan.R5_CHEAP
    for key, arm in zip(rev.claims, rev.arms):
        claim = plan.CLAIM_BY_KEY[key]
        assert (claim.a, claim.b, claim.margin) == (plan.R5_SAM, arm, plan.R5_MARGIN)
        assert claim.direction == ('unchanged' if arm in plan.R5_CHEAP else 'increase')
    assert rev.seeds == (0, 1, 2) and plan.R5_REACH == 16 == len(plan.LONG_SEEDS)
    assert len(rev.reused) == 32 and 'vit_sam_x2-s15' in rev.reused
    # the check trains revision 4's AdamW run again under a name of its own: the cache never shadows the reused run
    check, seed = plan.R5_CHECK
    assert (check.name, seed) == ('vit_x2_check', 0) and check.epochs == 120 and check.opt == 'adamw'


def test_every_revision_is_data_with_its_decision_in_order():
    assert [p.name for p in plan.PLANS] == ['2', '2.1', '2.2', '2.3', '2.4', '3', '3.1', '4', '5']
    assert all(p.decided.startswith(f'Revision {p.name} (') for p in plan.PLANS)
    assert plan.PLAN_BY_NAME['3'].claim_seeds == plan.EXTENDED_SEEDS
    assert 'Against optional stopping' in plan.PLAN_BY_NAME['3'].decided
    assert len(plan.__doc__.splitlines()) < 25  # the revision log lives in the data, not the docstring
    from _reproduction import registration

    assert {r.name for r in registration.REVISIONS} <= {p.name for p in plan.PLANS}  # the record: what has run


def test_an_arm_with_its_own_weight_decay_passes_it_last(tmp_path):
    from _reproduction import study_jobs

    bsam = next(a for a in plan.R5_ARMS if a.opt == 'bsam')
    args = study_jobs.train_args(bsam, tmp_path, tmp_path / 'runs', seed=0)
    at = [i for i, x in enumerate(args) if x == '--weight-decay']
    assert len(at) == 2 and args[at[-1] + 1] == '0.007' and args[args.index('--lr') + 1] == '0.5'
    assert '--weight-decay' in study_jobs.train_args(plan.ARM_BY_NAME['vit'], tmp_path, tmp_path, 0)
