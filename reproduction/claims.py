"""Each pre-registered claim of ``plan.CLAIMS`` as a paired difference over the seeds, with its verdict.

The difference is ``b - a`` per seed with its 95 % t interval (:func:`timm_ext.analysis.stats.paired_difference`);
the verdict follows the rule fixed before the runs (:func:`timm_ext.analysis.stats.verdict`; "unchanged"
claims by :func:`unchanged_verdict`). Revision 4 added the label "smaller than claimed"; each result keeps the label
of the rule before it too (``old_label``), which the report shows beside the new one where they differ.
"""
from dataclasses import dataclass
from typing import Any, Collection, List, Mapping, Optional, Sequence, Tuple

from plan import CLAIM_BY_KEY, PLANS, SMALLER_THAN_CLAIMED, Claim, RevisionPlan
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


def read(r: Results, claims: Sequence[Claim], at: Optional[Mapping[str, int]] = None, without: Collection[int] = (),
         revision: str = '') -> List[ClaimResult]:
    """The one claims reader: each claim of ``claims`` whose arms were run, in order, read once by the rule. A claim in
    ``at`` is read at exactly its first ``at[key]`` seeds, 0 to n - 1 (fixed before the runs, by ``revision``): an
    arm with fewer is an error, never read at fewer, and a claim none of whose arms was run is left out. Any other
    claim reads every seed its arms have (all of them run, else it is left out), less the seeds in ``without``."""
    out = []
    for claim in claims:
        arms = _arms_of(claim.a) + _arms_of(claim.b)
        if at is not None and claim.key in at:
            if not any(a in r for a in arms):
                continue  # a study of other arms
            n = at[claim.key]
            short = [f'{a} ({[m["seed"] for m in r.get(a, [])][:n]})' for a in arms
                     if [m['seed'] for m in r.get(a, [])][:n] != list(range(n))]
            if short:
                raise ValueError(f'claim {claim.key} is read at seeds 0-{n - 1} (plan revision {revision or "?"}) but '
                                 f'these arms have others: {", ".join(short)}; train them first '
                                 '(python reproduction/reproduce.py)')
            out.append(_reading(claim, {a: r[a][:n] for a in arms}))
        elif all(a in r for a in arms):
            out.append(_reading(claim, {a: [m for m in r[a] if m['seed'] not in without] for a in arms}))
    return out


def _reading(claim: Claim, r: Results) -> ClaimResult:
    n = len(r[_arms_of(claim.b)[0]])
    diff = paired_difference(side_values(r, claim.a, claim.metric, n), side_values(r, claim.b, claim.metric, n))
    if claim.direction == 'unchanged':
        label, agree = unchanged_verdict(diff, claim.margin)
        old = label
    else:
        v = verdict(diff, claim.direction, claim.margin, smaller_than_claimed=SMALLER_THAN_CLAIMED)
        label, agree = v.label, v.agree
        old = verdict(diff, claim.direction, claim.margin, smaller_than_claimed=False).label
    return ClaimResult(claim, diff, label, agree, old if old != label else '')


def read_revision(rev: RevisionPlan, r: Results, at: Optional[Mapping[str, int]] = None) -> List[ClaimResult]:
    """``rev``'s claims (``plan.PLANS``) read once each: at the seeds the revision fixed for them (its
    ``claim_seeds``; a later revision's claims at its own seeds; ``at`` where a rule fixed them from the runs, as
    revision 5's), the first revision's at every seed its arms have; in the plan's order of its claims."""
    if at is None:
        at = dict(rev.claim_seeds) or ({} if rev is PLANS[0] else {key: len(rev.seeds) for key in rev.claims})
    order = list(CLAIM_BY_KEY)  # the plan's order of its claims
    return read(r, [CLAIM_BY_KEY[key] for key in sorted(rev.claims, key=order.index)], at or None, revision=rev.name)
