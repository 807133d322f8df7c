"""The report's revision-4 section: the ViT pair at 120 epochs for every seed, read once as a claim of its own.

Revision 4 of the plan trains vit and vit_sam at twice their schedule for each of the 16 seeds the headline claim
reads (``plan.LONG_SEEDS``; revision 3.1's three pairs of the same settings reused) and reads the pair once
(:func:`claims.evaluate_long`). This module writes what the report shows of it: the reading, the per-seed values,
the gain of each arm from 60 to 120 epochs on the same seed, the runs that miss the convergence rule (named, not
replaced), which runs were reused (so its registration label, and the reading at the seeds it had not seen) and
where the time went (wall-clock; CPU time where recorded).
"""
from typing import Any, Dict, List, Optional, Sequence

from claims import ClaimResult
from convergence_text import converged_cell
from extended_report import reading
from longer_schedules import LONG_ARMS
from plan import LONG_PAIR, VIT_EPOCHS
from registration import REVISIONS, label
from report_tables import mean_sd, seed_values
from run_results import Results
from run_times import cpu_of, spend

from timm_ext.analysis.stats import format_difference, paired_difference

__all__ = ['LONG_TITLE', 'long_section']

LONG_TITLE = 'One schedule for every seed: the ViT pair at 120 epochs (revision 4)'


def long_section(r_long: Results, long: ClaimResult, registered: Optional[Dict[str, List[Dict[str, Any]]]],
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
    lines = [f'## {LONG_TITLE}', '',
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
