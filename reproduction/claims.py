"""Each pre-registered claim of ``plan.CLAIMS`` as a paired difference over the seeds, with its verdict.

The difference is ``b - a`` per seed with its 95 % t interval (:func:`timm_ext.analysis.stats.paired_difference`);
the verdict follows the rule fixed before the runs (:func:`timm_ext.analysis.stats.verdict`; "unchanged"
claims by :func:`unchanged_verdict`). Revision 4 added the label "smaller than claimed"; each result keeps the label
of the rule before it too (``old_label``), which the report shows beside the new one where they differ.
"""
from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Sequence, Tuple

from plan import CLAIMS, EXTENDED_SEEDS, LONG_CLAIM, LONG_SEEDS, SMALLER_THAN_CLAIMED, Claim
from run_metrics import metric_fn
from run_results import Results

from timm_ext.analysis.stats import PairedDifference, paired_difference, verdict


def side_values(r: Results, side: Any, metric: str, n: int) -> List[float]:
    """One value per seed for a claim's side: an arm, a pair's difference (second - first) or zeros (None)."""
    if side is None:
        return [0.0] * n
    fn = metric_fn(metric, r)
    if isinstance(side, tuple):
        first, second = side
        return [fn(y) - fn(x) for x, y in zip(r[first], r[second])]
    return [fn(m) for m in r[side]]


def unchanged_verdict(diff: PairedDifference, margin: float) -> Tuple[str, int]:
    """A claim of no effect: reproduced inside ``(-margin, margin)``, not reproduced beyond it, else inconclusive."""
    agree = sum(abs(d) < margin for d in diff.diffs)
    if -margin < diff.low and diff.high < margin:
        return 'reproduced', agree
    if diff.low >= margin or diff.high <= -margin:
        return 'not reproduced', agree
    return 'inconclusive', agree


@dataclass
class ClaimResult:
    claim: Claim
    diff: PairedDifference
    label: str
    agree: int
    old_label: str = ''  # the label by the rule before revision 4 ('' where it is the same)

    @property
    def n(self) -> int:
        return self.diff.n

    @property
    def before_revision_4(self) -> str:
        return self.old_label or self.label

    def verdict_text(self) -> str:
        """The label in bold, and the one the rule before revision 4 gave where it differs: no interval reads as
        two verdicts without saying which rule gave which."""
        old = self.before_revision_4
        return f'**{self.label}**' + (f' (by the rule before revision 4: {old})' if old != self.label else '')


def _arms_of(side: Any) -> List[str]:
    return [] if side is None else list(side) if isinstance(side, tuple) else [side]


def evaluate(r: Results, claims: Sequence[Claim] = CLAIMS) -> List[ClaimResult]:
    """Every claim whose arms were run, in ``CLAIMS`` order."""
    out = []
    for claim in claims:
        if not all(a in r for a in _arms_of(claim.a) + _arms_of(claim.b)):
            continue
        n = len(r[_arms_of(claim.b)[0]])
        diff = paired_difference(side_values(r, claim.a, claim.metric, n), side_values(r, claim.b, claim.metric, n))
        if claim.direction == 'unchanged':
            label, agree = unchanged_verdict(diff, claim.margin)
            old = label
        else:
            v = verdict(diff, claim.direction, claim.margin, smaller_than_claimed=SMALLER_THAN_CLAIMED)
            label, agree = v.label, v.agree
            old = verdict(diff, claim.direction, claim.margin, smaller_than_claimed=False).label
        out.append(ClaimResult(claim, diff, label, agree, old if old != label else ''))
    return out


def evaluate_extended(r: Results, seeds: Dict[str, int] = EXTENDED_SEEDS) -> List[ClaimResult]:
    """Revision 3: each claim of ``seeds`` read once, on exactly its first ``seeds[key]`` seeds (fixed before the runs),
    by the same rule. A claim whose arms have fewer seeds than that is an error, never read at fewer."""
    out = []
    for claim in (c for c in CLAIMS if c.key in seeds):
        n = seeds[claim.key]
        arms = _arms_of(claim.a) + _arms_of(claim.b)
        if not any(a in r for a in arms):
            continue  # a study of other arms
        short = [f'{a} ({len(r.get(a, []))})' for a in arms if len(r.get(a, [])) < n]
        if short:
            raise ValueError(f'claim {claim.key} is read at {n} seeds (plan revision 3) but these arms have fewer: '
                             f'{", ".join(short)}; train them first (python reproduction/reproduce.py)')
        out += evaluate({a: r[a][:n] for a in arms}, [claim])
    return out


def evaluate_long(r: Results) -> List[ClaimResult]:
    """Revision 4: the ViT pair at 120 epochs, read once at exactly ``LONG_SEEDS`` (fixed before the runs), by the
    rule of revision 4; nothing where the study has not run the pair, an error where it has fewer seeds."""
    arms = [LONG_CLAIM.a, LONG_CLAIM.b]
    if not any(a in r for a in arms):
        return []
    seeds = [[m['seed'] for m in r.get(a, [])] for a in arms]
    if any(s != list(LONG_SEEDS) for s in seeds):
        raise ValueError(f'claim {LONG_CLAIM.key} is read at seeds {LONG_SEEDS[0]}-{LONG_SEEDS[-1]} (plan revision 4) '
                         f'but {", ".join(f"{a} has {s}" for a, s in zip(arms, seeds))}; train them first '
                         '(python reproduction/reproduce.py)')
    return evaluate({a: r[a] for a in arms}, [LONG_CLAIM])


def evaluate_long_unseen(r: Results, seen: Collection[int]) -> List[ClaimResult]:
    """Revision 4's pair read without the ``seen`` seeds, whose runs were trained and read before it was written
    (revision 3.1's, ``LONG_REUSED`` in the study): the runs no one had seen, beside the reading of all 16 seeds
    (issue 57). Nothing where the pair is not run or nothing was seen."""
    arms = [LONG_CLAIM.a, LONG_CLAIM.b]
    if not seen or not all(a in r for a in arms):
        return []
    return evaluate({a: [m for m in r[a] if m['seed'] not in seen] for a in arms}, [LONG_CLAIM])
