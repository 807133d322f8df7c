"""The report's revision-3 parts: each extended claim beside its 5-seed reading, and the power analysis of every claim.

Revision 3 of the plan fixed, before its runs, how many seeds each claim within reach is read at
(``plan.EXTENDED_SEEDS``, from ``power.py`` on the 5 seeds); :func:`claims.evaluate_extended` reads them. This
module writes what the report shows of it: the claims table's extra column, the headline, the section with the
power table, the per-seed values and the runs' accuracy. Each extended claim is read first as revision 3 registered
it: every run at its first schedule, a run that misses the convergence rule named, not replaced (revision 4).
Revision 3.1, decided after those verdicts, trained the ViT arms of a new seed again at twice the schedule where one
of their runs missed the rule; its reading is shown beside, as a sensitivity reading.
"""
from typing import Dict, List, Optional, Sequence

from claims import ClaimResult
from measure_run import tail_gain
from plan import ARM_BY_NAME, CONVERGED_TAIL, EXTENDED_SEEDS, POWER, REACH, SEEDS, VIT_EPOCHS, extended_seeds
from power import MAX_SEEDS, ClaimPower, claim_power
from report_tables import claim_fmt, mean_sd, retrained, seed_values
from run_metrics import metric_fn
from run_results import Results, first_schedules

from timm_ext.analysis.stats import format_difference

__all__ = ['extended_cell', 'extended_section', 'headline', 'powers', 'reading']


def powers(claims: Sequence[ClaimResult]) -> Dict[str, ClaimPower]:
    """The power analysis of every claim from its 5-seed differences (the numbers revision 3 was fixed from)."""
    return {c.claim.key: claim_power(c.claim.key, c.diff.diffs[:len(SEEDS)], c.claim.margin, c.claim.direction)
            for c in claims}


def _needed(n: Optional[int]) -> str:
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
    return f'out of reach: {_needed(p.settle)} seeds'


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


def _per_seed(r: Results, c: ClaimResult) -> List[str]:
    """A claim's values per seed: each arm's (or each pair's difference) and the difference the claim reads."""
    claim, n = c.claim, c.n
    fn = metric_fn(claim.metric, r)
    fmt = '.1f' if claim.unit == ' pt' else '.3f'
    def signed(values: Sequence[float], sign: str = '') -> str:  # -0.0 from float noise prints as 0.0
        return ', '.join(f'{round(v, int(fmt[1])) + 0.0:{sign}{fmt}}' for v in values)

    rows = []
    for side in (claim.a, claim.b):
        if isinstance(side, tuple):
            first, second = side
            values = [fn(y) - fn(x) for x, y in zip(r[first][:n], r[second][:n])]
            name = f'{ARM_BY_NAME[second].label} - {ARM_BY_NAME[first].label}'
        elif side is not None:
            values = [fn(m) for m in r[side][:n]]
            name = ARM_BY_NAME[side].label
        else:
            continue
        rows.append(f'{name}: {mean_sd(values, fmt)} ({signed(values)})')
    return rows + [f'difference per seed: {signed(c.diff.diffs, "+")}']


def extended_section(r: Results, claims: Sequence[ClaimResult], extended: Dict[str, ClaimResult],
                     power: Dict[str, ClaimPower], cpu: Optional[str], img: List[str],
                     sensitivity: Optional[Dict[str, ClaimResult]] = None) -> List[str]:
    """The section on revision 3: the power analysis, each extended claim beside its 5-seed reading, as registered
    (every run of ``r`` at its first schedule), and revision 3.1's sensitivity reading (``sensitivity``) where it
    trained seeds again; the new runs, those that miss the rule named."""
    five = {c.claim.key: c for c in claims}
    sensitivity = sensitivity or {}
    registered = first_schedules(r)
    lines = ['## More seeds where more seeds can settle a claim (revision 3)', '',
             f'At 5 seeds {sum(c.label == "inconclusive" for c in claims)} claims were inconclusive. For each, '
             '`reproduction/power.py` assumes the per-seed differences are normal with the mean and standard '
             'deviation of the 5 seeds, and finds the fewest seeds at which the verdict rule gives a conclusive '
             f'verdict (anything but inconclusive) with {POWER * 100:.0f} % probability, and the fewest at which the '
             f'interval lies beside 0 with {POWER * 100:.0f} % probability. Revision 3 of the plan (committed '
             'before its runs, see its docstring) took the claims within '
             f'{REACH} seeds, fixed each one\'s number of seeds, and reads each claim once at exactly that number; '
             'both verdicts are shown, and the rule is the one above. The 5-seed effect is itself a noisy estimate, '
             'so the real power can be lower than planned. Revision 3 registered that a run that misses the '
             'convergence rule is named, not replaced: that is the reading given first. Revision 3.1, written after '
             'revision 3\'s verdicts were read, trained the ViT arms of a seed again at twice the schedule where one '
             'of their runs missed the rule, reversing that; its reading is given beside, as a sensitivity reading.',
             '',
             '| claim | 5 seeds: mean [95 % CI], verdict | P(conclusive) at 5 | seeds for a conclusive verdict | '
             'seeds for an interval beside 0 | revision 3 |', '|---|---|---|---|---|---|']
    for c in claims:
        if c.label != 'inconclusive':
            continue
        p = power[c.claim.key]
        text = c.claim.text[:1].upper() + c.claim.text[1:]
        lines.append(f'| {text} | {format_difference(c.diff, claim_fmt(c.claim), c.claim.unit)}, {c.label} | '
                     f'{p.settle_now:.2f} | {_needed(p.settle)} | {_needed(p.exclude_zero)} | '
                     f'{extended_cell(c.claim.key, c, extended, power, sensitivity)} |')
    lines.append('')
    for key, e in extended.items():
        text = e.claim.text[:1].upper() + e.claim.text[1:]
        again = (f' {SENSITIVITY[:1].upper() + SENSITIVITY[1:]} (the seeds whose runs missed the rule read at twice '
                 f'the schedule): {reading(sensitivity[key])}.' if key in sensitivity else '')
        lines += [f'**{text}** ({e.claim.paper}, {e.claim.source}). 5 seeds: {reading(five[key])}. '
                  f'{e.n} seeds (fixed at {EXTENDED_SEEDS[key]}), as registered: {reading(e)}.{again}', '',
                  *[f'- {row}' for row in _per_seed(registered, e)], '']
    lines += img
    new = [(name, seeds) for name in r for seeds in [extended_seeds(name)] if seeds]
    if new:
        lines += ['', 'The new seeds\' runs (the study\'s settings and convergence rule, each at its first schedule, '
                  'as the registered readings read them; seeds 0-4 are read back from the earlier report, not trained '
                  'again):', '',
                  '| arm | new seeds | top-1, last epoch | per seed | converged |', '|---|---|---|---|---|']
        for name, seeds in new:
            ms = [m for m in registered[name] if m['seed'] in seeds]
            top1 = [m['top1'] for m in ms]
            lines.append(f'| {ARM_BY_NAME[name].label} | {seeds[0]}-{seeds[-1]} | {mean_sd(top1)} % | '
                         f'{seed_values(top1)} | {sum(bool(m["converged"]) for m in ms)}/{len(ms)} |')
        missed = [f'{name} seed {m["seed"]} (+{tail_gain(m["top1_curve"]):.1f})' for name, seeds in new
                  for m in registered[name] if m['seed'] in seeds and not m['converged']]
        if missed:
            lines += ['', f'Runs that miss the convergence rule, with how many points their last '
                      f'{CONVERGED_TAIL:.0%} of epochs gained (named, not replaced: the registered readings read them '
                      f'as they are): {", ".join(missed)}.']
        again = [retrained(name, m) for name, seeds in new for m in r[name] if m['seed'] in seeds and 'replaced' in m]
        if again:
            lines += ['', 'Trained again at twice the schedule for the sensitivity reading (revision 3.1: every ViT '
                      f'arm of a new seed where one of its runs missed the rule), with each run\'s gain in its last '
                      f'{CONVERGED_TAIL:.0%} of epochs: {"; ".join(again)}. Both runs of each are kept in the cache '
                      'and in measurements.json (the first under `replaced`).']
        if cpu:
            lines += ['', cpu]
    return lines + ['']
