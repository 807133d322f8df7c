"""SAM cost: training-step time of SAM / plain AdamW, side by side in one run, and SAM's extra memory.

A training step is what timm's train.py does per update through the task API:
``task(x, y)['loss'].backward(); optimizer.step(); optimizer.zero_grad()`` (SAM opted in once with
``replay_timm_task(sam, task)``, as train.py's hooks do: its step replays the task's call). Exact SAM needs two
forward-backward passes, so 2.0 is the floor of the ratio; the rest is SAM's own work (global
norm, perturbation, bit-exact restore). The same ratio is printed for two references written below: a
straightforward per-parameter-loop SAM (a Python loop over parameters, a fresh copy of every parameter each
step), and davda54/sam's algorithm as that repository runs it (the norm of the per-parameter gradient norms,
``e_w`` kept per parameter and subtracted back), whose step timm-ext's SAM should not be slower than. The last
column times what the two differ in, their own work, alone: ``first_step()`` + ``second_step()`` of each from the
same gradients, the forward-backward passes left out (whose times, the same for both, hold most of a step's noise).

The last lines: SAM / davda54 on a tiny MLP where Python overhead dominates, both in davda54/sam's own loop
(``step(closure)`` after the caller's backward) over the same base optimizer (torch's SGD, momentum 0.9), SAM built
with davda54/sam's constructor as a user who changed only the import has it, in a process that imported lightning
and accelerate; against the rewrite below, pytorch-optimizer's port of davda54's class, and, given
``--davda54-sam PATH`` (the ``sam.py`` of a clone of github.com/davda54/sam; nothing is downloaded), davda54's own.

    python benchmarks/bench_sam.py [--models vit_small_patch16_224 resnet50] [--batch-size 2] [--repeats 7]
        [--davda54-sam ~/src/sam/sam.py]
"""
import argparse
import copy
import statistics
import time
from functools import partial
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import timm
import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask

import timm_ext  # noqa: F401  (registers samadamw)
from timm_ext.optim import SAM, replay_timm_task


class LoopSAM:
    """Reference SAM: per-parameter Python loops, a new copy of each parameter every step."""

    def __init__(self, model: nn.Module, base: torch.optim.Optimizer, rho: float = 0.05):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.base = base
        self.rho = rho

    @torch.no_grad()
    def first_step(self) -> None:
        norm = torch.norm(torch.stack([p.grad.norm(2) for p in self.params if p.grad is not None]), 2)
        scale = self.rho / (norm + 1e-12)
        self.old = {}
        for p in self.params:
            if p.grad is None:
                continue
            self.old[p] = p.clone()
            p.add_(p.grad * scale)
        self.base.zero_grad()

    @torch.no_grad()
    def second_step(self) -> None:
        for p, old in self.old.items():
            p.copy_(old)
        self.old = {}
        self.base.step()


class Davda54SAM:
    """davda54/sam's update, rewritten here from its description: ||g|| as the norm of the per-parameter norms,
    ``e_w = rho * g / (||g|| + 1e-12)`` added to each parameter and kept, subtracted again after the second
    backward, then the base optimizer's step."""

    def __init__(self, model: nn.Module, base: torch.optim.Optimizer, rho: float = 0.05):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.base = base
        self.rho = rho
        self.e_w: Dict[torch.Tensor, torch.Tensor] = {}

    @torch.no_grad()
    def first_step(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.norm(torch.stack([g.norm(p=2) for g in grads]), p=2)
        scale = self.rho / (norm + 1e-12)
        for p in self.params:
            if p.grad is not None:
                self.e_w[p] = p.grad * scale
                p.add_(self.e_w[p])
        self.base.zero_grad()

    @torch.no_grad()
    def second_step(self) -> None:
        for p, e_w in self.e_w.items():
            p.sub_(e_w)
        self.base.step()

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor]) -> None:
        """davda54/sam's ``step(closure)``: the caller's backward came first; the closure runs at w + e."""
        self.first_step()
        with torch.enable_grad():
            closure()
        self.second_step()

    def zero_grad(self) -> None:
        self.base.zero_grad()


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _time(fn: Callable[[], None]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds of this process): CPU time is not inflated by other processes."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_model(name: str, batch_size: int, repeats: int, warmup: int, davda54_class: Optional[type] = None
                ) -> Dict[str, float]:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=1000)
    models = [model] + [copy.deepcopy(model) for _ in range(3 if davda54_class is None else 4)]  # one per optimizer
    tasks = [ClassificationTask(m.train(), nn.CrossEntropyLoss(), verbose=False) for m in models]
    size = model.pretrained_cfg['input_size']
    x = torch.randn(batch_size, *size)
    y = torch.randint(0, 1000, (batch_size,))
    kw = dict(lr=1e-4, weight_decay=0.05, foreach=True)
    adamw = create_optimizer_v2(models[0], 'adamw', **kw)
    sam = create_optimizer_v2(models[1], 'samadamw', rho=0.05, **kw)
    replay_timm_task(sam, tasks[1])  # sam.step() without a closure replays tasks[1]'s call at w + e
    loop_base = create_optimizer_v2(models[2], 'adamw', **kw)
    loop = LoopSAM(models[2], loop_base)
    davda_base = create_optimizer_v2(models[3], 'adamw', **kw)
    davda = Davda54SAM(models[3], davda_base)

    def base_step():
        tasks[0](x, y)['loss'].backward()
        adamw.step()
        adamw.zero_grad()

    def sam_step():
        tasks[1](x, y)['loss'].backward()
        sam.step()
        sam.zero_grad()

    def two_steps(task: nn.Module, sam_like: Any, base: torch.optim.Optimizer) -> Callable[[], None]:
        """A reference's update: backward at w, first_step(), backward at w + e, second_step()."""
        def step():
            for half in (sam_like.first_step, sam_like.second_step):
                task(x, y)['loss'].backward()
                half()
            base.zero_grad()
        return step

    steps = {'adamw': base_step, 'sam': sam_step, 'loop_sam': two_steps(tasks[2], loop, loop_base),
             'davda54': two_steps(tasks[3], davda, davda_base)}
    if davda54_class is not None:  # davda54/sam's own class over the same AdamW (torch's, as timm's 'adamw' builds)
        own = davda54_class(models[4].parameters(), type(adamw), rho=0.05, **kw)
        halves = SimpleNamespace(first_step=partial(own.first_step, zero_grad=True), second_step=own.second_step)
        steps['own'] = two_steps(tasks[4], halves, own)
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: Dict[str, List[float]] = {k: [] for k in steps}
    cpu: Dict[str, List[float]] = {k: [] for k in steps}
    for _ in range(repeats):  # interleaved, so load changes hit all three alike
        for key, fn in steps.items():
            wall_s, cpu_s = _time(fn)
            times[key].append(wall_s)
            cpu[key].append(cpu_s)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    own = _own_work(models[1], sam, models[3], davda, tasks[1], x, y, repeats)
    params = [p for p in model.parameters()]
    extra = sam.extra_memory_bytes()
    return dict(
        params_m=sum(p.numel() for p in params) / 1e6,
        adamw_s=med['adamw'], sam_s=med['sam'], loop_s=med['loop_sam'],
        sam_ratio=med['sam'] / med['adamw'], loop_ratio=med['loop_sam'] / med['adamw'],
        davda_ratio=med['sam'] / med['davda54'], davda_ratio_cpu=med_cpu['sam'] / med_cpu['davda54'],
        sam_ratio_cpu=med_cpu['sam'] / med_cpu['adamw'], loop_ratio_cpu=med_cpu['loop_sam'] / med_cpu['adamw'],
        sam_extra_mem=extra / _bytes(params), own_ratio=own,
        own_class_ratio=med['sam'] / med['own'] if 'own' in med else None,
    )


def _own_work(sam_model: nn.Module, sam: torch.optim.Optimizer, davda_model: nn.Module, davda: 'Davda54SAM',
              task: nn.Module, x: torch.Tensor, y: torch.Tensor, repeats: int) -> float:
    """SAM's own work over davda54's, the forward-backward passes left out: each one's first_step() + second_step()
    (norm, perturbation, restore, the base step) from the same gradients, set before each call and not timed;
    interleaved, median over ``repeats``. Run after the full steps (first_step() ends SAM's task replay)."""
    task(x, y)['loss'].backward()
    grads = [p.grad.clone() for p in sam_model.parameters()]
    sam.zero_grad()

    def given(model: nn.Module) -> None:
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()

    def run(first: Callable[[], None], second: Callable[[], None], model: nn.Module) -> float:
        given(model)
        t = _time(first)[0]
        given(model)
        return t + _time(second)[0]

    times: Dict[str, List[float]] = {'sam': [], 'davda54': []}
    for _ in range(repeats + 2):  # both zero their gradients after the timing (freeing them costs as much as a copy)
        times['sam'].append(run(sam.first_step, sam.second_step, sam_model))
        sam.zero_grad()
        times['davda54'].append(run(davda.first_step, davda.second_step, davda_model))
        davda.base.zero_grad()
    return statistics.median(times['sam'][2:]) / statistics.median(times['davda54'][2:])  # two warm-up rounds


def load_davda54_sam(path: str) -> type:
    """davda54/sam's ``SAM`` class from the ``sam.py`` of the user's clone (the bench runs it; nothing is copied)."""
    import importlib.util
    import os
    if not os.path.isfile(path):
        raise SystemExit(f'--davda54-sam {path!r}: no such file; give the sam.py of a clone of github.com/davda54/sam')
    spec = importlib.util.spec_from_file_location('davda54_sam', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not isinstance(getattr(module, 'SAM', None), type):
        raise SystemExit(f'--davda54-sam {path!r} defines no SAM class; give davda54/sam\'s sam.py')
    return module.SAM


def bench_tiny_mlp(repeats: int, warmup: int, steps: int = 100, davda54_class: Optional[type] = None
                   ) -> Dict[str, float]:
    """SAM / davda54 where Python overhead dominates: a 32-64-10 MLP, batch 8, one thread, ``steps`` updates per
    timed block, ``6 * repeats`` blocks interleaved, each timed in process CPU time (one thread: the work done, not
    what other processes on the machine took), all driven by davda54/sam's own loop (``loss.backward();
    optimizer.step(closure); optimizer.zero_grad()``, the closure back-propagating at w + e), each over torch's
    SGD (momentum 0.9), SAM built as davda54/sam builds its own. lightning and accelerate are imported first, as
    any Lightning or Hugging Face script has them."""
    import importlib
    import importlib.util

    import torch.nn.functional as F
    for framework in ('lightning', 'accelerate'):
        if importlib.util.find_spec(framework) is not None:
            importlib.import_module(framework)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))]
    models.append(copy.deepcopy(models[0]))
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    sgd = dict(lr=0.1, momentum=0.9)
    sam = SAM(models[0].parameters(), torch.optim.SGD, rho=0.05, **sgd)
    davda = Davda54SAM(models[1], torch.optim.SGD(models[1].parameters(), **sgd))
    optimizers = {'sam': (models[0], sam), 'davda54': (models[1], davda)}
    classes = {'own': davda54_class}
    if importlib.util.find_spec('pytorch_optimizer') is not None:  # davda54/sam's class, as pytorch-optimizer ships it
        from pytorch_optimizer import SAM as PortedSAM
        classes['ported'] = PortedSAM
    for key, cls in classes.items():
        if cls is not None:
            models.append(copy.deepcopy(models[0]))
            optimizers[key] = (models[-1], cls(models[-1].parameters(), torch.optim.SGD, rho=0.05, **sgd))

    def loop(model: nn.Module, optimizer: Any) -> Callable[[], None]:
        def closure():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        def run():
            for _ in range(steps):
                F.cross_entropy(model(x), y).backward()
                optimizer.step(closure)
                optimizer.zero_grad()
        return run

    runs = {key: loop(model, optimizer) for key, (model, optimizer) in optimizers.items()}
    try:
        for _ in range(warmup):
            for run in runs.values():
                run()
        times: Dict[str, List[float]] = {k: [] for k in runs}
        for _ in range(6 * repeats):  # interleaved
            for key, run in runs.items():
                times[key].append(_time(run)[1])
    finally:
        torch.set_num_threads(threads)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = dict(sam_us=1e6 * med['sam'] / steps, davda_us=1e6 * med['davda54'] / steps,
               davda_ratio=med['sam'] / med['davda54'])
    for key in ('own', 'ported'):
        if key in med:
            out.update({f'{key}_us': 1e6 * med[key] / steps, f'{key}_ratio': med['sam'] / med[key]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='*', default=['vit_small_patch16_224', 'resnet50'])
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--no-tiny-mlp', action='store_true', help='leave out the tiny MLP row')
    parser.add_argument('--davda54-sam', metavar='PATH', help='sam.py of a clone of github.com/davda54/sam: '
                        'the tiny MLP row also runs davda54\'s own class')
    args = parser.parse_args()
    davda54_class = load_davda54_sam(args.davda54_sam) if args.davda54_sam else None
    print(f'torch {torch.__version__}, timm {timm.__version__}, CPU threads {torch.get_num_threads()}, '
          f'batch {args.batch_size}, median of {args.repeats} interleaved repeats (wall-clock and process CPU time)')
    header = (f'{"model":<24}{"params(M)":>10}{"AdamW s":>10}{"SAM s":>9}{"SAM/AdamW":>11}'
              f'{"loop-SAM/AdamW":>16}{"CPU-time SAM/AdamW":>20}{"CPU-time loop/AdamW":>21}'
              f'{"SAM extra mem/params":>22}{"SAM/davda54":>13}{"CPU-time SAM/davda54":>22}'
              f'{"own work SAM/davda54":>22}')
    print(header)
    own_class = []
    for name in args.models:
        r = bench_model(name, args.batch_size, args.repeats, args.warmup, davda54_class)
        if r['own_class_ratio'] is not None:
            own_class.append(f'{name} {r["own_class_ratio"]:.3f}')
        print(f'{name:<24}{r["params_m"]:>10.1f}{r["adamw_s"]:>10.3f}{r["sam_s"]:>9.3f}{r["sam_ratio"]:>11.3f}'
              f'{r["loop_ratio"]:>16.3f}{r["sam_ratio_cpu"]:>20.3f}{r["loop_ratio_cpu"]:>21.3f}'
              f'{r["sam_extra_mem"]:>22.3f}{r["davda_ratio"]:>13.3f}{r["davda_ratio_cpu"]:>22.3f}'
              f'{r["own_ratio"]:>22.3f}')
    if own_class:
        print(f'SAM / davda54/sam\'s own SAM class ({args.davda54_sam}), same AdamW, same step: '
              + ', '.join(own_class))
    if not args.no_tiny_mlp:
        r = bench_tiny_mlp(args.repeats, args.warmup, davda54_class=davda54_class)
        print(f'tiny MLP 32-64-10, batch 8, 1 thread, lightning and accelerate imported, davda54\'s loop, SGD '
              f'momentum 0.9, CPU time: SAM {r["sam_us"]:.0f} us, davda54\'s algorithm above {r["davda_us"]:.0f} us '
              f'per update, SAM/davda54 {r["davda_ratio"]:.3f}')
        for key, what in (('own', f'davda54/sam\'s own SAM class ({args.davda54_sam})'),
                          ('ported', 'davda54/sam\'s SAM class as pytorch-optimizer ships it')):
            if f'{key}_ratio' in r:
                print(f'  {what}: {r[f"{key}_us"]:.0f} us per update, SAM/it {r[f"{key}_ratio"]:.3f}')


if __name__ == '__main__':
    main()
