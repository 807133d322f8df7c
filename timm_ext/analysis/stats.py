"""Two arms of an experiment paired by seed: the mean difference, its confidence interval and a verdict.

A claim such as "SAM lowers lambda_max" is checked by training both arms on the same seeds; the seed
fixes the initialisation and the data order, so the per-seed differences cancel what the arms share and
give a tighter interval than two unpaired means. Pure Python (``math``, ``random``): scipy is not a
dependency, so the Student-t quantile is computed here.
"""
import functools
import math
import random
import statistics
from dataclasses import dataclass
from typing import Sequence, Tuple

__all__ = [
    'VERDICTS', 'VERDICT_RULE', 'PairedDifference', 'Verdict', 'format_difference', 'paired_difference',
    't_quantile', 'verdict',
]

VERDICTS = ('reproduced', 'smaller than claimed', 'not reproduced', 'the opposite', 'inconclusive')
VERDICT_RULE = (
    'Each claim is checked on the per-seed differences *b - a* of two arms trained on the same seeds: their mean '
    'and its Student-t confidence interval (95 % unless stated). The verdict is **reproduced** when the interval '
    'lies entirely on the claimed side of 0 and reaches the margin, the smallest effect the claim cares about; '
    '**smaller than claimed** when it lies entirely on the claimed side of 0 but inside (-margin, +margin) (an effect '
    'in the claimed direction, one as large as the margin ruled out); **the opposite** when it lies entirely on the '
    'other side of 0; **not reproduced** when it lies inside (-margin, +margin) and touches or spans 0 (an effect as '
    'large as the margin ruled out either way); and **inconclusive** otherwise: the interval spans 0 and is wider '
    'than the margin, so more seeds are needed. An interval that touches 0 is on neither side, and one that touches '
    'the margin does not rule it out.'
)
# the rule before "smaller than claimed" (reproduction plan revision 4): the sign was checked first, so an interval
# on the claimed side of 0 and inside the margin read "reproduced" while it also met "not reproduced"
_METHODS = ('t', 'bootstrap')
_DIRECTIONS = ('increase', 'decrease')


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), the Student-t CDF's building block."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The Student-t quantile: the half-width factor of a small-sample confidence interval (t_quantile(0.975, 4)
    is 2.7764). Bisection on the CDF, so it is as exact as the incomplete beta (about 1e-12); cached, as a power
    calculation asks for the same few (p, df) thousands of times."""
    if not 0.0 < p < 1.0:
        raise ValueError(f't_quantile needs a probability p strictly between 0 and 1, got {p}')
    if not df > 0:
        raise ValueError(f't_quantile needs degrees of freedom df > 0 (the number of seeds - 1), got {df}')
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        low, high = high, 2.0 * high
    for _ in range(200):
        mid = 0.5 * (low + high)
        if _t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * high:
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class PairedDifference:
    """The per-seed differences b - a of two arms and the confidence interval of their mean."""
    a: Tuple[float, ...]
    b: Tuple[float, ...]
    diffs: Tuple[float, ...]
    mean: float
    low: float
    high: float
    confidence: float
    method: str

    @property
    def n(self) -> int:
        """The number of seeds."""
        return len(self.diffs)


def _floats(name: str, values: Sequence[float]) -> Tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError) as e:
        raise ValueError(f'paired_difference needs numbers in {name} (one per seed), got {values!r}: {e}') from None
    for i, v in enumerate(out):
        if not math.isfinite(v):
            raise ValueError(f'paired_difference needs finite values, got {v} in {name} at position {i} '
                             f'(drop that seed from both arms)')
    return out


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), q in [0, 1]."""
    pos = q * (len(ordered) - 1)
    i = math.floor(pos)
    j = min(i + 1, len(ordered) - 1)
    return ordered[i] + (pos - i) * (ordered[j] - ordered[i])


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, method: str = 't',
                      samples: int = 10000, seed: int = 0) -> PairedDifference:
    """Mean of b - a over seeds with its confidence interval: Student t (``'t'``, exact for normal
    differences, the right default for a handful of seeds) or a percentile bootstrap (``'bootstrap'``, no
    normality assumption, deterministic through ``random.Random(seed)``)."""
    a, b = _floats('a', a), _floats('b', b)
    if len(a) != len(b):
        raise ValueError(f'paired_difference needs the same number of values in a and b (one per seed), '
                         f'got {len(a)} and {len(b)}')
    if len(a) < 2:
        raise ValueError(f'paired_difference needs at least 2 seeds per arm for an interval, got {len(a)}')
    if not 0.0 < confidence < 1.0:
        raise ValueError(f'paired_difference needs a confidence strictly between 0 and 1 (e.g. 0.95), '
                         f'got {confidence}')
    if method not in _METHODS:
        raise ValueError(f"paired_difference method must be 't' or 'bootstrap', got {method!r}")
    diffs = tuple(y - x for x, y in zip(a, b))
    n = len(diffs)
    mean = statistics.fmean(diffs)
    if method == 't':
        half = t_quantile((1.0 + confidence) / 2.0, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
        low, high = mean - half, mean + half
    else:
        if int(samples) != samples or samples < 1:
            raise ValueError(f'paired_difference needs a positive whole number of bootstrap samples, got {samples}')
        rng = random.Random(seed)
        means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(int(samples)))
        low, high = _percentile(means, (1.0 - confidence) / 2.0), _percentile(means, (1.0 + confidence) / 2.0)
    if len(set(diffs)) == 1:  # no spread: the interval is the point, whatever the rounding of the mean
        low = high = mean
    return PairedDifference(a, b, diffs, mean, low, high, confidence, method)


@dataclass(frozen=True)
class Verdict:
    """One of :data:`VERDICTS` and how many seeds' differences have the claimed sign."""
    label: str
    agree: int
    n: int

    def __str__(self) -> str:
        return f'{self.label} ({self.agree}/{self.n} seeds agree)'


def verdict(diff: PairedDifference, direction: str, margin: float = 0.0, smaller_than_claimed: bool = True) -> Verdict:
    """The claim "b is higher" (``'increase'``) or "b is lower" (``'decrease'``) judged by :data:`VERDICT_RULE`:
    by the interval, not by the seeds' votes, so that one lucky seed cannot decide it. ``smaller_than_claimed=False``
    gives the label of the rule before that label existed: "reproduced" for every interval on the claimed side of 0,
    however small (for comparing with verdicts given under it)."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"verdict direction must be 'increase' (the claim says b > a) or 'decrease' (b < a), "
                         f'got {direction!r}')
    if not margin >= 0:
        raise ValueError(f'verdict needs a margin >= 0 (the smallest difference the claim cares about), got {margin}')
    sign = 1.0 if direction == 'increase' else -1.0
    low, high = sorted((sign * diff.low, sign * diff.high))  # in the claim's orientation: positive = as claimed
    agree = sum(1 for d in diff.diffs if sign * d > 0)
    inside = margin > 0 and -margin < low and high < margin
    if low > 0:
        label = 'smaller than claimed' if smaller_than_claimed and inside else 'reproduced'
    elif high < 0:
        label = 'the opposite'
    elif inside:
        label = 'not reproduced'
    else:
        label = 'inconclusive'
    return Verdict(label, agree, diff.n)


def _signed(value: float, fmt: str) -> str:
    spec = fmt if fmt[:1] in '+- ' else '+' + fmt
    text, zero = format(value, spec), format(0.0, spec)
    return zero if text[1:] == zero[1:] else text  # a tiny negative prints as +0.000, not -0.000


def format_difference(diff: PairedDifference, fmt: str = '.3f', unit: str = '') -> str:
    """'+0.123 [+0.050, +0.196]': the signed mean difference and its interval, for tables and reports."""
    return (f'{_signed(diff.mean, fmt)}{unit} '
            f'[{_signed(diff.low, fmt)}{unit}, {_signed(diff.high, fmt)}{unit}]')
