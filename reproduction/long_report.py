"""The report's revision-4 section: the ViT pair at 120 epochs for every seed, read once as a claim of its own.

Revision 4 of the plan trains vit and vit_sam at twice their schedule for each of the 16 seeds the headline claim
reads (``plan.LONG_SEEDS``; revision 3.1's three pairs of the same settings reused) and reads the pair once
(:func:`claims.evaluate_long`). This module writes what the report shows of it: the reading, the per-seed values,
the gain of each arm from 60 to 120 epochs on the same seed, the runs that miss the convergence rule (named, not
replaced), which runs were reused and where the CPU time went.
"""
import time
from typing import Any, Dict, List, Optional, Sequence

from claims import ClaimResult
from extended_report import reading
from longer_schedules import LONG_ARMS
from measure_run import tail_gain
from plan import CONVERGED_TAIL, LONG_PAIR, VIT_EPOCHS
from report_tables import mean_sd, seed_values
from run_results import Results, timing_of

from timm_ext.analysis.stats import format_difference, paired_difference

__all__ = ['EARLIER_CPU', 'LONG_TITLE', 'cpu_of', 'long_section']

LONG_TITLE = 'One schedule for every seed: the ViT pair at 120 epochs (revision 4)'
# the runs before revision 4 recorded no CPU; the reports that published them (v3, revisions 3 and 3.1) named this one
EARLIER_CPU = 'AMD EPYC'


def cpu_of(runs: Sequence[Dict[str, Any]]) -> str:
    """The CPUs that trained ``runs``: each run's recorded one (``measure_run.py`` writes it since revision 4), else
    the one the earlier reports named."""
    names = sorted({m.get('cpu') or EARLIER_CPU for m in runs})
    return ' and '.join(names)


def long_section(r_long: Results, long: ClaimResult, registered: Optional[Dict[str, List[Dict[str, Any]]]],
                 headline: Optional[ClaimResult], cores: int, earlier: Sequence[str] = ()) -> List[str]:
    """The section: ``r_long`` holds the pair at 120 epochs (``vit_x2``, ``vit_sam_x2``) by seed; ``registered``
    the same arms' registered runs at 60 epochs (``vit``, ``vit_sam``; their first schedule), for the gain from 60 to
    120 epochs on each seed; ``headline`` the headline claim as registered; ``earlier`` the folders of revision 3.1's
    runs, which revision 4 reuses where they are its own (the same arm, seed and settings)."""
    a, b = (arm.name for arm in LONG_ARMS)
    labels = {arm.name: arm.label for arm in LONG_ARMS}
    epochs = LONG_ARMS[0].epochs
    ms = [m for name in (a, b) for m in r_long[name]]
    reused = [m for m in ms if m.get('run') in set(earlier)]
    trained = [m for m in ms if m.get('run') not in set(earlier)]
    reused_seeds = sorted({m['seed'] for m in reused})
    lines = [f'## {LONG_TITLE}', '',
             f'Revision 4 of the plan (committed before its runs) trains {" and ".join(LONG_PAIR)}, nothing else '
             f'changed, at {epochs} epochs (a fresh cosine schedule over the {epochs}) for each of the {long.n} seeds '
             f'the headline claim reads, through timm\'s train.py as before, and reads the pair once, by the verdict '
             'rule above, as a claim of its own: whether SAM\'s gain at '
             f'{VIT_EPOCHS} epochs is a gain at convergence or a faster convergence. '
             + (f'At seed{"s" if len(reused_seeds) > 1 else ""} {", ".join(map(str, reused_seeds))} revision 3.1 '
                f'trained these runs at exactly these settings; they are reused ({len(reused)} runs), and the other '
                f'{len(trained)} were trained for revision 4. ' if reused else
                f'All {len(trained)} runs were trained for revision 4. ')
             + 'A run that misses the convergence rule is named, not replaced.', '',
             f'**{long.claim.text[:1].upper() + long.claim.text[1:]}** ({long.claim.paper}, {long.claim.source}). '
             f'{long.n} seeds: {reading(long)}.'
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
    conv = {name: sum(bool(m['converged']) for m in r_long[name]) for name in (a, b)}
    missed = [f'{name} seed {m["seed"]} (+{tail_gain(m["top1_curve"]):.1f})' for name in (a, b)
              for m in r_long[name] if not m['converged']]
    lines.append(f'Converged (the rule above, last {CONVERGED_TAIL:.0%} of the epochs): '
                 + ', '.join(f'{labels[n]} {conv[n]}/{len(r_long[n])}' for n in (a, b)) + '.'
                 + (f' Runs that miss it (named, not replaced), with how many points their last {CONVERGED_TAIL:.0%} '
                    f'of epochs gained: {", ".join(missed)}.' if missed else ''))
    t, t_reused = timing_of(trained), timing_of(reused)
    if t:
        span = ' and '.join(time.strftime('%Y-%m-%d %H:%M', time.gmtime(t[k])) for k in ('first', 'last'))
        lines += ['', f'Revision 4 trained {t["runs"]} runs in {t["run_min"]:.0f} min one core each, training and '
                  f'measuring, between {span} UTC, on {cpu_of(trained)} ({cores} cores, 2 runs at a time)'
                  + (f'; the {t_reused["runs"]} reused runs took {t_reused["run_min"]:.0f} min on '
                     f'{cpu_of(reused)}' if t_reused else '') + '.']
    return lines + ['']
