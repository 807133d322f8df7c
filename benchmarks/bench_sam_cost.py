"""Cost per training step of the SAM family next to the base optimizer, side by side in one run.

A training step is what timm's train.py does per update through the task API (the route SAM replays):
``task(x, y)['loss'].backward(); optimizer.step(); optimizer.zero_grad()``, each SAM opted in once with
``replay_timm_task(optimizer, task)`` (train.py's hooks do it there). Each optimizer gets its own
copy of the model and task; the time of a block of ``--period`` steps (one interval / LookSAM period)
is measured for each in turn (interleaved repeats, median) and divided by the period, so a run with a
SAM step every k-th update is charged its average step.

Passes per step (forward-backward, a column of the table): AdamW and Momentum-SAM 1; SAM, GC-SAM, GSAM, WSAM,
FriendlySAM, SAM-ON and bSAM 2; SAM with ``interval=k`` and LookSAM with k: (k + 1) / k (1.2 at k = 5); m-sharpness in
the train.py route: 1 + 2 (train.py's own pass, whose all-reduced gradient cannot be split, then both passes per
chunk); a forward without gradient counted as a third of a pass: ESAM at its paper's fractions 1 + 1/3 + 1/2 (a
forward at w + e ranks the samples, the second pass runs on half), MESA 1 + 1/3 (the EMA copy's forward).

One CPU thread by default: on a shared machine two threads' OpenMP spin-waits inflate both wall and
CPU time unevenly (measured here: a train step of timm's test_vit took 0.60 s with 2 threads and 0.05 s with 1
at a load average of 5 on 2 cores).

    python benchmarks/bench_sam_cost.py [--models vit_tiny_patch16_224] [--batch-size 8] [--repeats 5] [--threads 1]
"""
import argparse
import copy
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import timm
import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask

import timm_ext  # noqa: F401  (registers samadamw, gsamadamw, ..., esamadamw, msamadamw, bsam, mesaadamw)
from timm_ext.optim import SAM, replay_timm_task

TARGET = 1.25  # interval-5 SAM and LookSAM-5 per step, relative to the base optimizer


def variants(period: int, batch_size: int) -> Dict[str, Tuple[str, Dict[str, Any], float]]:
    """label -> (timm name, its arguments, forward-backward passes per step)."""
    out = {
        'adamw': ('adamw', {}, 1.0),
        'sam': ('samadamw', {}, 2.0),
        'sam use_gc (GC-SAM)': ('samadamw', dict(use_gc=True), 2.0),
        'gsam': ('gsamadamw', dict(rho_max=0.05, rho_min=0.02, alpha=0.1), 2.0),
        'wsam': ('wsamadamw', {}, 2.0),
        'friendlysam': ('friendlysamadamw', {}, 2.0),
        'samon': ('samonadamw', {}, 2.0),
        # ESAM at its paper's fractions: a forward-backward, a forward at w + e (about a third of one), and a
        # forward-backward on half the batch
        'esam': ('esamadamw', dict(weight_fraction=0.5, data_fraction=0.5), 1.0 + 1 / 3 + 0.5),
        'msam (Momentum-SAM)': ('msamadamw', {}, 1.0),
        'bsam': ('bsam', dict(num_data=50000), 2.0),
        # MESA: a forward-backward and the EMA copy's forward without gradient
        'mesa': ('mesaadamw', {}, 1.0 + 1 / 3),
        f'sam interval={period}': ('samadamw', dict(interval=period), (period + 1) / period),
        f'looksam k={period}': ('looksamadamw', dict(interval=period), (period + 1) / period),
    }
    if batch_size % 2 == 0 and batch_size >= 2:
        out[f'sam m_sharpness={batch_size // 2}'] = ('samadamw', dict(m_sharpness=batch_size // 2), 3.0)
    return out


def _time(fn: Callable[[], None]) -> Tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench(name: str, batch_size: int, period: int, repeats: int, warmup: int) -> List[Dict[str, Any]]:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=100)
    size = model.pretrained_cfg['input_size']
    x = torch.randn(batch_size, *size)
    y = torch.randint(0, 100, (batch_size,))
    blocks: Dict[str, Callable[[], None]] = {}
    keep = []  # models, tasks and optimizers stay alive (SAM holds its task weakly)
    passes = {}
    for label, (opt_name, kwargs, passes[label]) in variants(period, batch_size).items():
        m = copy.deepcopy(model).train()
        task = ClassificationTask(m, nn.CrossEntropyLoss(), verbose=False)
        opt = create_optimizer_v2(m, opt_name, lr=1e-4, weight_decay=0.05, foreach=True, **kwargs)
        if isinstance(opt, SAM):  # SAM, GSAM, LookSAM: step() without a closure replays the task's call at w + e
            replay_timm_task(opt, task)
        keep.append((m, task, opt))

        def block(task=task, opt=opt) -> None:
            for _ in range(period):
                task(x, y)['loss'].backward()
                opt.step()
                opt.zero_grad()
        blocks[label] = block
    for fn in blocks.values():
        for _ in range(warmup):
            fn()
    wall: Dict[str, List[float]] = {k: [] for k in blocks}
    cpu: Dict[str, List[float]] = {k: [] for k in blocks}
    for _ in range(repeats):  # interleaved, so load changes hit every optimizer alike
        for label, fn in blocks.items():
            w, c = _time(fn)
            wall[label].append(w / period)
            cpu[label].append(c / period)
    base_wall = statistics.median(wall['adamw'])
    base_cpu = statistics.median(cpu['adamw'])
    rows = []
    for label in blocks:
        med = statistics.median(wall[label])
        rows.append(dict(model=name, batch=batch_size, optimizer=label, passes=passes[label], step_s=med,
                         ratio=med / base_wall, ratio_cpu=statistics.median(cpu[label]) / base_cpu))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', default=['vit_tiny_patch16_224'])
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--period', type=int, default=5, help='interval of interval-SAM and k of LookSAM')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f'torch {torch.__version__}, timm {timm.__version__}, CPU threads {torch.get_num_threads()}, '
          f'batch {args.batch_size}, blocks of {args.period} train.py-route steps, median of {args.repeats} '
          f'interleaved repeats (wall-clock and process CPU time)')
    print('| model | optimizer | passes / step | s / step | ratio to AdamW | ratio (CPU time) |')
    print('|---|---|---:|---:|---:|---:|')
    for name in args.models:
        for r in bench(name, args.batch_size, args.period, args.repeats, args.warmup):
            print(f'| {r["model"]} | {r["optimizer"]} | {r["passes"]:.3g} | {r["step_s"]:.3f} | {r["ratio"]:.3f} | '
                  f'{r["ratio_cpu"]:.3f} |')
    print(f'target: interval={args.period} SAM and LookSAM k={args.period} <= {TARGET}x AdamW')


if __name__ == '__main__':
    main()
