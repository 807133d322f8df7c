"""The report's sections that belong to one revision each, found by the revision's name (``SECTIONS``).

The report writer (``report.py``) computes every reading once and hands each revision of ``plan.PLANS`` it reports
the same context; a revision with a section of its own gets it here: revision 3's claims at the seeds its power
analysis fixed (each beside its 5-seed reading, revision 3.1's sensitivity reading beside it), revision 4's pair at
one schedule for every seed, revision 5's arms per unit of compute (``cost_gain.py``).
"""
from typing import Any, Callable, Dict, List, Optional, Sequence

from claims import ClaimResult
from convergence_text import converged_cell
from longer_schedules import LONG_ARMS
from measure_run import tail_gain
from plan import ARM_BY_NAME, CONVERGED_TAIL, EXTENDED_SEEDS, LONG_PAIR, POWER, REACH, VIT_EPOCHS, extended_seeds
from power import ClaimPower
from readings import SENSITIVITY, extended_cell, needed_text, reading
from registration import REVISIONS, label
from report_tables import claim_fmt, mean_sd, retrained, seed_values
from run_metrics import metric_fn
from run_results import Results, first_schedules
from run_times import cpu_of, spend

from timm_ext.analysis.stats import format_difference, paired_difference

__all__ = ['ONE_SCHEDULE_TITLE', 'SECTIONS', 'more_seeds_section', 'one_schedule_section', 'revision_sections']


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


def more_seeds_section(r: Results, claims: Sequence[ClaimResult], extended: Dict[str, ClaimResult],
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
                     f'{p.settle_now:.2f} | {needed_text(p.settle)} | {needed_text(p.exclude_zero)} | '
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


ONE_SCHEDULE_TITLE = 'One schedule for every seed: the ViT pair at 120 epochs (revision 4)'


def one_schedule_section(r_long: Results, long: ClaimResult, registered: Optional[Dict[str, List[Dict[str, Any]]]],
                 headline: Optional[ClaimResult], earlier: Sequence[str] = (),
                 unseen: Optional[ClaimResult] = None) -> List[str]:
    """The section: ``r_long`` holds the pair at 120 epochs (``vit_x2``, ``vit_sam_x2``) by seed; ``registered``
    the same arms' registered runs at 60 epochs (``vit``, ``vit_sam``; their first schedule), for the gain from 60 to
    120 epochs on each seed; ``headline`` the headline claim as registered; ``earlier`` the folders of revision 3.1's
    runs, which revision 4 reuses where they are its own (the same arm, seed and settings); ``unseen`` the pair read
    at the seeds revision 4 had not seen (its new runs only)."""
    a, b = (arm.name for arm in LONG_ARMS)
    labels = {arm.name: arm.label for arm in LONG_ARMS}
    epochs = LONG_ARMS[0].epochs
    ms = [m for name in (a, b) for m in r_long[name]]
    reused = [m for m in ms if m.get('run') in set(earlier)]
    trained = [m for m in ms if m.get('run') not in set(earlier)]
    reused_seeds = sorted({m['seed'] for m in reused})
    rev = next(x for x in REVISIONS if x.name == '4')
    status, why = label(rev)
    lines = [f'## {ONE_SCHEDULE_TITLE}', '',
             f'Revision 4 of the plan trains {" and ".join(LONG_PAIR)}, nothing else changed, at {epochs} epochs (a '
             f'fresh cosine schedule over the {epochs}) for each of the {long.n} seeds the headline claim reads, '
             'through timm\'s train.py as before, and reads the pair once, by the verdict rule above, as a claim of '
             f'its own: whether SAM\'s gain at {VIT_EPOCHS} epochs lasts when both arms train twice as long, or was a '
             'faster start. '
             + (f'{len(trained)} of its {len(ms)} runs were trained for it, after it was committed; the other '
                f'{len(reused)}, at seed{"s" if len(reused_seeds) > 1 else ""} '
                f'{", ".join(map(str, reused_seeds))}, are '
                'revision 3.1\'s runs at exactly these settings, trained and read before revision 4 was written. '
                if reused else f'All {len(trained)} runs were trained for revision 4, after it was committed. ')
             + f'By the standard of [the revisions\' table](#revisions-and-what-each-had-seen) it is **{status}** '
             f'({why}). A run that misses the convergence rule is named, not replaced.', '',
             f'**{long.claim.text[:1].upper() + long.claim.text[1:]}** ({long.claim.paper}, {long.claim.source}). '
             f'{long.n} seeds, {len(trained)} runs new and {len(reused)} reused: {reading(long)}.'
             + (f' The {unseen.n} seeds revision 4 had not seen '
                f'({", ".join(str(m["seed"]) for m in r_long[a] if m["seed"] not in reused_seeds)}), its new runs '
                f'alone: {reading(unseen)}.' if unseen is not None and reused else '')
             + (f' As registered at {VIT_EPOCHS} epochs (revision 3): {reading(headline)}.' if headline else ''), '']
    for name in (a, b):
        top1 = [m['top1'] for m in r_long[name]]
        lines.append(f'- {labels[name]}: {mean_sd(top1)} ({seed_values(top1)})')
    lines += [f'- difference per seed: {", ".join(f"{round(d, 1) + 0.0:+.1f}" for d in long.diff.diffs)}', '']
    if registered and all(n in registered for n in LONG_PAIR):
        parts = []
        for short, name in zip(LONG_PAIR, (a, b)):
            by_seed = {m['seed']: m['top1'] for m in registered[short]}
            pairs = [(by_seed[m['seed']], m['top1']) for m in r_long[name] if m['seed'] in by_seed]
            d = paired_difference([x for x, _ in pairs], [y for _, y in pairs])
            parts.append(f'{labels[name].split(",")[0]} {format_difference(d, ".2f", " pt")} ({d.n} seeds)')
        lines += [f'Top-1 gained from {VIT_EPOCHS} to {epochs} epochs, same seed (the vit-sam paper\'s own test of '
                  'convergence, its App. H, shown here, not registered as a claim): ' + '; '.join(parts) + '.', '']
    lines.append('Converged (the rule above): ' + ', '.join(f'{labels[n]} {converged_cell(r_long[n])}' for n in (a, b))
                 + '; a run that misses it is named, not replaced.')
    new, old = spend(trained), spend(reused)
    if new:
        lines += ['', f'Revision 4: {new}; {cpu_of(trained)}.'
                  + (f' The reused runs, revision 3.1\'s: {old}; {cpu_of(reused)}.' if old else '')]
    return lines + ['']


def _more_seeds(ctx: Dict[str, Any]) -> List[str]:
    if not ctx['ext']:
        return []
    img = ([f'![each claim at 5 seeds and at its revision-3 seeds]({ctx["fig_link"]}/extended_claims.png)']
           if 'extended_claims.png' in ctx['figs'] else [])
    return more_seeds_section({**ctx['r'], **(ctx['r_ext'] or {})}, ctx['claims'], ctx['ext'], ctx['power'],
                              ctx['revision_time'], img, ctx['again'])


def _one_schedule(ctx: Dict[str, Any]) -> List[str]:
    if ctx['long'] is None or not ctx['r_long']:
        return []
    return one_schedule_section(ctx['r_long'], ctx['long'], first_schedules(ctx['r_ext'] or {}),
                                ctx['ext'].get('sam_vit_top1'), ctx['reused'], ctx['long_unseen'])


# a revision's section by its name; the report writes them in the plan's order
SECTIONS: Dict[str, Callable[[Dict[str, Any]], List[str]]] = {
    '3': _more_seeds,
    '4': _one_schedule,
    '5': lambda ctx: list(ctx['cost_gain']),
}


def revision_sections(names: Sequence[str], ctx: Dict[str, Any]) -> List[str]:
    """The sections of the revisions ``names`` (those the report is as of), in order, each from the same context."""
    return [line for name in names if name in SECTIONS for line in SECTIONS[name](ctx)]
