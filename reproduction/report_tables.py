"""The report's tables and summary lines: claims, accuracy of every run, supporting runs, convergence."""
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence

from claims import ClaimResult
from earlier_verdicts import V2_VERDICTS
from measure_run import tail_gain
from plan import CONVERGED_TAIL, V1_VERDICTS, Arm, Claim
from run_results import Results
from supporting_runs import WARMUP_OF

from timm_ext.analysis.stats import format_difference, paired_difference

TOP1_MARGIN = 1.0  # points: the top-1 claims' margin, also what "no gain" from a longer schedule means here
# the vit-sam paper's test of convergence (App. H: a 2x schedule brings no gain): (label, shorter run, the arm)
DOUBLED = (('ViT', 'vit_e30', 'vit'), ('ViT + CB', 'vit_cb_e30', 'vit_cb'), ('ViT conv stem', 'vit_convstem_e30',
                                                                              'vit_convstem'))


def mean_sd(values: Sequence[float], fmt: str = '.1f') -> str:
    values = list(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f'{statistics.fmean(values):{fmt}} ± {sd:{fmt}}'


def seed_values(values: Sequence[float], fmt: str = '.1f') -> str:
    return ', '.join(f'{v:{fmt}}' for v in values)


def claim_fmt(claim: Claim) -> str:
    return '.2f' if claim.unit == ' pt' else '.3f'


def claims_table(claims: List[ClaimResult], more: Optional[Dict[str, str]] = None) -> List[str]:
    """One row per claim at the study's seeds; ``more`` adds revision 3's column (more seeds), by claim key."""
    extra = ' more seeds (revision 3) |' if more is not None else ''
    lines = ['| claim | paper, where | our effect: mean [95 % CI] | margin | seeds agree | verdict |' + extra
             + ' v2 (30 epochs) | v1 (6 epochs, 3 seeds) |', '|---|---|---|---|---|---|' + ('---|' if extra else '')
             + '---|---|']
    for c in claims:
        cl = c.claim
        text = cl.text[:1].upper() + cl.text[1:]
        cell = f' {more.get(cl.key, "")} |' if more is not None else ''
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


def not_converged(r: Results, arms: Sequence[Arm]) -> List[str]:
    """One line naming every run that misses the convergence rule, with its gain in the last epochs."""
    missed = [f'{arm.name} seed {m["seed"]} (+{tail_gain(m["top1_curve"]):.1f})' for arm in arms if arm.name in r
              for m in r[arm.name] if not m['converged']]
    again = [retrained(arm.name, m) for arm in arms if arm.name in r for m in r[arm.name] if 'replaced' in m]
    lines = [f'Trained again at twice the schedule (revision 2.4: both stems of a seed, where a run of the lr sweep\'s '
             f'pair misses the rule), with the replaced runs\' gain in their last {CONVERGED_TAIL:.0%} of epochs: '
             f'{"; ".join(again)}. The replaced runs are kept in the cache and in measurements.json (`replaced`).',
             ''] if again else []
    if not missed:
        return lines
    return lines + [
        f'Runs that miss the rule, with how many points the best top-1 of their last {CONVERGED_TAIL:.0%} of '
        f'epochs gained over the best before: {", ".join(missed)}. The claims that read these runs are therefore '
        'measured on models still improving, by the rule fixed before the runs.', '']


def doubling_line(r: Results) -> str:
    """The vit-sam paper's own test of convergence (App. H: a 2x schedule brings no gain), per seed."""
    parts, gained, flat = [], [], []
    for label, short, full in DOUBLED:
        if short in r and full in r:
            d = paired_difference([m['top1'] for m in r[short]], [m['top1'] for m in r[full]])
            parts.append(f'{label} {len(r[short][0]["top1_curve"])} -> {len(r[full][0]["top1_curve"])} epochs '
                         f'{format_difference(d, ".2f", " pt")}')
            if d.low > TOP1_MARGIN:
                gained.append(label)
            elif d.high < TOP1_MARGIN:
                flat.append(label)
    if not parts:
        return ''
    text = ('The vit-sam paper\'s own test of convergence is that a schedule twice as long brings no gain (its '
            'App. H); top-1 gained by doubling, same seed: ' + '; '.join(parts) + '.')
    if gained:
        text += (f' By that test the 30-epoch schedule was not enough for: {", ".join(gained)} (gain above '
                 f'{TOP1_MARGIN:g} point in the whole interval); whether 60 is, only a 120-epoch schedule would tell, '
                 'beyond this study\'s budget.')
    if flat:
        text += f' For {", ".join(flat)} 30 epochs were already enough (gain below {TOP1_MARGIN:g} point).'
    return text


def support_table(r: Results, arms: Sequence[Arm]) -> List[str]:
    """The supporting runs: what they are, their top-1, and for end-of-warmup runs whether they repeat the
    first epoch of their full run (same top-1 in every seed)."""
    lines = ['| supporting run | model | epochs | training data | top-1, last epoch | same first epoch as |',
             '|---|---|---|---|---|---|']
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
                     f'{mean_sd([m["top1"] for m in ms])} % | {same} |')
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
        conv = sum(bool(m['converged']) for m in ms)
        lines.append(f'| {arm.label} | `{arm.model}` | {arm.opt} | {arm.lr:g} | {arm.fraction:g} | '
                     f'{schedule_text(ms)} | {mean_sd(top1)} % | {seed_values(top1)} | {conv}/{len(ms)} | '
                     f'{mean_sd([m["train_loss_curve"][-1] for m in ms], ".3f")} |')
    return lines


def per_seed_row(r: Results, arm: str, fn: Callable[[Dict[str, Any]], float], fmt: str = '.3f') -> str:
    values = [fn(m) for m in r[arm]]
    return f'{mean_sd(values, fmt)} ({seed_values(values, fmt)})'
