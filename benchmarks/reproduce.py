"""The small-scale reproduction report: train the papers' pairs on real digits through train.py, measure each claim.

``python benchmarks/reproduce.py --timm-train PATH`` (from the repository root) regenerates
``docs/reproduction.md`` and its plots under ``docs/reproduction/``. An application of the library, not part
of it: it imports timm_ext, nothing in timm_ext imports it. It trains every arm below for every seed with
timm's own train.py (the command of :func:`timm_ext.launch.commands.build_train_command` with ``TRAIN_ARGS``,
the 32 px settings the demo used when docs/reproduction.md was made; there is no second training loop), up to
``--jobs`` runs at a time with one CPU thread each, then loads each run's ``last.pth.tar`` and measures it
with :mod:`timm_ext.analysis`:

* CB paper: Context Broadcasting lowers the attention entropy of the deep layers (Fig. 7a);
* SAM paper: SAM lowers ``lambda_max`` and ``L_train^N`` (Table 1), and the share of active neurons (Fig. 2);
* scaled-ReLU paper: the conv stem trains where the patchify stem fails at lr 1e-3 without a long
  warmup (Sec. 4), and diversifies tokens (Fig. 1);
* how-do-vits-work: MSA blocks lower the feature-map variance (Fig. 9) and high frequencies (Fig. 8).

Finished runs (a ``summary.csv`` with every epoch and a ``last.pth.tar``) are reused, so an
interrupted report resumes; ``--fresh`` needs an empty ``--runs`` folder.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ['ARMS', 'Arm', 'draw_plots', 'measure_run', 'report_numbers', 'report_text', 'train_runs', 'write_report']

VIT = dict(img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4)  # the demo's ViT until it moved to 16 px
# train.py settings of docs/reproduction.md: the demo's TRAIN_ARGS when the report was made. The demo has since
# moved to 16 px digits and other settings (timm_ext.demo); this copy keeps the report reproducible as published.
TRAIN_ARGS = (
    '--num-classes', '10', '--input-size', '3', '32', '32', '--crop-pct', '1.0',
    '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5', '--interpolation', 'bilinear',
    '--train-interpolation', 'bilinear', '--scale', '0.6', '1.0', '--ratio', '0.8', '1.25',
    '--hflip', '0', '--color-jitter', '0', '--smoothing', '0.1',
    '--batch-size', '16', '--validation-batch-size', '128', '--lr', '1e-3', '--weight-decay', '0.05',
    '--sched', 'cosine', '--sched-on-updates', '--warmup-epochs', '1', '--warmup-lr', '1e-5', '--min-lr', '0',
    '--workers', '1', '--log-interval', '1000', '--checkpoint-hist', '1', '--device', 'cpu',
)  # --seed is each run's
CNN = dict(channels=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), head_dim=16, stem_chs=16)  # ResNet-18 shapes / 4
DEFAULT_EPOCHS = 6
DEFAULT_SEEDS = (0, 1, 2)
SAM_RHO = 0.05
NOISE_SIGMA = 0.05
ANALYSIS_BATCHES = 4
ANALYSIS_BATCH_SIZE = 16


@dataclass(frozen=True)
class Arm:
    """One trained configuration: a model, its kwargs and an optimizer, with the demo's train.py settings."""
    name: str
    label: str
    model: str
    model_kwargs: Dict[str, Any]
    opt: str = 'adamw'
    opt_kwargs: Dict[str, Any] = field(default_factory=dict)


ARMS = (
    Arm('vit', 'ViT (patchify) + AdamW', 'vit_tiny_patch16_224', VIT),
    Arm('vit_cb', 'ViT + CB + AdamW', 'vit_tiny_cb', VIT),
    Arm('vit_sam', 'ViT + SAM', 'vit_tiny_patch16_224', VIT, 'samadamw', dict(rho=SAM_RHO)),
    Arm('vit_convstem', 'ViT conv stem + AdamW', 'vit_tiny_convstem', VIT),
    Arm('resnet', 'pre-act ResNet-18/4', 'alternet_18_nomsa_cifar', CNN),
    Arm('alternet', 'AlterNet-18/4', 'alternet_18_cifar', CNN),
)


def _train_args(arm: Arm, data_dir: Path, runs: Path, seed: int, epochs: int) -> List[str]:
    args = [*TRAIN_ARGS, '--seed', str(seed)]
    args += ['--data-dir', str(data_dir), '--output', str(runs), '--experiment', f'{arm.name}-s{seed}',
             '--model', arm.model, '--epochs', str(epochs), '--opt', arm.opt,
             '--model-kwargs', *(f'{k}={v}' for k, v in arm.model_kwargs.items())]
    if arm.opt_kwargs:
        args += ['--opt-kwargs', *(f'{k}={v}' for k, v in arm.opt_kwargs.items())]
    return args


def _summary(run_dir: Path) -> List[Dict[str, float]]:
    from timm_ext._summary_csv import read_summary

    return read_summary(run_dir / 'summary.csv')


def _finished(run_dir: Path, epochs: int) -> bool:
    return len(_summary(run_dir)) >= epochs and (run_dir / 'last.pth.tar').is_file()


def train_runs(
        runs: Path,
        arms: Sequence[Arm] = ARMS,
        seeds: Sequence[int] = DEFAULT_SEEDS,
        epochs: int = DEFAULT_EPOCHS,
        jobs: int = 2,
        timm_train: Optional[str] = None,
        log: Callable[[str], None] = print,
) -> Dict[Tuple[str, int], Path]:
    """Train every (arm, seed) that has no finished run in ``runs``; ``jobs`` train.py processes at a time."""
    from timm_ext.data import digits_image_folder
    from timm_ext.launch.commands import build_train_command, child_env

    data_dir = digits_image_folder()
    env = dict(child_env(), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    todo: List[Tuple[Tuple[str, int], List[str], Path]] = []
    dirs: Dict[Tuple[str, int], Path] = {}
    # SAM (two passes a step) last: an interrupted report still has the cheaper claims complete
    for arm in sorted(arms, key=lambda a: a.opt.startswith('sam')):
        for seed in seeds:
            run_dir = runs / f'{arm.name}-s{seed}'
            dirs[(arm.name, seed)] = run_dir
            if _finished(run_dir, epochs):
                continue
            cmd = build_train_command(_train_args(arm, data_dir, runs, seed, epochs), timm_train=timm_train).argv
            todo.append(((arm.name, seed), cmd, run_dir))
    runs.mkdir(parents=True, exist_ok=True)
    active: List[Tuple[Tuple[str, int], subprocess.Popen, Any, float]] = []
    failed = []
    start = time.perf_counter()
    while todo or active:
        while todo and len(active) < jobs:
            key, cmd, run_dir = todo.pop(0)
            if run_dir.exists():
                shutil.rmtree(run_dir)  # an unfinished run of ours: start it again
            logf = open(runs / f'{key[0]}-s{key[1]}.log', 'w')
            active.append((key, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env), logf,
                           time.perf_counter()))
        time.sleep(1.0)
        for item in list(active):
            key, proc, logf, t0 = item
            if proc.poll() is None:
                continue
            logf.close()
            active.remove(item)
            took = time.perf_counter() - t0
            if proc.returncode != 0 or not _finished(dirs[key], epochs):
                failed.append(key)
            log(f'[{time.perf_counter() - start:6.0f} s] {key[0]} seed {key[1]}: '
                f'{"done" if key not in failed else "FAILED"} in {took:.0f} s')
    if failed:
        raise RuntimeError(f'train.py failed for {failed}: see the .log files in {runs}')
    return dirs


def _ratios(values: Dict[str, float]) -> List[Tuple[str, float]]:
    """``(point, value / previous point's value)`` for every point after the first."""
    names = list(values)
    return [(n, values[n] / values[p]) for p, n in zip(names, names[1:])]


def measure_run(run_dir: Path, arm: Arm, seed: int = 0) -> Dict[str, Any]:
    """Every measurement the report needs, on one finished run (its ``last.pth.tar``)."""
    from timm_ext import analysis as A
    from timm_ext.analysis._hooks import feature_points
    from timm_ext.analysis.runner import build_model, load_batches

    model = build_model(arm.model, run_dir / 'last.pth.tar', dict(arm.model_kwargs), num_classes=10)
    train = load_batches('digits', 'train', ANALYSIS_BATCH_SIZE, ANALYSIS_BATCHES, model, seed=seed)
    val = load_batches('digits', 'validation', ANALYSIS_BATCH_SIZE * 2, ANALYSIS_BATCHES, model, seed=seed)
    val_images = [x for x, _ in val]
    rows = _summary(run_dir)
    out: Dict[str, Any] = dict(
        top1=rows[-1]['eval_top1'], top1_curve=[r['eval_top1'] for r in rows],
        train_loss_curve=[r['train_loss'] for r in rows])
    out['lambda_max'] = A.hessian_lambda_max(model, F.cross_entropy, train, max_iter=20, tol=1e-2)
    landscape = A.loss_landscape_1d(model, F.cross_entropy, train, steps=11, span=1.0, seed=seed)
    out['landscape'] = landscape['loss'].tolist()
    noise = A.noisy_loss(model, F.cross_entropy, train, sigma=NOISE_SIGMA, samples=10, seed=seed)
    out.update(train_loss=noise['loss'], noisy_loss=noise['noisy_loss'])
    out['activity'] = dict(A.active_neuron_fraction(model, val_images))
    variance = A.feature_variance_per_block(model, val_images)
    out['variance'] = dict(variance)
    out['fourier_at_pi'] = {k: float(v[-1]) for k, v in A.fourier_per_block(model, val_images).items()}
    points = feature_points(model)
    out['kinds'] = {n: points[n].kind for n in variance}
    out['variance_ratio'] = dict(_ratios(variance))
    if arm.model.startswith('vit'):
        stats = A.attention_stats(model, val_images)
        out['entropy'] = stats['entropy'].mean(dim=1).tolist()
        out['cls_entropy'] = A.attention_entropy(model, val_images, queries='cls').mean(dim=1).tolist()
        out['distance'] = stats['distance'].mean(dim=1).tolist()
        out['max_entropy'] = float(stats['max_entropy'][0])
        out['tokens'] = dict(A.token_cosine_similarity(model, val_images))
        out['cb_layers'] = list(getattr(model, 'cb_layers', ()) or ())
    return out


def _cached_measure(run_dir: Path, arm: Arm, seed: int) -> Dict[str, Any]:
    """:func:`measure_run`, kept in the run folder next to the checkpoint it was measured on."""
    cache = run_dir / 'timm_ext_measurements.json'
    checkpoint = run_dir / 'last.pth.tar'
    if cache.is_file() and cache.stat().st_mtime >= checkpoint.stat().st_mtime:
        return json.loads(cache.read_text())
    out = measure_run(run_dir, arm, seed)
    cache.write_text(json.dumps(out))
    return out


def _ms(values: Sequence[float], fmt: str = '.3f') -> str:
    """``mean ± std (n)``, the sample standard deviation over seeds."""
    values = list(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f'{mean:{fmt}} ± {std:{fmt}}'


def _per_seed(values: Sequence[float], fmt: str = '.3f') -> str:
    return ', '.join(f'{v:{fmt}}' for v in values)


def _verdict(diffs: Sequence[float], want_negative: bool = True) -> str:
    """Paired seeds: 'reproduced' when every seed's difference has the claimed sign, 'opposite' when none has."""
    agree = sum((d < 0) == want_negative and d != 0 for d in diffs)
    if agree == len(diffs):
        return f'**reproduced** ({agree}/{len(diffs)} seeds)'
    if agree == 0:
        return f'**not reproduced: the opposite** (0/{len(diffs)} seeds)'
    return f'**not reproduced: mixed** ({agree}/{len(diffs)} seeds agree)'


def write_report(
        results: Dict[str, List[Dict[str, Any]]],
        seeds: Sequence[int],
        epochs: int,
        docs: Path,
        command: str,
        wall_s: float,
        load: Optional[Tuple[float, float]] = None,
) -> Path:
    """``docs/reproduction.md`` and its PNGs under ``docs/reproduction/`` from the measurements."""
    numbers = report_numbers(results)
    figs = docs / 'reproduction'
    figs.mkdir(parents=True, exist_ok=True)
    draw_plots(results, figs, epochs)
    (figs / 'measurements.json').write_text(json.dumps(results, indent=1))
    path = docs / 'reproduction.md'
    path.write_text(report_text(results, numbers, seeds, epochs, command, wall_s, load))
    return path


def _col(r: Dict[str, List[Dict[str, Any]]], arm: str, key: str) -> List[Any]:
    """One measurement of ``arm``, one value per seed."""
    return [m[key] for m in r[arm]]


def _deltas(a: Sequence[float], b: Sequence[float]) -> List[float]:
    """``b - a`` per seed (paired)."""
    return [y - x for x, y in zip(a, b)]


def report_numbers(r: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """The statistics behind each claim (per seed), by claim: ``cb``, ``sam``, ``stem``, ``msa``, for the arms run."""
    out: Dict[str, Dict[str, Any]] = {}
    if 'vit' in r and 'vit_cb' in r:
        n_layers = len(r['vit'][0]['entropy'])
        deep = r['vit_cb'][0]['cb_layers'] or list(range(n_layers // 2, n_layers))

        def deep_mean(arm: str, key: str) -> List[float]:
            return [statistics.fmean(m[key][i] for i in deep) for m in r[arm]]

        out['cb'] = dict(n_layers=n_layers, deep=deep, base=deep_mean('vit', 'entropy'),
                         cb=deep_mean('vit_cb', 'entropy'), base_cls=deep_mean('vit', 'cls_entropy'),
                         cb_cls=deep_mean('vit_cb', 'cls_entropy'))
    if 'vit' in r and 'vit_sam' in r:
        def gap(arm: str) -> List[float]:
            return [m['noisy_loss'] - m['train_loss'] for m in r[arm]]

        def first_mlp(arm: str) -> List[float]:
            return [list(m['activity'].values())[0] for m in r[arm]]

        def edge(arm: str) -> List[float]:
            return [max(m['landscape'][0], m['landscape'][-1]) - m['train_loss'] for m in r[arm]]

        out['sam'] = dict(gap=(gap('vit'), gap('vit_sam')), first_mlp=(first_mlp('vit'), first_mlp('vit_sam')),
                          edge=(edge('vit'), edge('vit_sam')))
    if 'vit' in r and 'vit_convstem' in r:
        a = _col(r, 'vit', 'top1')
        out['stem'] = dict(
            top1=(a, _col(r, 'vit_convstem', 'top1')),
            first_epoch=tuple([m['top1_curve'][0] for m in r[arm]] for arm in ('vit', 'vit_convstem')),
            stuck=sum(v < 20 for v in a),
            tokens=tuple([m['tokens']['patch_embed'] for m in r[arm]] for arm in ('vit', 'vit_convstem')))
    if any(a in r for a in ('resnet', 'alternet')):
        out['msa'] = dict(rows=[row for arm in ('vit', 'resnet', 'alternet') if arm in r for row in _kind_rows(r, arm)])
        if 'alternet' in r:
            msa = [n for n, k in r['alternet'][0]['kinds'].items() if k == 'msa']
            out['msa'].update(alternet_log_ratio=_log_ratios(r['alternet'], msa),
                              alternet_dpi=_delta_at_pi(r['alternet'], msa))
    return out


def _log_ratios(runs: List[Dict[str, Any]], blocks: Sequence[str]) -> List[float]:
    """Mean log variance ratio (after / before) over ``blocks``, per seed."""
    return [statistics.fmean(math.log(m['variance_ratio'][b]) for b in blocks) for m in runs]


def _delta_at_pi(runs: List[Dict[str, Any]], blocks: Sequence[str]) -> List[float]:
    """Mean change of the Delta log amplitude at pi over each of ``blocks``, per seed."""
    names = list(runs[0]['fourier_at_pi'])
    prev = {n: p for p, n in zip(names, names[1:])}
    return [statistics.fmean(m['fourier_at_pi'][b] - m['fourier_at_pi'][prev[b]] for b in blocks) for m in runs]


def _kind_rows(r: Dict[str, List[Dict[str, Any]]], arm: str) -> List[Tuple[str, str, int, List[float], int, int,
                                                                          List[float]]]:
    """(arm, block kind, blocks, log variance ratios, blocks with ratio < 1, blocks x seeds, Delta at pi) per kind."""
    rows = []
    kinds = r[arm][0]['kinds']
    for kind in ('msa', 'mlp', 'conv'):
        blocks = [n for n, k in kinds.items() if k == kind and n in r[arm][0]['variance_ratio']]
        if blocks:
            below = sum(m['variance_ratio'][b] < 1 for m in r[arm] for b in blocks)
            rows.append((arm, kind, len(blocks), _log_ratios(r[arm], blocks), below, len(blocks) * len(r[arm]),
                         _delta_at_pi(r[arm], blocks)))
    return rows


def draw_plots(r: Dict[str, List[Dict[str, Any]]], figs: Path, epochs: int) -> None:
    """The report's PNGs in ``figs``: mean over seeds with the min..max band, for the arms run."""
    from timm_ext.analysis import plots as P

    label = {a.name: a.label for a in ARMS}

    def curves(key: str, *arms: str) -> Dict[str, List[Any]]:
        return {label[arm]: _col(r, arm, key) for arm in arms}

    def per_name(key: str, *arms: str) -> Dict[str, List[List[float]]]:
        return {label[arm]: [list(m[key].values()) for m in r[arm]] for arm in arms}

    plots: List[Tuple[str, Dict[str, List[Any]], str, str, Dict[str, Any]]] = []  # file, curves, title, y, options
    if 'vit' in r and 'vit_convstem' in r:
        plots += [('stem_top1', curves('top1_curve', 'vit', 'vit_convstem'),
                   'Validation top-1 per epoch (lr 1e-3, 1 warmup epoch)', 'top-1 (%)',
                   dict(xlabels=list(range(1, epochs + 1)), xlabel='epoch')),
                  ('stem_tokens', per_name('tokens', 'vit', 'vit_convstem'),
                   'Token cosine similarity per layer (Eq. 5)', 'cosine similarity',
                   dict(xlabels=list(r['vit'][0]['tokens'])))]
    if 'vit' in r and 'vit_cb' in r:
        layers = dict(xlabels=list(range(1, len(r['vit'][0]['entropy']) + 1)), xlabel='layer')
        plots += [('cb_entropy', curves('entropy', 'vit', 'vit_cb'), 'Attention entropy per layer', 'entropy (nats)',
                   layers),
                  ('cb_distance', curves('distance', 'vit', 'vit_cb'), 'Mean attention distance per layer',
                   'distance (grid side = 1)', layers)]
    if 'vit' in r and 'vit_sam' in r:
        steps = len(r['vit'][0]['landscape'])
        alphas = [f'{a:.1f}'.replace('-0.0', '0.0') for a in torch.linspace(-1, 1, steps).tolist()]
        plots += [('sam_activity', per_name('activity', 'vit', 'vit_sam'), 'Share of active GELU neurons per block',
                   'share > 0', dict(xlabels=[n.replace('.mlp.act', '') for n in r['vit'][0]['activity']])),
                  ('sam_landscape', curves('landscape', 'vit', 'vit_sam'),
                   'Loss along a filter-normalised direction (Fig. 1)', 'training loss',
                   dict(xlabels=alphas, xlabel='alpha'))]
    cnn = [a for a in ('resnet', 'alternet') if a in r]
    for arm in cnn + (['vit'] if cnn and 'vit' in r else []):
        names = list(r[arm][0]['variance'])
        plots.append((f'{arm}_variance', per_name('variance', arm), f'Feature-map variance, {label[arm]} (MSA shaded)',
                      'variance', dict(xlabels=names, kinds=[r[arm][0]['kinds'][n] for n in names], log=True)))
    for name, values, title, ylabel, options in plots:
        P.plot_seed_curves(values, figs / f'{name}.png', title, ylabel, **options)


def report_text(
        r: Dict[str, List[Dict[str, Any]]],
        numbers: Dict[str, Dict[str, Any]],
        seeds: Sequence[int],
        epochs: int,
        command: str,
        wall_s: float,
        load: Optional[Tuple[float, float]] = None,
) -> str:
    """The Markdown of docs/reproduction.md: the setting, then each claim's table, verdict and plots."""
    label = {a.name: a.label for a in ARMS}
    lines: List[str] = []
    add = lines.append
    add('# Small-scale reproduction of the papers\' claims on real digits')
    add('')
    add('[Docs index](index.md) · [analysis toolkit](analysis.md)')
    add('')
    add(f'Regenerated by one command (`{command}`), {time.strftime("%Y-%m-%d")}, timm {_version("timm")}, '
        f'torch {torch.__version__}, {os.cpu_count()} CPU cores; this invocation took {wall_s / 60:.0f} min (train.py '
        f'runs finished earlier are reused with their measurements, so a first run takes longer: 18 runs of 6 '
        f'epochs trained in about 35 min two at a time on this shared machine)'
        + (f' (5-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end: the machine was shared).'
           if load else '.'))
    add('')
    add('**Setting.** scikit-learn\'s 1,797 handwritten digits (`timm_ext.data`: 1,438 training and 359 validation '
        'images, 32 px). Every model is trained by timm\'s own `train.py` with the demo\'s settings of the time '
        '(`TRAIN_ARGS` of `benchmarks/reproduce.py`: AdamW, lr 1e-3, 1 warmup epoch, cosine, weight decay 0.05, '
        'batch 16, label '
        f'smoothing 0.1, random-resized crops) for {epochs} epochs, seeds {", ".join(map(str, seeds))}. The ViTs '
        'are the demo\'s (32 px, patch 4, width 128, depth 4, 4 heads; CB in blocks 3-4 of `vit_tiny_cb`); the '
        'CNNs are ResNet-18 shapes at a quarter of the width (`channels=(16, 32, 64, 128)`, CIFAR stem), AlterNet '
        'with one MSA block at the end of stages 2-4 (window 4). SAM is `samadamw` with rho '
        f'{SAM_RHO}. Measurements use `timm_ext.analysis` on each run\'s last checkpoint: {ANALYSIS_BATCHES} '
        f'training batches of {ANALYSIS_BATCH_SIZE} (Hessian, weight noise) and {ANALYSIS_BATCHES} validation '
        f'batches of {2 * ANALYSIS_BATCH_SIZE} (everything else), the same images for every model of a seed. '
        'Numbers are mean ± sample standard deviation over the seeds, then the per-seed values; plots show the '
        'mean and the min..max band. A "reproduced" claim holds in every seed (paired by seed); this is a tiny '
        'model on tiny data, so it says nothing about ImageNet scale.')
    add('')
    add('## Accuracy of every run')
    add('')
    add('| arm | model | optimizer | top-1 (last epoch) | per seed |')
    add('|---|---|---|---|---|')
    for arm in ARMS:
        if arm.name in r:
            top1 = _col(r, arm.name, 'top1')
            add(f'| {arm.label} | `{arm.model}` | {arm.opt} | {_ms(top1, ".1f")} % | {_per_seed(top1, ".1f")} |')
    add('')
    if 'cb' in numbers:
        lines += _cb_text(r, **numbers['cb'])
    if 'sam' in numbers:
        lines += _sam_text(r, **numbers['sam'])
    if 'stem' in numbers:
        lines += _stem_text(**numbers['stem'])
    if 'msa' in numbers:
        lines += _msa_text(r, label, **numbers['msa'])
    add('## Raw numbers')
    add('')
    add('`docs/reproduction/measurements.json` holds every measurement of every run.')
    add('')
    return '\n'.join(lines) + '\n'


def _cb_text(r: Dict[str, List[Dict[str, Any]]], n_layers: int, deep: List[int], base: List[float], cb: List[float],
             base_cls: List[float], cb_cls: List[float]) -> List[str]:
    def per_layer(arm: str) -> str:
        return '; '.join(_ms([m['distance'][i] for m in r[arm]]) for i in range(n_layers))

    return [
        '## CB paper: Context Broadcasting lowers the attention entropy of the deep layers (Fig. 7a)', '',
        f'Entropy (nats) of the attention rows, averaged over heads and over the CB layers '
        f'({", ".join(str(i + 1) for i in deep)} of {n_layers}); the uniform bound is log 65 = '
        f'{r["vit"][0]["max_entropy"]:.2f}.', '',
        '| | ViT | ViT + CB | CB - ViT |',
        '|---|---|---|---|',
        f'| all queries | {_ms(base)} ({_per_seed(base)}) | {_ms(cb)} ({_per_seed(cb)}) | {_ms(_deltas(base, cb))} |',
        f'| class token (Fig. 7a) | {_ms(base_cls)} ({_per_seed(base_cls)}) | {_ms(cb_cls)} '
        f'({_per_seed(cb_cls)}) | {_ms(_deltas(base_cls, cb_cls))} |', '',
        f'Verdict, all queries: {_verdict(_deltas(base, cb))}; class token: {_verdict(_deltas(base_cls, cb_cls))}.',
        '',
        '![attention entropy per layer](reproduction/cb_entropy.png)',
        '![attention distance per layer](reproduction/cb_distance.png)', '',
        'The paper also finds that CB leaves the mean attention distance about unchanged (Fig. 7b); per layer, '
        f'ViT: {per_layer("vit")}. ViT + CB: {per_layer("vit_cb")}.', '']


def _sam_text(r: Dict[str, List[Dict[str, Any]]], gap: Tuple[List[float], List[float]],
              first_mlp: Tuple[List[float], List[float]], edge: Tuple[List[float], List[float]]) -> List[str]:
    lines = [
        '## SAM paper: SAM lowers lambda_max and L_train^N (Table 1) and the active neurons (Fig. 2)', '',
        f'`lambda_max`: dominant Hessian eigenvalue of the training loss on {ANALYSIS_BATCHES * ANALYSIS_BATCH_SIZE} '
        f'training images (power iteration, 20 steps). `L_train^N`: the same loss averaged over 10 draws of '
        f'Gaussian weight noise of std {NOISE_SIGMA} (the paper does not give its sigma).', '',
        '| | ViT + AdamW | ViT + SAM | verdict (SAM lower) |',
        '|---|---|---|---|']
    for key, name in (('lambda_max', '`lambda_max`'), ('noisy_loss', '`L_train^N`'),
                      ('train_loss', '`L_train` (no noise)')):
        a, s = _col(r, 'vit', key), _col(r, 'vit_sam', key)
        lines.append(f'| {name} | {_ms(a)} ({_per_seed(a)}) | {_ms(s)} ({_per_seed(s)}) | '
                     f'{_verdict(_deltas(a, s)) if key != "train_loss" else "(context)"} |')
    lines += [
        f'| `L_train^N - L_train` | {_ms(gap[0])} | {_ms(gap[1])} | {_verdict(_deltas(*gap))} |',
        f'| active neurons, first MLP | {_ms(first_mlp[0])} | {_ms(first_mlp[1])} | {_verdict(_deltas(*first_mlp))} |',
        '',
        '![active neurons per block](reproduction/sam_activity.png)',
        f'![loss landscape](reproduction/sam_landscape.png) Rise of the loss at alpha = ±1 (the larger side): '
        f'AdamW {_ms(edge[0])}, SAM {_ms(edge[1])}: {_verdict(_deltas(*edge))}.', '']
    return lines


def _stem_text(top1: Tuple[List[float], List[float]], first_epoch: Tuple[List[float], List[float]], stuck: int,
               tokens: Tuple[List[float], List[float]]) -> List[str]:
    (a, c), (a1, c1), (s_a, s_c) = top1, first_epoch, tokens
    return [
        '## Scaled-ReLU paper: the conv stem trains where patchify fails at lr 1e-3 without a long warmup', '',
        'Both ViTs train at lr 1e-3 with a 1-epoch warmup (the paper\'s failing patchify runs need a 20-epoch '
        'warmup to recover). "Fails" would show as a run stuck near chance (10 %).', '',
        '| | patchify ViT | conv-stem ViT | verdict (conv stem better) |',
        '|---|---|---|---|',
        f'| top-1 after epoch 1 | {_ms(a1, ".1f")} ({_per_seed(a1, ".1f")}) | {_ms(c1, ".1f")} '
        f'({_per_seed(c1, ".1f")}) | {_verdict(_deltas(c1, a1))} |',
        f'| top-1, last epoch | {_ms(a, ".1f")} ({_per_seed(a, ".1f")}) | {_ms(c, ".1f")} ({_per_seed(c, ".1f")}) '
        f'| {_verdict(_deltas(c, a))} |', '',
        f'Patchify runs stuck below 20 % top-1: {stuck} of {len(a)}; the claim that patchify *fails* '
        f'{"holds" if stuck == len(a) else "does not reproduce at this scale"}.', '',
        '![top-1 per epoch](reproduction/stem_top1.png)', '',
        f'Fig. 1 finds the conv stem lowers the token similarity of the lower layers. After the stem: patchify '
        f'{_ms(s_a)}, conv stem {_ms(s_c)}: {_verdict(_deltas(s_a, s_c))}.', '',
        '![token similarity per layer](reproduction/stem_tokens.png)', '']


def _msa_text(r: Dict[str, List[Dict[str, Any]]], label: Dict[str, str], rows: List[Tuple[Any, ...]],
              alternet_log_ratio: Optional[List[float]] = None,
              alternet_dpi: Optional[List[float]] = None) -> List[str]:
    lines = [
        '## How-do-vits-work: MSA blocks lower the feature-map variance (Fig. 9) and high frequencies (Fig. 8)', '',
        'Per block, the ratio of the feature-map variance after it to the variance before it (spatial variance per '
        'image and channel, averaged). The paper: MSAs reduce it (ratio < 1), Convs and MLPs raise it.', '',
        '| model | blocks | log variance ratio (mean over blocks) | ratio < 1 in | Delta log amplitude at pi, '
        'change over the block |',
        '|---|---|---|---|---|']
    for arm, kind, n, logs, below, total, dpi in rows:
        lines.append(f'| {label[arm]} | {kind} ({n}) | {_ms(logs)} | {below}/{total} | {_ms(dpi)} |')
    lines.append('')
    if alternet_log_ratio is not None:
        lines += [f'Verdict, AlterNet MSA blocks lower the variance (log ratio < 0): {_verdict(alternet_log_ratio)}; '
                  f'they lower the high-frequency amplitude (Delta at pi falls over the block, Fig. 8): '
                  f'{_verdict(alternet_dpi)}.', '']
    cnn = [a for a in ('resnet', 'alternet') if a in r]
    lines += [f'![feature-map variance, {label[arm]}](reproduction/{arm}_variance.png)'
              for arm in cnn + (['vit'] if 'vit' in r else [])]
    lines.append('')
    if 'resnet' in r and 'alternet' in r:
        lr, la = _col(r, 'resnet', 'lambda_max'), _col(r, 'alternet', 'lambda_max')
        lines += [f'The paper also finds MSAs flatten the loss (smaller Hessian eigenvalues). `lambda_max`: pre-act '
                  f'ResNet {_ms(lr)} ({_per_seed(lr)}), AlterNet {_ms(la)} ({_per_seed(la)}): '
                  f'{_verdict(_deltas(lr, la))}.', '']
    return lines


def _version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return '?'


def _public_argv(argv: List[str]) -> List[str]:
    """The command as the report prints it: this machine's paths (train.py, the runs folder) as placeholders."""
    placeholders = {'--timm-train': 'PATH', '--runs': 'DIR'}
    out: List[str] = []
    for arg in argv:
        key, eq, _ = arg.partition('=')
        if out and out[-1] in placeholders:
            out.append(placeholders[out[-1]])
        elif eq and key in placeholders:
            out.append(f'{key}={placeholders[key]}')
        else:
            out.append(arg)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python benchmarks/reproduce.py', description=__doc__.splitlines()[0])
    parser.add_argument('--runs', default=None,
                        help='folder of the train.py runs, finished runs are reused (default: '
                             '$TIMM_EXT_CACHE/reproduction-runs)')
    parser.add_argument('--docs', default='docs', help='folder that receives reproduction.md and reproduction/')
    parser.add_argument('--epochs', type=int, default=DEFAULT_EPOCHS)
    parser.add_argument('--seeds', type=int, nargs='+', default=list(DEFAULT_SEEDS))
    parser.add_argument('--arms', nargs='+', default=[a.name for a in ARMS], help='subset of the arms')
    parser.add_argument('--jobs', type=int, default=2, help='train.py processes at a time (one thread each)')
    parser.add_argument('--timm-train', default=None, help='timm\'s train.py (or its folder)')
    args = parser.parse_args(argv)
    unknown = [a for a in args.arms if a not in {arm.name for arm in ARMS}]
    if unknown:
        parser.error(f'unknown arm {unknown[0]!r}: choose from {", ".join(a.name for a in ARMS)}')
    arms = [a for a in ARMS if a.name in args.arms]
    from timm_ext.data import default_cache_dir

    runs = Path(args.runs) if args.runs else default_cache_dir() / 'reproduction-runs'
    torch.set_num_threads(1)
    start = time.perf_counter()
    load_before = os.getloadavg()[1]
    dirs = train_runs(runs, arms, args.seeds, args.epochs, args.jobs, args.timm_train)
    results: Dict[str, List[Dict[str, Any]]] = {}
    for arm in arms:
        for seed in args.seeds:
            t0 = time.perf_counter()
            results.setdefault(arm.name, []).append(_cached_measure(dirs[(arm.name, seed)], arm, seed))
            print(f'measured {arm.name} seed {seed} in {time.perf_counter() - t0:.0f} s', flush=True)
    argv = list(argv if argv is not None else sys.argv[1:])
    command = 'python benchmarks/reproduce.py ' + ' '.join(_public_argv(argv))
    path = write_report(results, args.seeds, args.epochs, Path(args.docs), command.strip(),
                        time.perf_counter() - start, load=(load_before, os.getloadavg()[1]))
    print(f'report: {path}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
