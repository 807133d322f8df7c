"""Compiled SAM cost: SAM's ``step(closure)`` / AdamW's with a ``torch.compile``d model, beside the same ratio eager.

Four copies of one ViT (the ViT-SAM paper's dropout 0.1 in the blocks and after the position embedding, plus
drop-path, so SAM's second pass restores the random state in ``fork_rng`` as in training) are trained side by
side: compiled AdamW, compiled SAM, eager AdamW, eager SAM, every one through ``optimizer.step(closure)`` with the
same closure (zero_grad, forward, cross-entropy, backward). Each compiled model has its own counting backend, so
the number of graphs compiled for each is printed: SAM's two passes share one graph when it equals AdamW's. The
first step of each compiled model (the compile) is timed apart; then warm-up steps and the interleaved repeats
(``timing.interleaved_median_seconds``; the process CPU time of the same calls is printed as a check against
machine load). Exact SAM cannot go below 2.0x: two forward-backward passes. One CPU thread by default, as in
``bench_sam_cost.py``: on a shared machine two threads' OpenMP spin-waits inflate the times unevenly, and
inductor's C++ kernels, parallel over the threads they were compiled for, more than eager's.

    python benchmarks/bench_sam_compile.py [--model vit_small_patch16_224] [--batch-size 2] [--repeats 7]
        [--backend inductor] [--threads 1] [--quick]

``--quick`` (CI): a 1-block ViT-Tiny at 32 px, batch 2, 1 warm-up step, 3 repeats; with ``--backend aot_eager``
it needs no C++ compile (inductor's first compile of even that model takes 25-55 s on 2 CPU cores).
"""
import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import timm
import torch
import torch._dynamo
import torch.nn.functional as F
from timm.optim import create_optimizer_v2
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing.py beside this script
import timing  # noqa: E402

import timm_ext  # noqa: E402, F401  (registers samadamw)

GOAL = 2.05  # compiled SAM step / compiled AdamW step
QUICK = dict(model='vit_tiny_patch16_224', model_kwargs=dict(img_size=32, patch_size=8, depth=1), batch_size=2,
             warmup=1, repeats=3)


def closure_step(forward: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
                 x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One update through ``optimizer.step(closure)``: SAM evaluates the closure twice, AdamW once."""
    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(x), y)
        loss.backward()
        return loss

    def step() -> None:
        optimizer.step(closure)
    return step


def _cpu_timed(fn: Callable[[], None], into: List[float]) -> Callable[[], None]:
    """``fn``, appending the process CPU time of each call to ``into`` (not inflated by other processes)."""
    def run() -> None:
        t0 = time.process_time()
        fn()
        into.append(time.process_time() - t0)
    return run


def load() -> str:
    one, five, _ = os.getloadavg()
    return f'{one:.2f} / {five:.2f}'


def bench(model_name: str, model_kwargs: Dict[str, Any], batch_size: int, backend: str, drop: float,
          drop_path: float, warmup: int, repeats: int) -> Dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=1000, proj_drop_rate=drop, pos_drop_rate=drop,
                              drop_path_rate=drop_path, **model_kwargs).train()
    models = {key: copy.deepcopy(model) for key in ('compiled_adamw', 'compiled_sam', 'eager_adamw', 'eager_sam')}
    x = torch.randn(batch_size, 3, *model.patch_embed.img_size)  # the size the ViT was built for
    y = torch.randint(0, 1000, (batch_size,))
    kw = dict(lr=1e-4, weight_decay=0.05, foreach=True)
    counts = {key: CompileCounterWithBackend(backend) for key in models if key.startswith('compiled')}
    steps: Dict[str, Callable[[], None]] = {}
    for key, m in models.items():
        forward = torch.compile(m, backend=counts[key]) if key in counts else m
        opt = create_optimizer_v2(m, 'samadamw', rho=0.05, **kw) if key.endswith('sam') else \
            create_optimizer_v2(m, 'adamw', **kw)
        steps[key] = closure_step(forward, opt, x, y)
    compile_s = {}
    for key in counts:  # AdamW's first: the baseline compiles, SAM's second pass must not
        t0 = time.perf_counter()
        steps[key]()
        compile_s[key] = time.perf_counter() - t0
    before = load()
    cpu_s: Dict[str, List[float]] = {key: [] for key in steps}
    med = timing.interleaved_median_seconds({key: _cpu_timed(fn, cpu_s[key]) for key, fn in steps.items()},
                                            torch.device('cpu'), warmup=warmup, reps=repeats)
    med_cpu = {key: statistics.median(times[warmup:]) for key, times in cpu_s.items()}  # the timed repeats
    return dict(
        params_m=sum(p.numel() for p in model.parameters()) / 1e6,
        med=med, compile_s=compile_s, compiles={k: c.frame_count for k, c in counts.items()},
        graph_breaks=sum(counters['graph_break'].values()), load_before=before, load_after=load(),
        compiled_ratio=med['compiled_sam'] / med['compiled_adamw'], eager_ratio=med['eager_sam'] / med['eager_adamw'],
        compiled_ratio_cpu=med_cpu['compiled_sam'] / med_cpu['compiled_adamw'],
        eager_ratio_cpu=med_cpu['eager_sam'] / med_cpu['eager_adamw'],
    )


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='vit_small_patch16_224')
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--backend', default='inductor', help='torch.compile backend (default: inductor)')
    parser.add_argument('--drop', type=float, default=0.1,
                        help='dropout in the blocks and after the position embedding (the ViT-SAM paper\'s 0.1)')
    parser.add_argument('--drop-path', type=float, default=0.1)
    parser.add_argument('--threads', type=int, default=1,
                        help='CPU threads (default 1: on a shared machine OpenMP spin-waits distort 2 threads)')
    parser.add_argument('--quick', action='store_true', help='CI size: a 1-block ViT-Tiny at 32 px, 3 repeats')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)  # before compiling: inductor's C++ kernels take the thread count then
    model_kwargs: Dict[str, Any] = {}
    if args.quick:
        args.model, model_kwargs = QUICK['model'], QUICK['model_kwargs']
        args.batch_size, args.warmup, args.repeats = QUICK['batch_size'], QUICK['warmup'], QUICK['repeats']
    r = bench(args.model, model_kwargs, args.batch_size, args.backend, args.drop, args.drop_path,
              args.warmup, args.repeats)
    med, comp = r['med'], r['compiles']
    shape = ''.join(f', {k} {v}' for k, v in model_kwargs.items())
    verdict = 'met' if r['compiled_ratio'] <= GOAL else 'NOT met'
    steps_each = f'1 compiling + {args.warmup} warm-up + {args.repeats} timed steps each'
    print(f'bench_sam_compile: SAM step(closure) / AdamW step(closure), torch.compile\'d and eager, '
          f'median wall time of {args.repeats} interleaved repeats')
    print(f'cpu: {timing.device_name(torch.device("cpu"))}')
    print(f'torch: {torch.__version__} (timm {timm.__version__}, CPU threads {torch.get_num_threads()})')
    print(f'model: {args.model} ({r["params_m"]:.1f}M params{shape}; dropout {args.drop}, '
          f'drop-path {args.drop_path}; train mode)')
    print(f'batch: {args.batch_size}')
    print(f'backend: {args.backend}')
    print(f'compilations: SAM {comp["compiled_sam"]}, AdamW {comp["compiled_adamw"]} (graphs compiled over '
          f'{steps_each}; graph breaks {r["graph_breaks"]})')
    print(f'first step (compiles): SAM {r["compile_s"]["compiled_sam"]:.1f} s, '
          f'AdamW {r["compile_s"]["compiled_adamw"]:.1f} s (SAM\'s after AdamW\'s: it may reuse its cached code)')
    print(f'compiled SAM/AdamW: {r["compiled_ratio"]:.3f} (SAM {med["compiled_sam"]:.3f} s, '
          f'AdamW {med["compiled_adamw"]:.3f} s; goal <= {GOAL}: {verdict})')
    print(f'eager SAM/AdamW: {r["eager_ratio"]:.3f} (SAM {med["eager_sam"]:.3f} s, AdamW {med["eager_adamw"]:.3f} s)')
    print(f'CPU time SAM/AdamW: compiled {r["compiled_ratio_cpu"]:.3f}, eager {r["eager_ratio_cpu"]:.3f} '
          f'(process CPU time, the check against machine load)')
    print(f'load average 1 / 5 min: {r["load_before"]} before the repeats, {r["load_after"]} after')
    return r


if __name__ == '__main__':
    main()
