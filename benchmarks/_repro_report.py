"""docs/reproduction.md from the study's cached measurements: the claims table first, then the evidence.

Each claim of ``_repro_plan.CLAIMS`` becomes a paired difference over the seeds with its 95 % t
interval (:func:`timm_ext.analysis.stats.paired_difference`) and a verdict by the rule fixed before
the runs (:func:`timm_ext.analysis.stats.verdict`; "unchanged" claims by :func:`unchanged_verdict`).
Plots draw every seed. ``measurements.json`` keeps every number and every run's train.py settings.
"""
import json
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import yaml
from _repro_extend import tried
from _repro_history import V2_VERDICTS
from _repro_measure import MEASURE_FILE, tail_gain
from _repro_plan import (
    ARMS,
    CLAIMS,
    CONVERGED_GAIN,
    CONVERGED_TAIL,
    EPOCHS,
    SAM_RHO,
    V1_VERDICTS,
    VIT_EPOCHS,
    Arm,
    Claim,
)
from _timing import cpu_name

from timm_ext.analysis.stats import VERDICT_RULE, PairedDifference, format_difference, paired_difference, verdict

Results = Dict[str, List[Dict[str, Any]]]
FIGS = 'reproduction'
# the learning rates of the scaled-ReLU comparison: (lr, patchify arm, conv-stem arm)
STEM_LRS = (('1e-3', 'vit', 'vit_convstem'), ('1.5e-3', 'vit_lr1.5e-3', 'vit_convstem_lr1.5e-3'))
TOP1_MARGIN = 1.0  # points: the top-1 claims' margin, also what "no gain" from a longer schedule means here
# the vit-sam paper's test of convergence (App. H: a 2x schedule brings no gain): (label, shorter run, the arm)
DOUBLED = (('ViT', 'vit_e30', 'vit'), ('ViT + CB', 'vit_cb_e30', 'vit_cb'), ('ViT conv stem', 'vit_convstem_e30',
                                                                              'vit_convstem'))


def load_results(runs: Path, arms: Sequence[Arm], seeds: Sequence[int]) -> Results:
    """Every run's measurements (and its train.py settings from ``args.yaml``), by arm, in seed order."""
    out: Results = {}
    for arm in arms:
        for seed in seeds:
            runs_tried = [_load_run(d) for d in tried(runs, arm.name, seed)]  # revision 2.4: the shorter ones too
            m = runs_tried[-1]
            if len(runs_tried) > 1:
                m['replaced'] = runs_tried[:-1]
            out.setdefault(arm.name, []).append(m)
    return out


def _load_run(run_dir: Path) -> Dict[str, Any]:
    m = json.loads((run_dir / MEASURE_FILE).read_text())
    m['run'] = run_dir.name
    args_file = run_dir / 'args.yaml'
    if args_file.is_file():
        m['train_args'] = yaml.safe_load(args_file.read_text())
    return m


def study_timing(runs: Path, arms: Sequence[Arm], seeds: Sequence[int]) -> Dict[str, float]:
    """When the cached runs were made, from their files: the first run's start (train.py's ``args.yaml``) to the last
    measurement, and the sum over runs of training (``args.yaml`` to the last ``summary.csv`` row) and measuring
    (the measurement's own clock), one core each. A cache filled by several studies (cached runs reused, runs
    measured again) spans all of them, so the report states the span, not a study's duration."""
    starts, ends, busy = [], [], 0.0
    for d in (d for arm in arms for seed in seeds for d in tried(runs, arm.name, seed)):
        start = (d / 'args.yaml').stat().st_mtime
        starts.append(start)
        ends.append((d / MEASURE_FILE).stat().st_mtime)
        busy += max(0.0, (d / 'summary.csv').stat().st_mtime - start)
        busy += float(json.loads((d / MEASURE_FILE).read_text()).get('measure_wall_s', 0.0))
    return dict(wall_min=(max(ends) - min(starts)) / 60, run_min=busy / 60, runs=len(starts), first=min(starts),
                last=max(ends))


def _deep_layers(r: Results) -> List[int]:
    """The CB layers of ``vit_cb`` (0-based): where the CB paper reads the entropy and distance."""
    layers = r['vit_cb'][0].get('cb_layers') if 'vit_cb' in r else None
    return list(layers) if layers else [len(r['vit'][0]['entropy']) - 1]


def _mean_over(values: Sequence[float], idx: Sequence[int]) -> float:
    return statistics.fmean(values[i] for i in idx)


def _msa_mean(m: Dict[str, Any], fn: Callable[[Dict[str, Any], str], float]) -> float:
    blocks = [n for n, k in m['kinds'].items() if k == 'msa' and n in m['variance_ratio']]
    return statistics.fmean(fn(m, b) for b in blocks)


def _delta_pi(m: Dict[str, Any], block: str) -> float:
    names = list(m['fourier_at_pi'])
    prev = names[names.index(block) - 1]
    return m['fourier_at_pi'][block] - m['fourier_at_pi'][prev]


def _early_epoch(m: Dict[str, Any]) -> int:
    """The epoch (1-based) at 1/10 of the run: the scaled-ReLU paper's epoch 5 of 300 is earlier still."""
    return max(1, int(round(len(m['top1_curve']) / 10)))


def metric_fn(name: str, r: Results) -> Callable[[Dict[str, Any]], float]:
    """The per-run quantity ``name`` of a claim."""
    deep = _deep_layers(r) if 'vit' in r else []
    fns: Dict[str, Callable[[Dict[str, Any]], float]] = {
        'top1': lambda m: m['top1'],
        'top1_early': lambda m: m['top1_curve'][_early_epoch(m) - 1],
        'log_lambda_max': lambda m: math.log(m['lambda_max']),
        'noisy_loss': lambda m: m['noisy_loss'],
        'active_first': lambda m: next(iter(m['activity'].values())),
        'token_similarity_stem': lambda m: m['tokens']['patch_embed'],
        'entropy_cls_deep': lambda m: _mean_over(m['cls_entropy'], deep),
        'entropy_all_deep': lambda m: _mean_over(m['entropy'], deep),
        'distance_deep': lambda m: _mean_over(m['distance'], deep),
        'msa_log_variance_ratio': lambda m: _msa_mean(m, lambda mm, b: math.log(mm['variance_ratio'][b])),
        'msa_delta_pi': lambda m: _msa_mean(m, _delta_pi),
        'nep': lambda m: m['nep'],
        'log_ape': lambda m: math.log(m['ape']),
    }
    return fns[name]


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

    @property
    def n(self) -> int:
        return self.diff.n


def _arms_of(side: Any) -> List[str]:
    return [] if side is None else list(side) if isinstance(side, tuple) else [side]


def evaluate(r: Results) -> List[ClaimResult]:
    """Every claim whose arms were run, in ``CLAIMS`` order."""
    out = []
    for claim in CLAIMS:
        if not all(a in r for a in _arms_of(claim.a) + _arms_of(claim.b)):
            continue
        n = len(r[_arms_of(claim.b)[0]])
        diff = paired_difference(side_values(r, claim.a, claim.metric, n), side_values(r, claim.b, claim.metric, n))
        if claim.direction == 'unchanged':
            label, agree = unchanged_verdict(diff, claim.margin)
        else:
            v = verdict(diff, claim.direction, claim.margin)
            label, agree = v.label, v.agree
        out.append(ClaimResult(claim, diff, label, agree))
    return out


# --- text helpers -------------------------------------------------------------------------------------------------

def _ms(values: Sequence[float], fmt: str = '.1f') -> str:
    values = list(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f'{statistics.fmean(values):{fmt}} ± {sd:{fmt}}'


def _seeds(values: Sequence[float], fmt: str = '.1f') -> str:
    return ', '.join(f'{v:{fmt}}' for v in values)


def _fmt(claim: Claim) -> str:
    return '.2f' if claim.unit == ' pt' else '.3f'


def _plan_commit() -> str:
    """The commit that last changed ``_repro_plan.py`` (the pre-registration), or '?' outside git."""
    try:
        return subprocess.run(['git', 'log', '-1', '--format=%h %cs', '--', 'benchmarks/_repro_plan.py'],
                              capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
                              timeout=10).stdout.strip() or '?'
    except (OSError, subprocess.SubprocessError):
        return '?'


def _version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return '?'


# --- plots ---------------------------------------------------------------------------------------------------------

def draw_plots(r: Results, claims: List[ClaimResult], figs: Path, labels: Dict[str, str]) -> List[str]:
    """The report's PNGs (every seed drawn); returns their file names."""
    from timm_ext.analysis import plots as P

    figs.mkdir(parents=True, exist_ok=True)
    made = []

    def seeds(key: str, *arms: str, sub: Optional[Callable[[Any], List[float]]] = None) -> Dict[str, List[Any]]:
        return {labels[a]: [sub(m[key]) if sub else m[key] for m in r[a]] for a in arms if a in r}

    def save(name: str, values: Dict[str, List[Any]], title: str, ylabel: str, **kw: Any) -> None:
        if values:
            P.plot_seed_curves(values, figs / f'{name}.png', title, ylabel, every_seed=True, **kw)
            made.append(f'{name}.png')

    rows = [(f'{c.claim.key}', c.diff.diffs, c.diff.low, c.diff.high, c.claim.margin) for c in claims]
    flipped = []
    for key, diffs, low, high, margin in rows:  # show every claim so that "the paper's way" is to the right
        sign = -1.0 if next(c for c in claims if c.claim.key == key).claim.direction == 'decrease' else 1.0
        lo, hi = sorted((sign * low, sign * high))
        flipped.append((key, [sign * d for d in diffs], lo, hi, margin))
    P.plot_paired_differences(flipped, figs / 'claims.png',
                              title='Each claim: per-seed difference (dots) and 95 % interval (bar)',
                              xlabel='difference / margin, signed so that the paper\'s direction is positive')
    made.append('claims.png')
    for lr, a, b in STEM_LRS:
        if a in r and b in r:
            first = lambda m: m.get('replaced', [m])[0]['top1_curve']  # noqa: E731  (every seed's first schedule)
            n = len(first(r[a][0]))
            longer = ' (each seed\'s first schedule; the longer ones are in measurements.json)' if any(
                'replaced' in m for m in r[a] + r[b]) else ''
            save(f'stem_top1_lr{lr}', {labels[x]: [first(m) for m in r[x]] for x in (a, b)},
                 f'Validation top-1 per epoch, AdamW lr {lr}, 1 warmup epoch, {n} epochs{longer}', 'top-1 (%)',
                 xlabels=list(range(1, n + 1)), xlabel='epoch')
    if 'vit' in r:
        save('stem_tokens', {labels[a]: [list(m['tokens'].values()) for m in r[a]] for a in ('vit', 'vit_convstem')
                             if a in r}, 'Token cosine similarity per layer (scaled-ReLU Fig. 1)', 'cosine similarity',
             xlabels=list(r['vit'][0]['tokens']))
        layers = list(range(1, len(r['vit'][0]['entropy']) + 1))
        cb = ('vit', 'vit_cb', 'vit_cb_all')
        save('cb_cls_entropy', seeds('cls_entropy', *cb), 'Class-token attention entropy per layer (CB Fig. 7a)',
             'entropy (nats)', xlabels=layers, xlabel='layer')
        save('cb_entropy', seeds('entropy', *cb), 'Attention entropy per layer, all queries', 'entropy (nats)',
             xlabels=layers, xlabel='layer')
        save('cb_distance', seeds('distance', *cb), 'Mean attention distance per layer (CB Fig. 7b)',
             'distance (grid side = 1)', xlabels=layers, xlabel='layer')
        act = ('vit', 'vit_sam', 'vit_quarter', 'vit_sam_quarter')
        save('sam_activity', {labels[a]: [list(m['activity'].values()) for m in r[a]] for a in act if a in r},
             'Share of active GELU neurons per block, training images (vit-sam Fig. 2)', 'share > 0',
             xlabels=[n.replace('.mlp.act', '') for n in r['vit'][0]['activity']])
    fractions = [('vit_quarter', 'vit_sam_quarter', '1/4'), ('vit_half', 'vit_sam_half', '1/2'),
                 ('vit', 'vit_sam', '1')]
    if all(a in r and b in r for a, b, _ in fractions):
        values = {'ViT + AdamW': [[r[a][i]['top1'] for a, _, _ in fractions] for i in range(len(r['vit']))],
                  'ViT + SAM': [[r[b][i]['top1'] for _, b, _ in fractions] for i in range(len(r['vit']))]}
        save('sam_top1_fraction', values, 'Top-1 against the share of training data (vit-sam Table 5)', 'top-1 (%)',
             xlabels=[f for _, _, f in fractions], xlabel='training data')
    for arm in ('resnet', 'alternet', 'vit'):
        if arm in r and 'variance' in r[arm][0]:
            names = list(r[arm][0]['variance'])
            save(f'{arm}_variance', {labels[arm]: [list(m['variance'].values()) for m in r[arm]]},
                 f'Feature-map variance, {labels[arm]} (MSA shaded; how-do-vits-work Fig. 9)', 'variance',
                 xlabels=names, kinds=[r[arm][0]['kinds'][n] for n in names], log=True)
    spectra = {labels[a]: [v for m in r[a] for batch in m['spectrum'] for v in batch]
               for a in ('resnet', 'alternet', 'vit', 'vit_quarter') if a in r and 'spectrum' in r[a][0]}
    if spectra:
        P.plot_eigenvalues(spectra, figs / 'hessian_spectrum.png',
                           title='Hessian max eigenvalue spectra, top-5 per batch of 16 (Fig. 4)')
        made.append('hessian_spectrum.png')
    warmup = {labels[a]: [v for m in r[a] for batch in m['spectrum'] for v in batch]
              for a in ('resnet_warmup', 'alternet_warmup', 'vit_warmup', 'vit_quarter_warmup') if a in r}
    if warmup:
        P.plot_eigenvalues(warmup, figs / 'hessian_spectrum_warmup.png',
                           title='Hessian max eigenvalue spectra at the end of warmup (epoch 1)')
        made.append('hessian_spectrum_warmup.png')
    return made


# --- the Markdown --------------------------------------------------------------------------------------------------

def _claims_table(claims: List[ClaimResult]) -> List[str]:
    lines = ['| claim | paper, where | our effect: mean [95 % CI] | margin | seeds agree | verdict | v2 (30 epochs) '
             '| v1 (6 epochs, 3 seeds) |', '|---|---|---|---|---|---|---|---|']
    for c in claims:
        cl = c.claim
        text = cl.text[:1].upper() + cl.text[1:]
        lines.append(f'| {text} | {cl.paper}, {cl.source} | {format_difference(c.diff, _fmt(cl), cl.unit)} | '
                     f'±{cl.margin:g}{cl.unit} | {c.agree}/{c.n} | **{c.label}** | '
                     f'{V2_VERDICTS.get(cl.key, "not measured")} | {V1_VERDICTS.get(cl.key, "not measured")} |')
    return lines


def _not_converged(r: Results, arms: Sequence[Arm]) -> List[str]:
    """One line naming every run that misses the convergence rule, with its gain in the last epochs."""
    missed = [f'{arm.name} seed {m["seed"]} (+{tail_gain(m["top1_curve"]):.1f})' for arm in arms if arm.name in r
              for m in r[arm.name] if not m['converged']]
    again = [f'{arm.name} seed {m["seed"]}: ' + ', '.join(f'{len(x["top1_curve"])} epochs '
                                                         f'({tail_gain(x["top1_curve"]):+.1f})' for x in m['replaced'])
             + f' -> {len(m["top1_curve"])}' for arm in arms if arm.name in r for m in r[arm.name] if 'replaced' in m]
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


def _doubling_line(r: Results) -> str:
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


def _support_table(r: Results, arms: Sequence[Arm]) -> List[str]:
    """The supporting runs: what they are, their top-1, and for end-of-warmup runs whether they repeat the
    first epoch of their full run (same top-1 in every seed)."""
    from _repro_support import WARMUP_OF

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
                     f'{_ms([m["top1"] for m in ms])} % | {same} |')
    return lines


def _epochs(ms: Sequence[Dict[str, Any]]) -> str:
    """The schedule of an arm's runs: one number, or the first seed's and each seed that trained longer."""
    lengths = [len(m['top1_curve']) for m in ms]
    other = [f'seed {m["seed"]}: {n}' for m, n in zip(ms, lengths) if n != lengths[0]]
    return f'{lengths[0]}' + (f' ({", ".join(other)})' if other else '')


def _accuracy_table(r: Results, arms: Sequence[Arm]) -> List[str]:
    lines = ['| arm | model | optimizer | lr | training data | epochs | top-1, last epoch | per seed | converged | '
             'final train loss |', '|---|---|---|---|---|---|---|---|---|---|']
    for arm in arms:
        if arm.name not in r:
            continue
        ms = r[arm.name]
        top1 = [m['top1'] for m in ms]
        conv = sum(bool(m['converged']) for m in ms)
        lines.append(f'| {arm.label} | `{arm.model}` | {arm.opt} | {arm.lr:g} | {arm.fraction:g} | {_epochs(ms)} | '
                     f'{_ms(top1)} % | {_seeds(top1)} | {conv}/{len(ms)} | '
                     f'{_ms([m["train_loss_curve"][-1] for m in ms], ".3f")} |')
    return lines


def _per_seed_row(r: Results, arm: str, fn: Callable[[Dict[str, Any]], float], fmt: str = '.3f') -> str:
    values = [fn(m) for m in r[arm]]
    return f'{_ms(values, fmt)} ({_seeds(values, fmt)})'


def _sections(r: Results, claims: Dict[str, ClaimResult], labels: Dict[str, str], figs: List[str]) -> List[str]:
    lines: List[str] = []
    add = lines.extend

    def img(name: str, alt: str) -> List[str]:
        return [f'![{alt}]({FIGS}/{name})'] if name in figs else []

    def claim_line(key: str) -> str:
        c = claims.get(key)
        if c is None:
            return ''
        text = c.claim.text[:1].upper() + c.claim.text[1:]
        return (f'{text}: {format_difference(c.diff, _fmt(c.claim), c.claim.unit)}, {c.agree}/{c.n} seeds '
                f'agree: **{c.label}**.')

    if 'vit' in r and 'vit_sam' in r:
        add(['## vit-sam: SAM on a ViT and a ResNet, with less data', ''])
        rows = [('ViT, all data', 'vit', 'vit_sam'), ('ViT, 1/2', 'vit_half', 'vit_sam_half'),
                ('ViT, 1/4', 'vit_quarter', 'vit_sam_quarter'), ('ResNet-18/4, all data', 'resnet', 'resnet_sam')]
        add(['| setting | AdamW top-1 | SAM top-1 | SAM - AdamW, mean [95 % CI] | seeds agree |',
             '|---|---|---|---|---|'])
        for name, a, b in rows:
            if a in r and b in r:
                d = paired_difference([m['top1'] for m in r[a]], [m['top1'] for m in r[b]])
                up = sum(x > 0 for x in d.diffs)
                add([f'| {name} | {_ms([m["top1"] for m in r[a]])} | {_ms([m["top1"] for m in r[b]])} | '
                     f'{format_difference(d, ".2f", " pt")} | {up}/{d.n} higher |'])
        add(['', *img('sam_top1_fraction.png', 'top-1 against data'), ''])
        add(['Table 1 and Fig. 2 quantities on the ViT (64 training images; `lambda_max` by power iteration, '
             '`L_train^N` over 10 draws of Gaussian weight noise of std 0.05, the paper does not give its sigma):', '',
             '| | ViT + AdamW | ViT + SAM |', '|---|---|---|'])
        for name, fn in (('`lambda_max`', lambda m: m['lambda_max']), ('`L_train` (clean)', lambda m: m['train_loss']),
                         ('`L_train^N`', lambda m: m['noisy_loss']),
                         ('active neurons, block 1', lambda m: next(iter(m['activity'].values())))):
            add([f'| {name} | {_per_seed_row(r, "vit", fn)} | {_per_seed_row(r, "vit_sam", fn)} |'])
        add(['', *[claim_line(k) for k in ('sam_lambda_max', 'sam_noisy_loss', 'sam_active_neurons') if k in claims],
             '', *img('sam_activity.png', 'active neurons per block'), ''])
    if 'vit_convstem' in r:
        add(['## scaled-relu: the conv stem against patchify over learning rates', ''])
        add(['| lr (AdamW, 1 warmup epoch) | epochs | patchify top-1 | conv stem top-1 | patchify runs below 20 % | '
             'conv - patchify, mean [95 % CI] |', '|---|---|---|---|---|---|'])
        for lr, a, b in STEM_LRS:
            if a in r and b in r:
                pa, pb = [m['top1'] for m in r[a]], [m['top1'] for m in r[b]]
                add([f'| {lr} | {_epochs(r[a])} | {_ms(pa)} ({_seeds(pa)}) | {_ms(pb)} ({_seeds(pb)}) | '
                     f'{sum(v < 20 for v in pa)}/{len(pa)} | '
                     f'{format_difference(paired_difference(pa, pb), ".2f", " pt")} |'])
        e = _early_epoch(r['vit'][0])
        add(['', f'Early convergence, top-1 after epoch {e} of {len(r["vit"][0]["top1_curve"])} at lr 1e-3: patchify '
             f'{_per_seed_row(r, "vit", lambda m: m["top1_curve"][e - 1], ".1f")}, conv stem '
             f'{_per_seed_row(r, "vit_convstem", lambda m: m["top1_curve"][e - 1], ".1f")}. '
             f'{claim_line("stem_early")}', ''])
        add([*img('stem_top1_lr1e-3.png', 'top-1 per epoch, lr 1e-3'), *img('stem_top1_lr1.5e-3.png', 'lr 1.5e-3'),
             ''])
        stem = lambda m: m['tokens']['patch_embed']  # noqa: E731
        add([f'Token similarity after the stem: patchify {_per_seed_row(r, "vit", stem)}'
             f', conv stem {_per_seed_row(r, "vit_convstem", stem)}. '
             f'{claim_line("stem_tokens")}', '', *img('stem_tokens.png', 'token similarity per layer'), ''])
    if 'vit_cb' in r:
        deep = _deep_layers(r)
        add(['## context-broadcasting: attention entropy and distance on converged models', ''])
        add([f'Entropy (nats) of the attention rows in the CB layers ({", ".join(str(i + 1) for i in deep)} of '
             f'{len(r["vit"][0]["entropy"])}), averaged over heads and 128 validation images; the uniform bound is '
             f'log 17 = {r["vit"][0]["max_entropy"]:.2f}. The dose-response arm puts CB in every block.', '',
             '| | class token, CB layers | all queries, CB layers | all queries, every layer | distance, CB layers '
             '| top-1 |', '|---|---|---|---|---|---|'])
        for arm in ('vit', 'vit_cb', 'vit_cb_all'):
            if arm in r:
                add([f'| {labels[arm]} | {_per_seed_row(r, arm, lambda m: _mean_over(m["cls_entropy"], deep))} | '
                     f'{_per_seed_row(r, arm, lambda m: _mean_over(m["entropy"], deep))} | '
                     f'{_per_seed_row(r, arm, lambda m: statistics.fmean(m["entropy"]))} | '
                     f'{_per_seed_row(r, arm, lambda m: _mean_over(m["distance"], deep))} | '
                     f'{_ms([m["top1"] for m in r[arm]])} |'])
        add(['', *[claim_line(k) for k in ('cb_entropy_cls', 'cb_entropy_all', 'cb_distance', 'cb_top1')], ''])
        add([*img('cb_cls_entropy.png', 'class-token entropy per layer'), *img('cb_entropy.png', 'entropy per layer'),
             *img('cb_distance.png', 'distance per layer'), ''])
    if 'alternet' in r and 'resnet' in r:
        add(['## how-do-vits-work: MSAs as low-pass filters, feature-map variance, Hessian spectra', ''])
        add(['Per block, the log of the feature-map variance after it over the variance before it (the official '
             '`featuremap_variance.ipynb`: spatial variance per image and channel, averaged), and the change of the '
             'Delta log amplitude at pi over the block (`fourier_analysis.ipynb`), on 128 validation images.', '',
             '| model | blocks | log variance ratio, mean over blocks | ratio < 1 | change of Delta at pi |',
             '|---|---|---|---|---|'])
        for arm in ('resnet', 'alternet', 'vit'):
            if arm not in r or 'kinds' not in r[arm][0]:
                continue
            kinds = r[arm][0]['kinds']
            for kind in ('msa', 'mlp', 'conv'):
                blocks = [n for n, k in kinds.items() if k == kind and n in r[arm][0]['variance_ratio']]
                if not blocks:
                    continue
                logs = [statistics.fmean(math.log(m['variance_ratio'][b]) for b in blocks) for m in r[arm]]
                below = sum(m['variance_ratio'][b] < 1 for m in r[arm] for b in blocks)
                dpi = [statistics.fmean(_delta_pi(m, b) for b in blocks) for m in r[arm]]
                add([f'| {labels[arm]} | {kind} ({len(blocks)}) | {_ms(logs, ".3f")} | '
                     f'{below}/{len(blocks) * len(r[arm])} | {_ms(dpi, ".3f")} |'])
        add(['', claim_line('msa_variance'), claim_line('msa_lowpass'), ''])
        add([*img('alternet_variance.png', 'variance, AlterNet'), *img('resnet_variance.png', 'variance, ResNet'),
             *img('vit_variance.png', 'variance, ViT'), ''])
        add(['Hessian max eigenvalue spectra as the paper\'s issue #12 describes them (top-5 eigenvalues of each '
             'mini-batch of 16 training images by power iteration, L2 of weight decay 0.05 added, 4 batches a run, '
             'pooled over the seeds). NEP: share of negative eigenvalues; APE: mean of the positive ones.', '',
             '| model | NEP | APE | `lambda_max` (64 images) |', '|---|---|---|---|'])
        for arm in ('resnet', 'alternet', 'vit', 'vit_quarter'):
            if arm in r and 'nep' in r[arm][0]:
                add([f'| {labels[arm]} | {_per_seed_row(r, arm, lambda m: m["nep"])} | '
                     f'{_per_seed_row(r, arm, lambda m: m["ape"], ".1f")} | '
                     f'{_per_seed_row(r, arm, lambda m: m["lambda_max"], ".1f")} |'])
        add(['', *[claim_line(k) for k in ('hessian_vit_nep', 'hessian_vit_ape', 'hessian_small_data_nep',
                                           'alternet_ape')], '', *img('hessian_spectrum.png', 'Hessian spectra'),
             *img('hessian_spectrum_warmup.png', 'Hessian spectra at the end of warmup'), ''])
    return [x for x in lines if x is not None]


def report_text(r: Results, arms: Sequence[Arm], seeds: Sequence[int], claims: List[ClaimResult], figs: List[str],
                command: str, wall_s: float, trained: int, load: Optional[Tuple[float, float]],
                why: Optional[List[str]] = None, timing: Optional[Dict[str, float]] = None) -> str:
    labels = {a.name: a.label for a in arms}
    main = {a.name for a in ARMS}
    counts: Dict[str, int] = {}
    for c in claims:
        counts[c.label] = counts.get(c.label, 0) + 1
    runs = sum(len(v) for k, v in r.items() if k in main)
    conv = sum(bool(m['converged']) for k, v in r.items() if k in main for m in v)
    lines = [
        f'# The papers\' claims on real digits, trained to convergence, {len(seeds)} seeds'
        + ('' if conv == runs else f' ({conv} of {runs} runs converged)'), '',
        '[Docs index](index.md) · [analysis toolkit](analysis.md) · [statistics](analysis.md#comparing-two-arms)', '',
        f'{len(claims)} claims: ' + ', '.join(f'{n} {k}' for k, n in sorted(counts.items())) + '. Each row is a '
        'paired difference over the seeds (second arm minus first, same seed), its 95 % t interval, and the verdict '
        'by the rule below. The last two columns are the verdicts of v2 (every arm 30 epochs, 5 seeds, the same '
        'rule) and of v1 (6 epochs, 3 seeds, "holds in every seed").',
        '', *_claims_table(claims), '', f'![every claim, every seed]({FIGS}/claims.png)', '',
        '**Verdict rule, fixed before the runs** (`benchmarks/_repro_plan.py`, committed as '
        f'{_plan_commit()}, each revision before the runs it governs, as its docstring says): {VERDICT_RULE} A '
        'claim of no effect ("unchanged") is '
        'reproduced when the interval lies inside (-margin, +margin), not reproduced when it lies beyond the margin, '
        'and inconclusive otherwise. The margin is the smallest effect each claim cares about: 1 point of top-1 '
        '(between 3 and 4 of the 359 validation images), 0.05 nats of entropy, 0.1 in log `lambda_max` / log APE '
        '(about 10 %), 0.05 of NEP, 0.01 of the active share.', '',
        '## Setting', '',
        'scikit-learn\'s 1,797 handwritten digits (`timm_ext.data`), 16 px: 1,438 training and 359 validation '
        'images; the 1/2 and 1/4 arms keep a stratified, nested share of the training images '
        '(`digits_subset_folder`) and train for 2x and 4x the epochs, the same number of steps. Every run is timm\'s '
        'own `train.py` with the plugin, one CPU thread: batch 16, AdamW (lr 1e-3 unless the arm says), weight decay '
        '0.05, cosine schedule with 1 warmup epoch, label smoothing 0.1 (timm\'s default), random-resized crop '
        '(scale 0.6-1) and no other augmentation: the vit-sam paper\'s "Inception-style" regime without the flip, '
        f'since a mirrored digit is another glyph. {VIT_EPOCHS} epochs on the full data for the ViTs, {EPOCHS} for the '
        'CNNs (revision 2.1 doubled the ViTs\' 30: see the convergence rule below). The ViTs are the demo\'s (patch '
        '4, width 128, 4 blocks of 4 heads; CB in blocks 3-4, or every block for the dose-response arm); the CNNs '
        'are ResNet-18 shapes at a quarter of the width (CIFAR stem), AlterNet with one local MSA block at the end of '
        f'stages 2-4. SAM is `samadamw` with rho {SAM_RHO}. Seeds {", ".join(map(str, seeds))}: arms that share an '
        'architecture share their initial weights and data order for a seed. Measurements (`timm_ext.analysis`) '
        'use each run\'s last checkpoint and the same images for every run of a seed.', '',
        f'**Converged** means the best validation top-1 of the last {CONVERGED_TAIL:.0%} of the epochs beats the '
        f'best before them by at most {CONVERGED_GAIN} points (2 images); {conv} of {runs} runs meet it (the '
        '"converged" column). Top-1 is the last epoch\'s, never the best one (no selection on validation). '
        'Revision 2.1 kept this rule and doubled the ViTs\' schedule after v2, where 21 of 80 runs missed it; '
        'revision 2.2 moved the sweep\'s second learning rate from 3e-3, where 7 of 10 runs were still improving '
        'after 60 epochs (patchify all 5), to 2e-3, and revision 2.3 to 1.5e-3, after 3 of the 10 runs at 2e-3 '
        'missed it, and revision 2.4 trains a seed of that pair again at twice the schedule where one of its runs '
        'misses it (the plan\'s docstring says what changed and why, each revision committed before its runs). '
        + _doubling_line(r), '',
        f'Regenerated by `{command}` on {time.strftime("%Y-%m-%d")}: timm {_version("timm")}, torch '
        f'{torch.__version__}, {os.cpu_count()} cores of {cpu_name()}; this invocation took {wall_s / 60:.1f} min '
        'and trained '
        f'{trained} of the {sum(1 + len(m.get("replaced", [])) for v in r.values() for m in v)} runs (the others came '
        'from the cache)'
        + (f'; 5-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end.' if load else '.')
        + (f' The {timing["runs"]} cached runs took {timing["run_min"]:.0f} min one core each, training and '
           'measuring (each measuring process\'s start-up not counted); they were trained between '
           f'{time.strftime("%Y-%m-%d %H:%M", time.gmtime(timing["first"]))} '
           f'and {time.strftime("%Y-%m-%d %H:%M", time.gmtime(timing["last"]))} UTC (from the files of the cache: '
           'one span only when the cache was filled by one study).' if timing else ''), '',
        '## Accuracy of every run', '', *_accuracy_table(r, [a for a in arms if a.name in main]), '',
        *_not_converged(r, [a for a in arms if a.name in main]),
        *(['Supporting runs (`_repro_support.py`; no verdicts): v2\'s 30-epoch schedules of the ViTs (the doubling '
           'test above, training length, CB depth) and end-of-warmup checkpoints (where how-do-vits-work reads its '
           'Hessian spectra):', '', *_support_table(r, [a for a in arms if a.name not in main]), '']
          if any(a.name not in main for a in arms) else []),
        *_sections(r, {c.claim.key: c for c in claims}, labels, figs),
    ]
    if why:
        lines += ['## Why the claims that fail here fail', '', *why, '']
    lines += ['## Raw numbers', '', f'`docs/{FIGS}/measurements.json` holds every measurement of every run, with its '
              'train.py settings (`train_args`, from the run\'s `args.yaml`).', '']
    return '\n'.join(lines) + '\n'


def write_report(runs: Path, arms: Sequence[Arm], seeds: Sequence[int], docs: Path, command: str, wall_s: float,
                 trained: int = 0, load: Optional[Tuple[float, float]] = None) -> Path:
    """docs/reproduction.md, its plots and measurements.json from the cached runs in ``runs``."""
    from _repro_why import why_paragraphs

    r = load_results(runs, arms, seeds)
    claims = evaluate(r)
    figs = draw_plots(r, claims, docs / FIGS, {a.name: a.label for a in arms})
    (docs / FIGS / 'measurements.json').write_text(json.dumps(dict(
        seeds=list(seeds), arms={a.name: dict(model=a.model, model_kwargs=a.model_kwargs, opt=a.opt,
                                              opt_kwargs=a.opt_kwargs, lr=a.lr, fraction=a.fraction,
                                              epochs=a.epochs) for a in arms},
        claims={c.claim.key: dict(diffs=c.diff.diffs, mean=c.diff.mean, low=c.diff.low, high=c.diff.high,
                                  verdict=c.label, agree=c.agree, margin=c.claim.margin, direction=c.claim.direction)
                for c in claims},
        runs=r)))
    path = docs / 'reproduction.md'
    path.write_text(report_text(r, arms, seeds, claims, figs, command, wall_s, trained, load,
                                why=why_paragraphs(r, {c.claim.key: c for c in claims}),
                                timing=study_timing(runs, arms, seeds)))
    return path
