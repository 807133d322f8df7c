"""AdamW / SAM / GSAM / interval SAM / LookSAM on the digits, through timm's own train.py, over seeds.

The setting is the 32 px one of docs/sam.md and of the first reproduction report (the demo's until it moved to 16 px;
``digits_32px.py`` keeps it as ``VIT`` and ``TRAIN_ARGS``): scikit-learn's 1,797
handwritten digits as an ImageFolder, timm's ``vit_tiny_patch16_224`` shrunk to 32 px (patch 4, width 128,
depth 4), batch 16, AdamW lr 1e-3, cosine schedule with a 1-epoch warmup, label smoothing 0.1; only the
optimizer changes.
Each run is a train.py child process run by the job runner the demo uses (:mod:`timm_ext.demo.runner`, one at a
time, seeds outermost, so a change of machine load hits every optimizer alike); this script reads each run's
``summary.csv``. The table compares every optimizer with AdamW paired by seed
(:mod:`timm_ext.analysis.stats`): the mean top-1 difference, its 95 % t interval and the verdict on "it beats
AdamW".

Radii: SAM and LookSAM use rho 0.05; interval SAM uses rho 0.05 x interval, the
proportional rule of Composer's SAM method card (interval 10 with rho 0.5 for its ImageNet ResNet-50);
GSAM goes from rho_max 0.05 at the peak lr to rho_min 0 at lr 0 with alpha 0.4 (the GSAM paper's
ViT-S/32 alpha and rho_min, Table 4).

Each run uses one CPU thread by default (``--threads``): on shared cores two threads' OpenMP
spin-waits slow a small model's step many times over.

    python reproduction/sam_variants_digits.py [--epochs 4] [--seeds 0 1 2] [--output DIR] [--threads 1]
"""
import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from digits_32px import TRAIN_ARGS, VIT  # reproduction/digits_32px.py, beside this script

from timm_ext.analysis.stats import format_difference, paired_difference, verdict
from timm_ext.demo.runner import Progress, read_summary, run_jobs, thread_env
from timm_ext.demo.train_runs import TrainRun, train_jobs

MODEL = 'vit_tiny_patch16_224'
RHO = 0.05
INTERVAL = 5


@dataclass(frozen=True)
class Variant:
    """One optimizer on the shared 32 px setting."""
    name: str
    label: str
    opt: str
    opt_kwargs: Dict[str, Any] = field(default_factory=dict)

    def training(self, data_dir: Path, epochs: int, seed: int) -> TrainRun:
        """This optimizer for ``seed`` as a train.py run named ``<variant>_seed<seed>``."""
        return TrainRun(f'{self.name}_seed{seed}', data_dir, MODEL, self.opt, epochs,
                        (*TRAIN_ARGS, '--seed', str(seed)), VIT, self.opt_kwargs)


def variants() -> List[Variant]:
    return [
        Variant('adamw', 'AdamW', 'adamw'),
        Variant('sam', f'SAM (rho {RHO:g})', 'samadamw', dict(rho=RHO)),
        Variant('gsam', f'GSAM (rho {RHO:g} -> 0, alpha 0.4)', 'gsamadamw', dict(rho_max=RHO, rho_min=0.0, alpha=0.4)),
        Variant('interval_sam', f'SAM, interval {INTERVAL} (rho {RHO * INTERVAL:g})', 'samadamw',
                dict(rho=RHO * INTERVAL, interval=INTERVAL)),
        Variant('looksam', f'LookSAM, k {INTERVAL} (rho {RHO:g}, alpha 0.7)', 'looksamadamw',
                dict(rho=RHO, interval=INTERVAL, alpha=0.7)),
    ]


def result(run: Variant, seed: int, progress: Progress, output: Path) -> Dict[str, Any]:
    """One finished run's row: its last epoch's top-1 and train loss from summary.csv, and its wall time."""
    name = f'{run.name}_seed{seed}'
    rows = read_summary(output / name / 'summary.csv')
    if not rows:
        raise RuntimeError(f'train.py wrote no epochs to {output / name / "summary.csv"}; see {output / name}.log')
    return dict(variant=run.name, label=run.label, seed=seed, top1=rows[-1]['eval_top1'],
                train_loss=rows[-1]['train_loss'], wall_s=progress.wall_s(name), epochs=len(rows))


def _mean_sd(values: List[float], digits: int = 1) -> str:
    if len(values) < 2:
        return f'{statistics.mean(values):.{digits}f}'
    return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def _versus_baseline(rows: List[Dict[str, Any]], baseline: Dict[int, float]) -> Optional[List[str]]:
    """The top-1 difference to AdamW on the seeds both ran, its 95 % t interval and the verdict on "it beats
    AdamW"; None where fewer than 2 seeds pair up (no interval)."""
    seeds = [r['seed'] for r in rows if r['seed'] in baseline]
    if len(seeds) < 2:
        return None
    top1 = {r['seed']: r['top1'] for r in rows}
    diff = paired_difference([baseline[s] for s in seeds], [top1[s] for s in seeds])
    return [format_difference(diff, '.1f', ' pt'), str(verdict(diff, 'increase'))]


def table(results: List[Dict[str, Any]]) -> str:
    """Markdown, per optimizer: mean ± sample sd over the seeds, and the top-1 difference to AdamW paired by seed
    (each seed starts both from the same weights and data order) with its 95 % t interval and verdict."""
    lines = ['| optimizer | top-1 (%) | top-1 - AdamW, 95 % CI | beats AdamW? | final train loss | wall time (s) '
             '| seeds |', '|---|---:|---:|---|---:|---:|---:|']
    baseline = {r['seed']: r['top1'] for r in results if r['variant'] == 'adamw'}
    for run in variants():
        rows = sorted((r for r in results if r['variant'] == run.name), key=lambda r: r['seed'])
        if not rows:
            continue
        top1 = _mean_sd([r['top1'] for r in rows])
        loss = _mean_sd([r['train_loss'] for r in rows], 2)
        wall = _mean_sd([r['wall_s'] for r in rows], 0)
        if run.name == 'adamw':
            versus = ['(reference)', '']
        else:
            versus = _versus_baseline(rows, baseline) or ['n/a (AdamW on < 2 of the same seeds)', '']
        lines.append(f'| {run.label} | {top1} | {versus[0]} | {versus[1]} | {loss} | {wall} | {len(rows)} |')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--output', type=Path, default=Path('sam-variants-digits') / time.strftime('%Y%m%d-%H%M%S'))
    parser.add_argument('--only', nargs='+', default=None, help='variant names to run (default: all)')
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads per run (1: on shared cores, 2 threads spin-wait on each other)')
    args = parser.parse_args(argv)
    from timm_ext.data import digits_image_folder
    data_dir = digits_image_folder(None)
    todo = [(run, seed) for seed in args.seeds for run in variants() if not args.only or run.name in args.only]
    jobs = train_jobs([run.training(data_dir, args.epochs, seed) for run, seed in todo], args.output)
    args.output.mkdir(parents=True, exist_ok=False)
    by_name = {f'{run.name}_seed{seed}': (run, seed) for run, seed in todo}
    results: List[Dict[str, Any]] = []

    def on_update(progress: Progress, now: float) -> None:
        for name in list(progress.finished)[len(results):]:
            run, seed = by_name[name]
            results.append(result(run, seed, progress, args.output))
            r = results[-1]
            print(f'{r["variant"]:>14} seed {seed}: top-1 {r["top1"]:.1f} %, train loss {r["train_loss"]:.3f}, '
                  f'{r["wall_s"]:.0f} s', flush=True)
            (args.output / 'results.json').write_text(json.dumps(results, indent=2))

    run_jobs(jobs, thread_env(args.threads), lanes=1, on_update=on_update, longest_first=False)
    text = table(results)
    (args.output / 'table.md').write_text(text + '\n')
    print(f'\n{args.epochs} epochs per run, mean ± sd over seeds {args.seeds}; differences to AdamW paired by '
          f'seed with their 95 % t interval:\n{text}')


if __name__ == '__main__':
    main()
