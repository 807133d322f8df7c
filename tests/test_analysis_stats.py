"""timm_ext.analysis.stats: Student-t quantiles, paired intervals (t and bootstrap) and the verdict rule."""
import math
import random

import pytest

from timm_ext.analysis import (
    VERDICT_RULE,
    VERDICTS,
    PairedDifference,
    format_difference,
    paired_difference,
    t_quantile,
    verdict,
)

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


@pytest.mark.parametrize('df, expected', [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452),
                                          (1000, 1.9623)])
def test_t_quantile_matches_the_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)  # symmetric


def test_t_quantile_other_levels():
    assert t_quantile(0.995, 4) == pytest.approx(4.6041, abs=1e-4)
    assert t_quantile(0.995, 1) == pytest.approx(63.6567, abs=1e-4)
    assert t_quantile(0.95, 10) == pytest.approx(1.8125, abs=1e-4)
    assert t_quantile(0.5, 3) == 0.0
    assert t_quantile(0.975, 10 ** 6) == pytest.approx(1.959964, abs=1e-5)  # the normal limit


@pytest.mark.parametrize('p, df, message', [
    (1.0, 4, 't_quantile needs a probability p strictly between 0 and 1, got 1.0'),
    (0.975, 0, 't_quantile needs degrees of freedom df > 0 (the number of seeds - 1), got 0'),
])
def test_t_quantile_rejects(p, df, message):
    with pytest.raises(ValueError) as e:
        t_quantile(p, df)
    assert str(e.value) == message


def test_t_interval_equals_a_hand_computation():
    a, b = [70.0, 72.0, 71.0], [71.0, 75.0, 72.5]  # diffs 1, 3, 1.5: mean 11/6, sd sqrt(13/12)
    d = paired_difference(a, b)
    half = 4.302652729749 * math.sqrt(13 / 12) / math.sqrt(3)
    assert d.diffs == (1.0, 3.0, 1.5) and d.a == tuple(a) and d.b == tuple(b)
    assert d.n == 3 and d.method == 't' and d.confidence == 0.95
    assert d.mean == pytest.approx(11 / 6)
    assert (d.low, d.high) == (pytest.approx(11 / 6 - half, abs=1e-9), pytest.approx(11 / 6 + half, abs=1e-9))
    assert (d.low, d.high) == (pytest.approx(-0.7522, abs=1e-4), pytest.approx(4.4189, abs=1e-4))
    d99 = paired_difference(a, b, confidence=0.99)
    assert d99.low < d.low and d99.high > d.high


def test_equal_diffs_give_a_zero_width_interval():
    for method in ('t', 'bootstrap'):
        d = paired_difference([0.25, 1.5, 3.0], [0.5, 1.75, 3.25], method=method, samples=50)
        assert d.low == d.mean == d.high == 0.25  # exact in binary, so the diffs are equal


def test_bootstrap_is_deterministic_by_seed_and_close_to_t_on_a_large_normal_sample():
    rng = random.Random(1)
    a = [rng.gauss(0.0, 1.0) for _ in range(300)]
    b = [x + rng.gauss(0.5, 1.0) for x in a]
    boot = paired_difference(a, b, method='bootstrap', samples=2000, seed=3)
    assert boot == paired_difference(a, b, method='bootstrap', samples=2000, seed=3)
    assert boot != paired_difference(a, b, method='bootstrap', samples=2000, seed=4)
    t = paired_difference(a, b)
    assert boot.method == 'bootstrap' and boot.mean == t.mean
    width = t.high - t.low
    assert abs(boot.low - t.low) < 0.1 * width and abs(boot.high - t.high) < 0.1 * width


@pytest.mark.parametrize('a, b, kwargs, message', [
    ([1, 2, 3, 4, 5], [1, 2, 3, 4], {}, 'paired_difference needs the same number of values in a and b (one per '
                                        'seed), got 5 and 4'),
    ([1], [2], {}, 'paired_difference needs at least 2 seeds per arm for an interval, got 1'),
    ([1, float('nan')], [2, 3], {}, 'paired_difference needs finite values, got nan in a at position 1 (drop that '
                                    'seed from both arms)'),
    ([1, 2], [2, float('inf')], {}, 'paired_difference needs finite values, got inf in b at position 1 (drop that '
                                    'seed from both arms)'),
    ([1, 2], [2, 3], dict(confidence=95), 'paired_difference needs a confidence strictly between 0 and 1 (e.g. '
                                          '0.95), got 95'),
    ([1, 2], [2, 3], dict(method='normal'), "paired_difference method must be 't' or 'bootstrap', got 'normal'"),
    ([1, 2], [2, 3], dict(method='bootstrap', samples=0), 'paired_difference needs a positive whole number of '
                                                         'bootstrap samples, got 0'),
])
def test_paired_difference_rejects(a, b, kwargs, message):
    with pytest.raises(ValueError) as e:
        paired_difference(a, b, **kwargs)
    assert str(e.value) == message


def test_paired_difference_rejects_non_numbers():
    with pytest.raises(ValueError, match=r"^paired_difference needs numbers in b \(one per seed\), got \[1, 'x'\]"):
        paired_difference([1, 2], [1, 'x'])


def _diff(low: float, high: float, diffs=(1.0, -1.0, 2.0)) -> PairedDifference:
    return PairedDifference((0.0,) * len(diffs), tuple(diffs), tuple(diffs), (low + high) / 2, low, high, 0.95, 't')


@pytest.mark.parametrize('low, high, direction, margin, label', [
    (0.1, 0.5, 'increase', 0.0, 'reproduced'),
    (-0.5, -0.1, 'decrease', 0.0, 'reproduced'),
    (0.0, 0.5, 'increase', 0.0, 'inconclusive'),       # touching 0 is not strictly on the claimed side
    (-0.5, 0.0, 'decrease', 0.0, 'inconclusive'),
    (-0.5, -0.1, 'increase', 0.0, 'the opposite'),
    (0.1, 0.5, 'decrease', 0.0, 'the opposite'),
    (-0.5, 0.0, 'increase', 0.0, 'inconclusive'),       # touching 0 from the other side is not the opposite
    (-0.2, 0.3, 'increase', 0.0, 'inconclusive'),       # no margin: an interval across 0 decides nothing
    (-0.2, 0.3, 'increase', 0.5, 'not reproduced'),     # ... unless it rules out an effect of the margin's size
    (-0.2, 0.3, 'decrease', 0.5, 'not reproduced'),
    (-0.2, 0.5, 'increase', 0.5, 'inconclusive'),       # touching the margin does not rule it out
    (-0.5, 0.2, 'increase', 0.5, 'inconclusive'),
    (-0.2, 0.6, 'increase', 0.5, 'inconclusive'),       # wider than the margin
    (0.1, 0.3, 'increase', 0.5, 'smaller than claimed'),  # above 0, and an effect of the margin's size ruled out
    (-0.3, -0.1, 'decrease', 0.5, 'smaller than claimed'),
    (0.1, 0.5, 'increase', 0.5, 'reproduced'),            # touching the margin does not rule it out
    (0.1, 0.8, 'increase', 0.5, 'reproduced'),
    (-0.3, -0.1, 'increase', 0.5, 'the opposite'),        # the other side of 0, inside the margin or not
    (-0.8, -0.1, 'increase', 0.5, 'the opposite'),
])
def test_verdict_branches(low, high, direction, margin, label):
    assert verdict(_diff(low, high), direction, margin).label == label


@pytest.mark.parametrize('low, high, direction, new, old', [
    (0.1, 0.3, 'increase', 'smaller than claimed', 'reproduced'),  # the interval that read as both before
    (0.06, 1.12, 'increase', 'reproduced', 'reproduced'),
    (-0.13, 0.79, 'increase', 'not reproduced', 'not reproduced'),
    (-0.3, -0.1, 'decrease', 'smaller than claimed', 'reproduced'),
])
def test_the_rule_before_smaller_than_claimed_differs_only_there(low, high, direction, new, old):
    margin = 1.0 if abs(high) > 0.5 else 0.5
    assert verdict(_diff(low, high), direction, margin).label == new
    assert verdict(_diff(low, high), direction, margin, smaller_than_claimed=False).label == old


def test_no_interval_meets_two_labels():
    # every interval on a grid gets exactly one label, and the conditions of the rule's labels never overlap
    grid = [x / 4 for x in range(-8, 9)]
    for low in grid:
        for high in (h for h in grid if h >= low):
            i = _diff(low, high)
            met = {'reproduced': low > 0 and high >= 1.0, 'smaller than claimed': low > 0 and high < 1.0,
                   'the opposite': high < 0, 'not reproduced': -1.0 < low <= 0 <= high < 1.0}
            met['inconclusive'] = not any(met.values())
            assert sum(met.values()) == 1, (low, high, met)
            assert met[verdict(i, 'increase', 1.0).label], (low, high)


def test_verdict_counts_seeds_with_the_claimed_sign_strictly():
    d = _diff(-1.0, 2.0, diffs=(1.0, -1.0, 2.0, 0.0))
    assert (verdict(d, 'increase').agree, verdict(d, 'decrease').agree) == (2, 1)
    assert verdict(d, 'increase').n == 4
    assert str(verdict(d, 'increase')) == 'inconclusive (2/4 seeds agree)'
    real = paired_difference([1, 2, 3, 4, 5], [2, 3, 4, 5, 6.5])
    assert str(verdict(real, 'increase')) == 'reproduced (5/5 seeds agree)'
    assert set(VERDICTS) == {'reproduced', 'smaller than claimed', 'not reproduced', 'the opposite', 'inconclusive'}
    assert all(f'**{label}**' in VERDICT_RULE for label in VERDICTS) and '\n' not in VERDICT_RULE


@pytest.mark.parametrize('direction, margin, message', [
    ('up', 0.0, "verdict direction must be 'increase' (the claim says b > a) or 'decrease' (b < a), got 'up'"),
    ('increase', -0.1, 'verdict needs a margin >= 0 (the smallest difference the claim cares about), got -0.1'),
    ('increase', float('nan'), 'verdict needs a margin >= 0 (the smallest difference the claim cares about), got nan'),
])
def test_verdict_rejects(direction, margin, message):
    with pytest.raises(ValueError) as e:
        verdict(_diff(0.1, 0.5), direction, margin)
    assert str(e.value) == message


def test_format_difference():
    d = PairedDifference((0.0, 0.0), (0.1, 0.146), (0.1, 0.146), 0.123, 0.05, 0.196, 0.95, 't')
    assert format_difference(d) == '+0.123 [+0.050, +0.196]'
    assert format_difference(d, '.1f', ' pt') == '+0.1 pt [+0.1 pt, +0.2 pt]'
    neg = PairedDifference((0.0, 0.0), (-1.0, 0.0), (-1.0, 0.0), -1.25, -2.5, -0.0001, 0.95, 't')
    assert format_difference(neg, '.2f') == '-1.25 [-2.50, +0.00]'  # no '-0.00'


def test_docs_quote_the_rule_verbatim():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / 'docs' / 'analysis.md').read_text()
    assert f'> {VERDICT_RULE}\n' in text
