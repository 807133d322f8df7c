"""How the report writes a claim's reading: mean [interval], seeds that agree, the label (and the old rule's beside it),
the claims table's column for claims read at more seeds, the headline and the power analysis they came from.

Shared by every revision's part of the report (``report.py``, ``sections.py``); nothing here belongs to one revision.
"""
from typing import Dict, Optional, Sequence

from claims import ClaimResult
from plan import REACH, SEEDS, VIT_EPOCHS
from power import MAX_SEEDS, ClaimPower, claim_power
from report_tables import claim_fmt

from timm_ext.analysis.stats import format_difference

__all__ = ['SENSITIVITY', 'extended_cell', 'headline', 'needed_text', 'old_rule_sentence', 'powers', 'reading']



def powers(claims: Sequence[ClaimResult]) -> Dict[str, ClaimPower]:
    """The power analysis of every claim from its 5-seed differences (the numbers revision 3 was fixed from)."""
    return {c.claim.key: claim_power(c.claim.key, c.diff.diffs[:len(SEEDS)], c.claim.margin, c.claim.direction)
            for c in claims}


def needed_text(n: Optional[int]) -> str:
    return f'over {MAX_SEEDS}' if n is None else str(n)


def reading(c: ClaimResult) -> str:
    """A reading as the report gives it: mean [interval], seeds that agree, the label (and the old one beside)."""
    return f'{format_difference(c.diff, claim_fmt(c.claim), c.claim.unit)}, {c.agree}/{c.n} agree, {c.verdict_text()}'


SENSITIVITY = 'revision 3.1\'s sensitivity reading'


def extended_cell(key: str, five: ClaimResult, extended: Dict[str, ClaimResult], power: Dict[str, ClaimPower],
                  sensitivity: Optional[Dict[str, ClaimResult]] = None) -> str:
    """The claims table's revision-3 column: the extended reading as registered (and revision 3.1's beside it), or
    why a claim got no more seeds."""
    if key in extended:
        again = (sensitivity or {}).get(key)
        return (f'{extended[key].n} seeds: {reading(extended[key])}'
                + (f'; {SENSITIVITY}: {format_difference(again.diff, claim_fmt(again.claim), again.claim.unit)}, '
                   f'{again.verdict_text()}' if again is not None else ''))
    if five.label != 'inconclusive':
        return 'settled at 5 seeds'
    p = power[key]
    if p.settle is not None and p.settle <= REACH:
        return f'within reach ({p.settle} seeds), not in revision 3'
    return f'out of reach: {needed_text(p.settle)} seeds'


def headline(claims: Sequence[ClaimResult], extended: Dict[str, ClaimResult],
             sensitivity: Optional[Dict[str, ClaimResult]] = None, long: Optional[ClaimResult] = None,
             retrained_seeds: Sequence[int] = (), long_unseen: Optional[ClaimResult] = None,
             reused: int = 0) -> str:
    """The summary after the title: the verdicts at 5 seeds, then with revision 3's readings as registered in their
    place, then the headline claim's readings, each labelled: as registered, at 120 epochs for every seed (revision
    4, ``long``: ``reused`` of its runs trained before it, its new runs alone ``long_unseen``) and revision 3.1's
    sensitivity reading (``sensitivity``, seeds ``retrained_seeds`` trained again)."""
    def counts(labels: Sequence[str]) -> str:
        out: Dict[str, int] = {}
        for label in labels:
            out[label] = out.get(label, 0) + 1
        return ', '.join(f'{n} {k}' for k, n in sorted(out.items()))

    five = [c.label for c in claims]
    text = f'{len(claims)} claims at 5 seeds: {counts(five)}.'
    if not extended:
        return text
    now = [extended[c.claim.key].label if c.claim.key in extended else c.label for c in claims]
    seeds = sorted({c.n for c in extended.values()}, reverse=True)
    text += (f' With more seeds for the {len(extended)} claims that the power analysis put within reach (revision 3: '
             f'{", ".join(map(str, seeds))} seeds, fixed before the runs), read as registered: {counts(now)}.')
    sam = extended.get('sam_vit_top1')
    five_sam = next((c for c in claims if c.claim.key == 'sam_vit_top1'), None)
    if sam is None or five_sam is None:
        return text
    pt = ('.2f', ' pt')
    readings = [f'**as registered** (revision 3: {sam.n} seeds at {VIT_EPOCHS} epochs, a run that '
                f'misses the convergence rule named, not replaced): {format_difference(sam.diff, *pt)}, '
                f'{sam.agree}/{sam.n} agree, {sam.verdict_text()}']
    if long is not None:
        new = 2 * long.n - reused
        readings.append(f'**at 120 epochs for every seed** (revision 4, a claim of its own: {new} runs new, {reused} '
                        'reused from revision 3.1, trained and read before revision 4 was written, so it is post hoc '
                        f'by the standard below): {format_difference(long.diff, *pt)}, {long.agree}/{long.n} agree, '
                        f'{long.verdict_text()}'
                        + (f'; its {long_unseen.n} new seeds alone: {format_difference(long_unseen.diff, *pt)}, '
                           f'{long_unseen.agree}/{long_unseen.n} agree, {long_unseen.verdict_text()}'
                           if long_unseen is not None and reused else ''))
    was = (sensitivity or {}).get('sam_vit_top1')
    if was is not None:
        seeds_text = (f'seeds {", ".join(map(str, retrained_seeds[:-1]))} and {retrained_seeds[-1]}'
                      if len(retrained_seeds) > 1 else f'seed {", ".join(map(str, retrained_seeds))}')
        readings.append(f'**{SENSITIVITY}** (decided after revision 3\'s verdicts were read, it reverses revision '
                        f'3\'s rule: {seeds_text}, whose runs missed the rule, read at twice the schedule): '
                        f'{format_difference(was.diff, *pt)}, {was.agree}/{was.n} agree, {was.verdict_text()}')
    ways = {1: 'one way', 2: 'two ways', 3: 'three ways'}[len(readings)]
    every = list(claims) + list(extended.values()) + list((sensitivity or {}).values()) + ([long] if long else [])
    return (text + ' The vit-sam paper\'s headline, SAM raises the ViT\'s top-1 (5 seeds: '
            f'{format_difference(five_sam.diff, *pt)}, {five_sam.label}), read {ways}: ' + '; '.join(readings) + '. '
            + old_rule_sentence(every))


def old_rule_sentence(readings: Sequence[ClaimResult]) -> str:
    """How many of the report's readings the rule before revision 4 (no "smaller than claimed") labels otherwise:
    the new label is given beside the old one for each of those, so this says where to look, or that none differ."""
    differ = [c for c in readings if c.before_revision_4 != c.label]
    if not differ:
        return (f'By the rule before revision 4, which had no "smaller than claimed", each of the report\'s '
                f'{len(readings)} readings of a claim gets the same label: none lies on the claimed side of 0 inside '
                f'the margin.')
    return (f'By the rule before revision 4, which had no "smaller than claimed", {len(differ)} of the report\'s '
            f'{len(readings)} readings of a claim get another label, given beside the new one.')
