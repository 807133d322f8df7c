"""How many seeds a claim needs: the power analysis behind revision 3 of the plan (issue 39).

For a claim measured on ``n`` seeds, the verdict rule (:data:`timm_ext.analysis.stats.VERDICT_RULE`) reads the 95 %
Student-t interval of the per-seed differences. Assuming the differences are normal with the mean and standard
deviation observed on the study's first seeds, this module computes, for any ``n``:

* :func:`exclude_zero_probability`: the chance that the interval lies entirely on the side of 0 the observed mean is
  on (the claim reproduced, or the opposite), from the noncentral t distribution;
* :func:`settle_probability`: the chance that the verdict is not "inconclusive" at all, which also counts an
  interval inside (-margin, +margin) ("not reproduced"; for an "unchanged" claim, inside the margin is "reproduced"
  and beyond it "not reproduced"), integrated over the distribution of the sample standard deviation.

:func:`seeds_needed` is the smallest ``n`` where a probability reaches the target (80 %). Both rest on the observed
effect being the true one, which a handful of seeds estimates loosely (an optimistic guess when the observed effect
is large by chance), so the report shows the 5-seed verdict beside the extended one. ``python reproduction/power.py
[measurements.json]`` prints the table for every claim from its first 5 seeds.
"""
import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy import stats

__all__ = ['POWER', 'ClaimPower', 'SeedDecision', 'budgeted_seeds', 'claim_power', 'exclude_zero_probability',
           'pooled_sd', 'seeds_needed', 'settle_probability']

POWER = 0.8  # the chance of a conclusive reading the plan asks for
CONFIDENCE = 0.95  # the verdict rule's interval
MAX_SEEDS = 300  # beyond this a claim is reported as needing "over 300"
_GRID = 2000  # quantiles of the sample variance's distribution the settle probability averages over


def _check(mean: float, sd: float, n: int) -> None:
    if not (math.isfinite(mean) and math.isfinite(sd) and sd > 0):
        raise ValueError(f'power needs a finite mean and a standard deviation > 0 of the per-seed differences, '
                         f'got mean {mean} and sd {sd}')
    if int(n) != n or n < 2:
        raise ValueError(f'power needs at least 2 seeds (a whole number), got {n}')


def exclude_zero_probability(mean: float, sd: float, n: int, confidence: float = CONFIDENCE) -> float:
    """P(the ``confidence`` t interval of ``n`` differences ~ N(mean, sd) lies on the side of 0 that ``mean`` is on)."""
    _check(mean, sd, n)
    df = n - 1
    t_crit = stats.t.ppf((1 + confidence) / 2, df)
    return float(stats.nct.sf(t_crit, df, abs(mean) * math.sqrt(n) / sd))


def settle_probability(mean: float, sd: float, n: int, margin: float, unchanged: bool = False,
                       confidence: float = CONFIDENCE) -> float:
    """P(the verdict rule is not "inconclusive") for ``n`` differences ~ N(mean, sd).

    Given the sample sd ``s``, the interval is ``xbar -+ h`` with ``h = t * s / sqrt(n)`` and ``xbar`` normal, so
    each verdict is a set of ``xbar`` values; the probability is averaged over ``s`` at evenly spaced quantiles of
    its scaled chi-square distribution.
    """
    _check(mean, sd, n)
    if not margin > 0:
        raise ValueError(f'settle_probability needs a margin > 0 (the smallest effect the claim cares about), '
                         f'got {margin}')
    df = n - 1
    t_crit = stats.t.ppf((1 + confidence) / 2, df)
    se = sd / math.sqrt(n)
    u = stats.chi2.ppf((np.arange(_GRID) + 0.5) / _GRID, df)
    h = t_crit * sd * np.sqrt(u / df) / math.sqrt(n)

    def p(low, high):  # P(low < xbar < high), 0 where the set is empty
        return np.clip(stats.norm.cdf((high - mean) / se) - stats.norm.cdf((low - mean) / se), 0.0, None)

    inside = np.where(h < margin, p(-margin + h, margin - h), 0.0)  # the whole interval inside (-margin, margin)
    if unchanged:
        settled = inside + p(margin + h, np.inf) + p(-np.inf, -margin - h)
    else:  # beside 0 on either side, or inside the margin without being beside 0 (the two overlap near 0)
        overlap = np.where(h < margin, p(np.maximum(-margin + h, h), margin - h)
                           + p(-margin + h, np.minimum(margin - h, -h)), 0.0)
        settled = p(h, np.inf) + p(-np.inf, -h) + inside - overlap
    return float(np.mean(settled))


def seeds_needed(probability, target: float = POWER, start: int = 2, limit: int = MAX_SEEDS) -> Optional[int]:
    """The fewest seeds ``n`` in ``[start, limit]`` with ``probability(n) >= target``; None past ``limit``."""
    for n in range(start, limit + 1):
        if probability(n) >= target:
            return n
    return None


@dataclass(frozen=True)
class ClaimPower:
    """One claim's power analysis from its first seeds' differences."""
    key: str
    n: int
    mean: float
    sd: float
    settle_now: float  # P(settled) at the seeds it has
    exclude_zero: Optional[int]  # seeds for an interval beside 0 with POWER (None: over MAX_SEEDS)
    settle: Optional[int]  # seeds for any verdict but inconclusive with POWER


def claim_power(key: str, diffs: Sequence[float], margin: float, direction: str) -> ClaimPower:
    """The power analysis of one claim from its per-seed differences (its first seeds)."""
    mean, sd, n = statistics.fmean(diffs), statistics.stdev(diffs), len(diffs)
    unchanged = direction == 'unchanged'
    if sd == 0:  # every seed the same difference: the interval is that point, conclusive at any number of seeds
        return ClaimPower(key, n, mean, sd, 1.0, 2 if mean != 0 else None, 2)
    return ClaimPower(key, n, mean, sd, settle_probability(mean, sd, n, margin, unchanged),
                      seeds_needed(lambda k: exclude_zero_probability(mean, sd, k)),
                      seeds_needed(lambda k: settle_probability(mean, sd, k, margin, unchanged)))


@dataclass(frozen=True)
class SeedDecision:
    """What the pilot rule of revision 5 gives one claim: ``n`` seeds (None: over ``MAX_SEEDS``) and whether it is
    read at them (``status`` 'read'), out of reach (its ``n`` past the reach, or its runs past the budget) or dropped
    (its arm cannot train the model); ``cpu_min`` the CPU-minutes its extra seeds are planned to cost."""
    key: str
    n: Optional[int]
    status: str
    why: str
    cpu_min: float = 0.0


def pooled_sd(groups: Sequence[Sequence[float]]) -> float:
    """The standard deviation pooled over groups (each its own mean): sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1))."""
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    if df == 0:
        raise ValueError('a pooled standard deviation needs a group of at least 2 values')
    return math.sqrt(sum((len(g) - 1) * statistics.variance(g) for g in groups if len(g) > 1) / df)


def budgeted_seeds(pilot: Dict[str, Sequence[float]], claims: Dict[str, tuple], run_cpu_min: Dict[str, float],
                   dropped: Dict[str, str], spent: float, budget: float, reach: int,
                   power: float = POWER) -> List[SeedDecision]:
    """Revision 5's rule, in ``pilot``'s order (the plan's): each claim's seeds from its pilot differences (their mean,
    and the sd pooled over every claim not ``dropped``), the fewest where the verdict is conclusive with ``power``;
    within ``reach``, its extra seeds (``run_cpu_min`` each) are planned while they fit in ``budget`` CPU-minutes
    after ``spent``. ``claims`` gives each key's (margin, direction)."""
    kept = [list(d) for k, d in pilot.items() if k not in dropped]
    sd = pooled_sd(kept) if kept else float('nan')
    left, out = budget - spent, []
    for key, diffs in pilot.items():
        if key in dropped:
            out.append(SeedDecision(key, None, 'dropped', dropped[key]))
            continue
        margin, direction = claims[key]
        mean, start = statistics.fmean(diffs), len(diffs)
        unchanged = direction == 'unchanged'
        n = seeds_needed(lambda k, m=mean, g=margin, u=unchanged: settle_probability(m, sd, k, g, u), power,
                         start=start)
        if n is None or n > reach:
            out.append(SeedDecision(key, n, 'out of reach', f'needs {"over " + str(MAX_SEEDS) if n is None else n} '
                                    f'seeds, past the {reach} the reused runs have'))
            continue
        cost = (n - start) * run_cpu_min[key]
        if cost > left:
            out.append(SeedDecision(key, n, 'out of reach', f'its {n - start} more seeds would take {cost:.0f} '
                                    f'CPU-min, {left:.0f} of the budget left'))
            continue
        left -= cost
        out.append(SeedDecision(key, n, 'read', f'{n} seeds', cost))
    return out


def power_table(measurements: Dict, first: int = 5) -> Dict[str, ClaimPower]:
    """Every claim of a ``measurements.json`` (its ``claims``), from the differences of its first ``first`` seeds."""
    return {key: claim_power(key, c['diffs'][:first], c['margin'], c['direction'])
            for key, c in measurements['claims'].items()}


def _needed_text(n: Optional[int]) -> str:
    return f'over {MAX_SEEDS}' if n is None else str(n)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python reproduction/power.py', description=__doc__.splitlines()[0])
    parser.add_argument('measurements', nargs='?', default='docs/reproduction/measurements.json')
    parser.add_argument('--first', type=int, default=5, help='read each claim\'s first FIRST seeds (default 5)')
    args = parser.parse_args(argv)
    path = Path(args.measurements)
    if not path.is_file():
        parser.error(f'no measurements at {path}: give the study\'s measurements.json')
    table = power_table(json.loads(path.read_text()), args.first)
    print(f'{"claim":<24} {"seeds":>5} {"mean":>9} {"sd":>8} {"P(settled)":>10} {"beside 0":>9} {"settled":>8}')
    for p in table.values():
        print(f'{p.key:<24} {p.n:>5} {p.mean:>+9.4f} {p.sd:>8.4f} {p.settle_now:>10.2f} '
              f'{_needed_text(p.exclude_zero):>9} {_needed_text(p.settle):>8}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
