"""Time of a SAM step on the CPU without AMP, under bf16 autocast and under fp16 autocast, side by side in one run.

timm's train.py with ``--amp`` on ``--device cpu`` runs the task under ``torch.autocast('cpu', dtype)`` with
``--amp-dtype`` (default ``float16``) and no loss scaler (train.py makes one only for CUDA fp16). A step here is
what train.py does per update through the task API: ``task(x, y)['loss'].backward()`` under the autocast,
``optimizer.step()`` (SAM replays the task at w + e under the recorded autocast state), ``zero_grad()``. Each
variant gets its own copy of the model, task and ``samadamw``; the variants go in turn (A, B, C, A, B, C, ...)
and the median per step is printed with its ratio to fp32. The CPU is named: the numbers ``timm-ext train
--amp`` quotes on a CPU (:data:`timm_ext.launch.command_checks.CPU_AMP_MEASURED`) come from this script.

    python benchmarks/bench_amp_cpu.py [--models vit_tiny_patch16_224 resnet18] [--img-size 64] [--batch-size 8]
                                       [--steps 1] [--repeats 3] [--threads 1]

About 8 minutes on one thread of an Intel Xeon, almost all of it resnet18's fp16 steps.
"""
import argparse
import contextlib
import copy
import statistics
import time
from typing import Callable, Dict, List, Optional

import timm
import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask

import timm_ext  # noqa: F401  (registers samadamw)
from timm_ext.machine import cpu_name
from timm_ext.optim import replay_timm_task

VARIANTS: Dict[str, Optional[torch.dtype]] = {'fp32': None, 'bf16 autocast': torch.bfloat16,
                                              'fp16 autocast': torch.float16}


def sam_steps(name: str, img_size: int, batch_size: int, steps: int) -> Dict[str, Callable[[], None]]:
    """A block of ``steps`` SAM steps per variant, each on its own copy of one model."""
    torch.manual_seed(0)
    kwargs = dict(img_size=img_size) if 'vit' in name else {}
    model = timm.create_model(name, num_classes=10, **kwargs)
    x, y = torch.randn(batch_size, 3, img_size, img_size), torch.randint(0, 10, (batch_size,))
    blocks: Dict[str, Callable[[], None]] = {}
    for label, dtype in VARIANTS.items():
        copied = copy.deepcopy(model).train()
        task = ClassificationTask(copied, nn.CrossEntropyLoss(), verbose=False)
        opt = create_optimizer_v2(copied, 'samadamw', lr=1e-4, weight_decay=0.05)
        replay_timm_task(opt, task)

        def block(task=task, opt=opt, dtype=dtype) -> None:
            for _ in range(steps):
                amp = torch.autocast('cpu', dtype=dtype) if dtype is not None else contextlib.nullcontext()
                with amp:  # as train.py's amp_autocast: the forward and the loss
                    loss = task(x, y)['loss']
                loss.backward()
                opt.step()
                opt.zero_grad()
        block.keep = (task, opt)  # SAM holds its task weakly
        blocks[label] = block
    return blocks


def bench(name: str, img_size: int, batch_size: int, steps: int, repeats: int) -> Dict[str, float]:
    """Median seconds per SAM step of each variant (interleaved repeats, one warm-up block each)."""
    blocks = sam_steps(name, img_size, batch_size, steps)
    for fn in blocks.values():
        fn()
    times: Dict[str, List[float]] = {k: [] for k in blocks}
    for _ in range(repeats):
        for label, fn in blocks.items():
            t0 = time.perf_counter()
            fn()
            times[label].append((time.perf_counter() - t0) / steps)
    return {label: statistics.median(ts) for label, ts in times.items()}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', default=['vit_tiny_patch16_224', 'resnet18'])
    parser.add_argument('--img-size', type=int, default=64)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--steps', type=int, default=1, help='SAM steps per timed block')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f'{cpu_name()}; torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} CPU '
          f'thread(s); samadamw, batch {args.batch_size} at {args.img_size} px, train.py\'s route (task API), '
          f'median of {args.repeats} interleaved blocks of {args.steps} steps')
    print('| model | ' + ' | '.join(f'{v} s / step' for v in VARIANTS) + ' | bf16 / fp32 | fp16 / fp32 |')
    print('|---|' + '---:|' * (len(VARIANTS) + 2))
    for name in args.models:
        t = bench(name, args.img_size, args.batch_size, args.steps, args.repeats)
        print(f'| {name} | ' + ' | '.join(f'{t[v]:.3f}' for v in VARIANTS) +
              f' | {t["bf16 autocast"] / t["fp32"]:.2f}x | {t["fp16 autocast"] / t["fp32"]:.2f}x |')


if __name__ == '__main__':
    main()
