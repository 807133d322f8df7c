"""The report's tables and summary lines: claims, accuracy of every run, supporting runs, convergence."""
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence

from claims import ClaimResult
from convergence_text import converged_cell
from convergence_text import missed as _missed
from earlier_verdicts import V2_VERDICTS
from measure_run import tail_gain
from plan import CONVERGED_TAIL, V1_VERDICTS, Arm, Claim
from run_results import Results
from supporting_runs import WARMUP_OF

from timm_ext.analysis.stats import format_difference


def mean_sd(values: Sequence[float], fmt: str = '.1f') -> str:
    values = list(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f'{statistics.fmean(values):{fmt}} ± {sd:{fmt}}'


def seed_values(values: Sequence[float], fmt: str = '.1f') -> str:
    return ', '.join(f'{v:{fmt}}' for v in values)


def claim_fmt(claim: Claim) -> str:
    return '.2f' if claim.unit == ' pt' else '.3f'


def claims_table(claims: List[ClaimResult], more: Optional[Dict[str, str]] = None,
                 sensitivity: Optional[Dict[str, str]] = None) -> List[str]:
    """One row per claim at the study's seeds, each run at its first schedule; ``more`` adds revision 3's column (more
    seeds), ``sensitivity`` the readings of post-hoc revisions (2.4, 3.1) that read seeds again, by claim key."""
    extra = (' more seeds (revision 3) |' if more is not None else '') + \
        (' sensitivity reading (a post-hoc revision) |' if sensitivity is not None else '')
    lines = ['| claim | paper, where | our effect: mean [95 % CI] | margin | seeds agree | verdict |' + extra
             + ' v2 (30 epochs) | v1 (6 epochs, 3 seeds) |', '|---|---|---|---|---|---|' + '---|' * extra.count('|')
             + '---|---|']
    for c in claims:
        cl = c.claim
        text = cl.text[:1].upper() + cl.text[1:]
        cell = (f' {more.get(cl.key, "")} |' if more is not None else '') + \
            (f' {sensitivity.get(cl.key, "")} |' if sensitivity is not None else '')
        lines.append(f'| {text} | {cl.paper}, {cl.source} | {format_difference(c.diff, claim_fmt(cl), cl.unit)} | '
                     f'±{cl.margin:g}{cl.unit} | {c.agree}/{c.n} | **{c.label}** |{cell} '
                     f'{V2_VERDICTS.get(cl.key, "not measured")} | {V1_VERDICTS.get(cl.key, "not measured")} |')
    return lines


def retrained(name: str, m: Dict[str, Any]) -> str:
    """A seed trained again at a longer schedule: each schedule's epochs and its gain in the last epochs."""
    def gain(x: Dict[str, Any]) -> str:
        return f'{len(x["top1_curve"])} epochs ({tail_gain(x["top1_curve"]):+.1f})'

    final = f'{len(m["top1_curve"])} ({tail_gain(m["top1_curve"]):+.1f})'
    return f'{name} seed {m["seed"]}: {", ".join(gain(x) for x in m["replaced"])} -> {final}'


def not_converged(r_first: Results, r_final: Results, arms: Sequence[Arm]) -> List[str]:
    """The runs that miss the convergence rule at their first schedule, named with their gain in the last epochs, and
    the seeds revision 2.4 trained again (its reading is a sensitivity reading: it was written after seed 2 missed)."""
    missed = [name for arm in arms if arm.name in r_first for name in _missed(r_first[arm.name], arm.name)]
    again = [retrained(arm.name, m) for arm in arms if arm.name in r_final for m in r_final[arm.name]
             if 'replaced' in m]
    lines = [f'Runs that miss the rule at their first schedule, with how many points the best top-1 of their last '
             f'{CONVERGED_TAIL:.0%} of epochs gained over the best before: {", ".join(missed)}. The first readings '
             'read them as they are: measured on models still improving.', ''] if missed else []
    if again:
        lines += [f'Trained again at twice the schedule (revision 2.4: both stems of a seed, where a run of the lr '
                  f'sweep\'s pair misses the rule; written after seed 2 missed, so its reading is a sensitivity '
                  f'reading), with each run\'s gain in its last {CONVERGED_TAIL:.0%} of epochs: {"; ".join(again)}. '
                  'Both runs of each seed are kept in the cache and in measurements.json (the first under '
                  '`replaced`).', '']
    return lines


def support_table(r: Results, arms: Sequence[Arm]) -> List[str]:
    """The supporting runs: what they are, their top-1, and for end-of-warmup runs whether they repeat the
    first epoch of their full run (same top-1 in every seed)."""
    lines = ['| supporting run | model | epochs | training data | top-1, last epoch | converged | same first epoch '
             'as |',
             '|---|---|---|---|---|---|---|']
    for arm in arms:
        if arm.name not in r:
            continue
        ms = r[arm.name]
        full = WARMUP_OF.get(arm.name)
        same = ''
        if full and full in r:
            equal = sum(abs(m['top1_curve'][0] - f['top1_curve'][0]) < 1e-6 for m, f in zip(ms, r[full]))
            same = f'`{full}`: {equal}/{len(ms)} seeds'
        lines.append(f'| {arm.label} | `{arm.model}` | {arm.epochs} | {arm.fraction:g} | '
                     f'{mean_sd([m["top1"] for m in ms])} % | {converged_cell(ms)} | {same} |')
    return lines


def schedule_text(ms: Sequence[Dict[str, Any]]) -> str:
    """The schedule of an arm's runs: one number, or the first seed's and each seed that trained longer."""
    lengths = [len(m['top1_curve']) for m in ms]
    other = [f'seed {m["seed"]}: {n}' for m, n in zip(ms, lengths) if n != lengths[0]]
    return f'{lengths[0]}' + (f' ({", ".join(other)})' if other else '')


def accuracy_table(r: Results, arms: Sequence[Arm]) -> List[str]:
    lines = ['| arm | model | optimizer | lr | training data | epochs | top-1, last epoch | per seed | converged | '
             'final train loss |', '|---|---|---|---|---|---|---|---|---|---|']
    for arm in arms:
        if arm.name not in r:
            continue
        ms = r[arm.name]
        top1 = [m['top1'] for m in ms]
        lines.append(f'| {arm.label} | `{arm.model}` | {arm.opt} | {arm.lr:g} | {arm.fraction:g} | '
                     f'{schedule_text(ms)} | {mean_sd(top1)} % | {seed_values(top1)} | {converged_cell(ms)} | '
                     f'{mean_sd([m["train_loss_curve"][-1] for m in ms], ".3f")} |')
    return lines


def per_seed_row(r: Results, arm: str, fn: Callable[[Dict[str, Any]], float], fmt: str = '.3f') -> str:
    values = [fn(m) for m in r[arm]]
    return f'{mean_sd(values, fmt)} ({seed_values(values, fmt)})'
