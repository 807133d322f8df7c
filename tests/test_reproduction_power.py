"""reproduction/power.py: the seeds a claim needs, checked against a simulation of the verdict rule itself."""
import math
import random
import statistics

import pytest
from _reproduction import power, run_results

from timm_ext.analysis.stats import paired_difference, verdict

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)

# v3's 5-seed differences (docs/reproduction/measurements.json before revision 3): the numbers the plan was fixed from
V3 = {
    'sam_vit_top1': ([-0.27855153203343264, 1.39275604503068, 0.27854991689697783, 1.3927576601671205,
                      0.27855072446520523], 1.0, 'increase'),
}


def _simulated(mean, sd, n, margin, direction, draws=4000, seed=0):
    """The share of ``draws`` studies of ``n`` normal differences whose verdict is not inconclusive, and whose
    interval lies beside 0 on the mean's side: the rule as the report applies it (paired_difference, verdict)."""
    rng = random.Random(seed)
    settled = beside = 0
    for _ in range(draws):
        diffs = [rng.gauss(mean, sd) for _ in range(n)]
        d = paired_difference([0.0] * n, diffs)
        if direction == 'unchanged':
            inside = -margin < d.low and d.high < margin
            settled += inside or d.low >= margin or d.high <= -margin
        else:
            settled += verdict(d, direction, margin).label != 'inconclusive'
        beside += d.low > 0 if mean > 0 else d.high < 0  # beside 0 on the side of the true mean
    return settled / draws, beside / draws


@pytest.mark.parametrize('mean, sd, n, margin, direction', [
    (0.61, 0.75, 6, 1.0, 'increase'),  # SAM's top-1 on the ViT at 6 seeds
    (-0.05, 0.066, 9, 0.01, 'decrease'),  # the active share
    (-0.01, 0.055, 8, 0.05, 'increase'),  # less data's NEP: mostly "not reproduced" (inside the margin)
    (0.012, 0.03, 12, 0.02, 'unchanged'),  # CB's attention distance
])
def test_probabilities_match_a_simulation_of_the_verdict_rule(mean, sd, n, margin, direction):
    settled, beside = _simulated(mean, sd, n, margin, direction)
    assert power.settle_probability(mean, sd, n, margin, direction == 'unchanged') == pytest.approx(settled, abs=0.025)
    assert power.exclude_zero_probability(mean, sd, n) == pytest.approx(beside, abs=0.025)


def test_seeds_needed_for_the_headline_claim_from_v3():
    diffs, margin, direction = V3['sam_vit_top1']
    p = power.claim_power('sam_vit_top1', diffs, margin, direction)
    assert p.n == 5 and p.mean == pytest.approx(0.6128, abs=1e-4)
    assert p.exclude_zero == 14 and p.settle == 10  # issue 39 counted 14 (beside 0); any verdict: 10
    assert p.settle_now == pytest.approx(0.40, abs=0.01)
    # the smallest n: one fewer seed falls short of 80 %
    assert power.exclude_zero_probability(p.mean, p.sd, 13) < power.POWER <= power.exclude_zero_probability(
        p.mean, p.sd, 14)


def test_a_claim_with_no_effect_is_never_reached_beside_zero():
    assert power.seeds_needed(lambda n: power.exclude_zero_probability(1e-6, 1.0, n), limit=50) is None


def test_differences_without_spread_are_conclusive_at_once():
    p = power.claim_power('sam_vit_top1', [2.0] * 5, 1.0, 'increase')
    assert (p.settle_now, p.exclude_zero, p.settle) == (1.0, 2, 2)
    assert power.claim_power('cb_distance', [0.0] * 5, 0.02, 'unchanged').exclude_zero is None


@pytest.mark.parametrize('args, message', [
    ((0.5, 0.0, 5), 'standard deviation > 0'),
    ((0.5, 1.0, 1), 'at least 2 seeds'),
    ((float('nan'), 1.0, 5), 'finite mean'),
])
def test_bad_input_is_one_line(args, message):
    with pytest.raises(ValueError, match=message):
        power.exclude_zero_probability(*args)
    with pytest.raises(ValueError, match='margin > 0'):
        power.settle_probability(0.5, 1.0, 5, 0.0)


def test_command_prints_every_claim(tmp_path, capsys):
    saved = tmp_path / 'measurements.json'
    diffs, margin, direction = V3['sam_vit_top1']
    saved.write_text(run_results.json.dumps({'claims': {'sam_vit_top1': dict(
        diffs=diffs + [9.0, 9.0], margin=margin, direction=direction)}}))  # later seeds are not read
    assert power.main([str(saved)]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row == ['sam_vit_top1', '5', '+0.6128', '0.7474', '0.40', '14', '10']
    with pytest.raises(SystemExit):
        power.main([str(tmp_path / 'missing.json')])
    assert 'no measurements at' in capsys.readouterr().err


def test_pooled_sd_weighs_each_group_by_its_degrees_of_freedom():
    a, b = [1.0, 2.0, 3.0], [0.0, 4.0]
    expected = math.sqrt((2 * statistics.variance(a) + 1 * statistics.variance(b)) / 3)
    assert power.pooled_sd([a, b]) == pytest.approx(expected)
    with pytest.raises(ValueError, match='at least 2 values'):
        power.pooled_sd([[1.0]])


def test_budgeted_seeds_reads_in_order_while_the_budget_lasts():
    pilot = {'a': [0.3, -0.3, 0.0], 'b': [0.6, 0.0, 0.3], 'c': [1.2, 0.3, -0.3], 'd': [0.0, 0.0, 0.0]}
    claims = {'a': (0.5, 'unchanged'), 'b': (0.5, 'increase'), 'c': (0.5, 'increase'), 'd': (0.5, 'increase')}
    cpu = {'a': 8.0, 'b': 10.0, 'c': 10.0, 'd': 10.0}
    out = power.budgeted_seeds(pilot, claims, cpu, {'d': 'cannot train'}, spent=300, budget=600, reach=16)
    by = {d.key: d for d in out}
    assert [d.key for d in out] == ['a', 'b', 'c', 'd'] and by['d'].status == 'dropped' and by['d'].n is None
    sd = power.pooled_sd([pilot['a'], pilot['b'], pilot['c']])  # the dropped arm's differences are left out
    for key in 'abc':
        mean, (margin, direction) = statistics.fmean(pilot[key]), claims[key]
        p = lambda k, m=mean, g=margin, u=direction == 'unchanged': power.settle_probability(m, sd, k, g, u)  # noqa
        n = by[key].n
        assert p(n) >= power.POWER and (n == 3 or p(n - 1) < power.POWER)
    read = [d for d in out if d.status == 'read']
    assert sum(d.cpu_min for d in read) <= 300 and all(d.cpu_min == (d.n - 3) * cpu[d.key] for d in read)
    # a smaller budget stops in order, and a later, cheaper claim may still fit
    tight = power.budgeted_seeds(pilot, claims, {'a': 8.0, 'b': 50.0, 'c': 1.0, 'd': 1.0}, {'d': 'x'}, spent=0,
                                 budget=(by['a'].n - 3) * 8.0 + 5 + (by['c'].n - 3) * 1.0, reach=16)
    assert [d.status for d in tight] == ['read', 'out of reach', 'read', 'dropped']
    assert 'CPU-min' in tight[1].why and 'budget left' in tight[1].why
    far = power.budgeted_seeds({'a': [0.6, -0.6, 0.0]}, {'a': (0.05, 'increase')}, {'a': 1.0}, {}, 0, 1e9, reach=16)
    assert far[0].status == 'out of reach' and 'past the 16 the reused runs have' in far[0].why
