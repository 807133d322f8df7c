"""GPU report: timm-ext's speed and memory ratios side by side in one process, with each goal and whether it is met.

One command, at most 4 minutes on one H100 (``--budget-s``, default 220 s, scales the repeats down to fit):

* SAM / AdamW step, GSAM, SAM ``interval=5`` and LookSAM k=5 (``vit_base_patch16_224``, batch 256, AMP), timed
  in blocks of 5 closure-driven ``optimizer.step(closure)`` steps; SAM's extra peak memory in parameter copies;
* CB / base throughput, train step and inference: ``vit_small_cb``, ``vit_base_cb``, ``vit_small_cbs`` (batch 256);
* AlterNet-50 vs its pre-activation ResNet-50 on CIFAR-100 shapes (32 px, batch 96, AMP; the paper's 1.2x);
* AlterNet vs the official how-do-vits-work code (``--official PATH``), same configuration;
* conv-stem ViT-S vs patchify ViT-S (train step and inference, batch 256);
* one Hessian-vector product / one forward+backward (``vit_small_patch16_224``, batch 32, fp32).

Each measurement builds its candidates one by one (peak memory from ``torch.cuda.max_memory_allocated``, each in
its own window), then times them interleaved (CUDA events; perf_counter on CPU), median of the repeats. Rows print
as they finish; ``--out DIR`` writes ``gpu_report.json`` and ``gpu_report.md``. ``--smoke`` runs every measurement
at tiny sizes (32 px, depth 2, batch 4, 2 repeats) on any device, in seconds on a CPU; CI runs it.

    python benchmarks/gpu_report.py --out runs/gpu-report [--official /path/to/how-do-vits-work] [--budget-s 220]
    python benchmarks/gpu_report.py --smoke
"""
import argparse
import copy
import gc
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

_START = time.perf_counter()  # the budget counts from here: imports and model creation are part of the 4 minutes
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import timm  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _gpu_rows import Goal, Row, all_met, copies, markdown, speed_ratio, time_ratio  # noqa: E402
from _gpu_timing import Budget, Step, build_in_memory_windows, interleaved_medians  # noqa: E402
from bench_sam_cost import TARGET as CHEAP_SAM_TARGET  # noqa: E402
from bench_sam_cost import variants as sam_variants  # noqa: E402
from official_alternet import check_same_outputs, official_model, randomize_norms  # noqa: E402
from timing import device_name, forward_backward, inference_step, train_step  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402

import timm_ext  # noqa: E402
from timm_ext.analysis.hessian import HessianOperator, hessian_context  # noqa: E402
from timm_ext.models import convert_official_alternet  # noqa: E402

ISSUE = 'issue 20'
SAM_STEP_GOAL = Goal('<=', 2.02, ISSUE)
# one parameter copy (the bit-exact restore); 1 % for the allocator's block rounding of ~150 tensors and scalars
SAM_PEAK_GOAL = Goal('<=', 1.01, ISSUE + ': +1 parameter copy')
SAM_STATE_GOAL = Goal('<=', 1.0, ISSUE + ': +1 parameter copy')
CHEAP_SAM_GOAL = Goal('<=', CHEAP_SAM_TARGET, 'bench_sam_cost.py')
CB_GOAL = Goal('>=', 0.99, ISSUE)
HVP_GOAL = Goal('<=', 2.5, 'issue 12')
ALTERNET_CLAIM = 1.2  # paper App. E: Alter-ResNet-50 20 % faster than the pre-activation ResNet-50 (CIFAR-100, GPU)
CB_PAIRS = [('vit_small_cb', 'vit_small_patch16_224'), ('vit_base_cb', 'vit_base_patch16_224'),
            ('vit_small_cbs', 'vit_small_patch16_224')]
PERIOD = 5  # SAM interval and LookSAM k
# share of the time budget per measurement (their setup included)
WEIGHTS = {'sam': 0.36, 'cb vit_small_cb': 0.07, 'cb vit_base_cb': 0.13, 'cb vit_small_cbs': 0.07,
           'alternet': 0.08, 'official': 0.08, 'convstem': 0.1, 'hvp': 0.08}
OUT_FILES = ('gpu_report.json', 'gpu_report.md')


@dataclass(frozen=True)
class Sizes:
    """Shapes of every measurement; ``SMOKE`` shrinks them all so the script runs anywhere in seconds."""
    img: int = 224
    batch: int = 256
    vit: Dict[str, Any] = field(default_factory=dict)
    cifar_batch: int = 96
    alternet: Dict[str, Any] = field(default_factory=dict)
    hvp_batch: int = 32
    warmup: int = 1
    min_reps: int = 3
    max_reps: int = 30


FULL = Sizes()
SMOKE = Sizes(img=32, batch=4, vit=dict(img_size=32, depth=2, embed_dim=64, num_heads=2), cifar_batch=4,
              alternet=dict(layers=(1, 2, 2, 4), channels=(32, 64, 128, 256), num_heads=(1, 1, 2, 4), head_dim=32,
                            stem_chs=16),
              hvp_batch=4, min_reps=2, max_reps=2)


class Autocast(nn.Module):
    """Runs the wrapped model's forward under autocast (``dtype=None``: as is) and returns fp32 logits."""

    def __init__(self, model: nn.Module, dtype: Optional[torch.dtype]) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            return self.model(x).float()


@dataclass
class Context:
    device: torch.device
    amp: Optional[torch.dtype]
    sizes: Sizes
    budget: Budget
    official: Optional[Path] = None

    def batch(self, size: int, img: int, classes: int) -> Tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(size, 3, img, img, generator=gen)
        return x.to(self.device), torch.randint(0, classes, (size,), generator=gen).to(self.device)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _mib(peaks: Dict[str, Optional[int]]) -> Dict[str, Optional[float]]:
    return {k: None if v is None else v / 2 ** 20 for k, v in peaks.items()}


def _record(name: str, config: str, phases: Dict[str, Dict[str, float]], peaks: Dict[str, Optional[int]],
            reps: int, seconds: float) -> Dict[str, Any]:
    """A measurement's JSON: ms per call of each candidate (``candidate`` or ``candidate phase``), peaks, reps."""
    time_ms = {(f'{cand} {phase}' if phase else cand): 1e3 * s for phase, times in phases.items()
               for cand, s in times.items()}
    return dict(name=name, config=config, status='ok', reason=None, time_ms=time_ms, peak_mib=_mib(peaks),
                reps=reps, seconds=seconds)


def _time(ctx: Context, fns: Dict[str, Step], seconds: float, warmup: int = 0) -> Tuple[Dict[str, float], int]:
    s = ctx.sizes
    return interleaved_medians(fns, ctx.device, seconds, warmup=warmup, min_reps=s.min_reps, max_reps=s.max_reps)


def _train_and_infer(ctx: Context, key: str, models: Dict[str, Callable[[], nn.Module]], x: torch.Tensor,
                     y: torch.Tensor, optimizer: bool = True
                     ) -> Tuple[Dict[str, float], Dict[str, float], Dict[str, Optional[int]], int]:
    """Train-step and inference times of each model (built in its memory window), interleaved; peaks; reps."""
    seconds = ctx.budget.take(key)
    t_end = time.perf_counter() + seconds
    built: Dict[str, nn.Module] = {}

    def builder(name: str, make: Callable[[], nn.Module]) -> Callable[[], Step]:
        def build() -> Step:
            model = built[name] = Autocast(make().to(ctx.device).train(), ctx.amp)
            if optimizer:
                return train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), x, y)
            return forward_backward(model, x, y)
        return build

    fns, peaks = build_in_memory_windows({k: builder(k, m) for k, m in models.items()}, ctx.device,
                                         ctx.sizes.warmup)
    train, reps = _time(ctx, fns, 0.6 * max(0., t_end - time.perf_counter()))
    for m in built.values():
        m.eval()
    infer, infer_reps = _time(ctx, {k: inference_step(m, x) for k, m in built.items()},
                              max(0., t_end - time.perf_counter()), warmup=ctx.sizes.warmup)
    return train, infer, peaks, min(reps, infer_reps)


def _vit(ctx: Context, name: str, **kwargs: Any) -> nn.Module:
    return timm.create_model(name, **ctx.sizes.vit, **kwargs)


# ---- measurements: each returns its JSON record and its rows ---------------------------------------------------

def measure_sam(ctx: Context) -> Tuple[Dict[str, Any], List[Row]]:
    """SAM, GSAM, interval SAM and LookSAM against AdamW, blocks of PERIOD closure steps, interleaved."""
    seconds = ctx.budget.take('sam')
    t_start = time.perf_counter()
    s = ctx.sizes
    torch.manual_seed(0)
    base = _vit(ctx, 'vit_base_patch16_224')
    param_bytes = _nbytes(base.parameters())
    x, y = ctx.batch(s.batch, s.img, base.num_classes)
    optimizers: Dict[str, Any] = {}

    def builder(label: str, opt_name: str, kwargs: Dict[str, Any]) -> Callable[[], Step]:
        def build() -> Step:
            model = copy.deepcopy(base).to(ctx.device).train()
            amp_model = Autocast(model, ctx.amp)
            opt = optimizers[label] = create_optimizer_v2(
                model, opt_name, lr=1e-4, weight_decay=0.05, foreach=True, **kwargs)

            def closure() -> torch.Tensor:
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(amp_model(x), y)
                loss.backward()
                return loss

            def block() -> None:
                for _ in range(PERIOD):
                    opt.step(closure)
            return block
        return build

    reported = ('adamw', 'sam', 'gsam', f'sam interval={PERIOD}', f'looksam k={PERIOD}')  # the rows below, no more
    labels = {label: (name, kwargs) for label, (name, kwargs, _) in sam_variants(PERIOD, s.batch).items()
              if label in reported}
    fns, peaks = build_in_memory_windows({k: builder(k, *v) for k, v in labels.items()}, ctx.device, s.warmup)
    blocks, reps = _time(ctx, fns, seconds - (time.perf_counter() - t_start))
    steps = {k: t / PERIOD for k, t in blocks.items()}
    sam = optimizers['sam']
    state = sam.extra_memory_bytes()  # the restore copy and the buffers' (plain SAM keeps no copy of g)
    extra_peak = None if peaks['sam'] is None else peaks['sam'] - peaks['adamw']
    amp = 'bf16' if ctx.amp else 'fp32'
    config = f'vit_base_patch16_224{" (smoke)" if ctx.sizes.vit else ""}, {s.img} px, batch {s.batch}, {amp}'
    name = 'SAM family / AdamW'
    rows = [
        Row(name, 'SAM / AdamW step', time_ratio(steps, 'sam', 'adamw'), goal=SAM_STEP_GOAL),
        Row(name, 'GSAM / AdamW step', time_ratio(steps, 'gsam', 'adamw'), note='2 passes, like SAM'),
        Row(name, f'SAM interval={PERIOD} / AdamW step', time_ratio(steps, f'sam interval={PERIOD}', 'adamw'),
            goal=CHEAP_SAM_GOAL, note=f'{PERIOD + 1} passes per {PERIOD} steps'),
        Row(name, f'LookSAM k={PERIOD} / AdamW step', time_ratio(steps, f'looksam k={PERIOD}', 'adamw'),
            goal=CHEAP_SAM_GOAL, note=f'{PERIOD + 1} passes per {PERIOD} steps'),
        Row(name, 'SAM extra peak memory', copies(extra_peak, param_bytes), unit=' param copies', goal=SAM_PEAK_GOAL,
            note='peak(SAM) - peak(AdamW), max_memory_allocated' if extra_peak is not None else 'CUDA only'),
        Row(name, 'SAM state (restore copy + buffers)', copies(state, param_bytes), unit=' param copies',
            goal=SAM_STATE_GOAL),
    ]
    return _record(name, config, {'': steps}, peaks, reps, time.perf_counter() - t_start), rows


def measure_cb(ctx: Context, cb_name: str, base_name: str) -> Tuple[Dict[str, Any], List[Row]]:
    """A CB ViT and its timm base, plus a second copy of the base: the run's noise floor (A/A)."""
    s = ctx.sizes
    t_start = time.perf_counter()
    torch.manual_seed(0)
    base = _vit(ctx, base_name)
    x, y = ctx.batch(s.batch, s.img, base.num_classes)
    models = {'cb': lambda: _vit(ctx, cb_name), 'base': lambda: base, 'base again': lambda: copy.deepcopy(base)}
    train, infer, peaks, reps = _train_and_infer(ctx, f'cb {cb_name}', models, x, y)
    name = f'CB: {cb_name} / {base_name}'
    config = f'{s.img} px, batch {s.batch}, {"bf16" if ctx.amp else "fp32"}, AdamW'
    rows = [
        Row(name, 'train-step throughput', speed_ratio(train, 'cb', 'base'), goal=CB_GOAL),
        Row(name, 'inference throughput', speed_ratio(infer, 'cb', 'base'), goal=CB_GOAL),
        Row(name, 'A/A train (noise floor)', speed_ratio(train, 'base again', 'base')),
        Row(name, 'A/A inference (noise floor)', speed_ratio(infer, 'base again', 'base')),
    ]
    return _record(name, config, {'train': train, 'inference': infer}, peaks, reps,
                   time.perf_counter() - t_start), rows


def _alternet(ctx: Context, name: str) -> nn.Module:
    return timm.create_model(name, num_classes=100, **ctx.sizes.alternet)


def measure_alternet(ctx: Context) -> Tuple[Dict[str, Any], List[Row]]:
    """alternet_50_cifar vs the paper's pre-activation ResNet-50 (alternet_50_nomsa_cifar), CIFAR shapes."""
    s = ctx.sizes
    t_start = time.perf_counter()
    torch.manual_seed(0)
    x, y = ctx.batch(s.cifar_batch, 32, 100)
    models = {'alternet': lambda: _alternet(ctx, 'alternet_50_cifar'),
              'pre-act resnet': lambda: _alternet(ctx, 'alternet_50_nomsa_cifar')}
    train, infer, peaks, reps = _train_and_infer(ctx, 'alternet', models, x, y)
    name = 'AlterNet-50 / pre-act ResNet-50'
    config = f'alternet_50_cifar vs alternet_50_nomsa_cifar, 32 px, batch {s.cifar_batch}, ' \
             f'{"bf16" if ctx.amp else "fp32"}, AdamW'
    note = 'paper: 1.2x (train or inference not stated)'
    rows = [Row(name, 'train-step throughput', speed_ratio(train, 'alternet', 'pre-act resnet'),
                claim=ALTERNET_CLAIM, note=note),
            Row(name, 'inference throughput', speed_ratio(infer, 'alternet', 'pre-act resnet'),
                claim=ALTERNET_CLAIM, note=note)]
    return _record(name, config, {'train': train, 'inference': infer}, peaks, reps,
                   time.perf_counter() - t_start), rows


def measure_official(ctx: Context) -> Tuple[Dict[str, Any], List[Row]]:
    """Ours vs the official AlterNet-50 (CIFAR layout) with the same weights: forward+backward and inference."""
    name = 'AlterNet: official / ours'
    s = ctx.sizes
    config = f'CIFAR-100 AlterNet-50, 32 px, batch {s.cifar_batch}, {"bf16" if ctx.amp else "fp32"}'
    if ctx.official is None:
        ctx.budget.take('official')
        return dict(name=name, config=config, status='skipped', reason='no --official PATH given', time_ms={},
                    peak_mib={}, reps=0, seconds=0.), [Row(name, 'train (fwd+bwd) speed-up', None),
                                                         Row(name, 'inference speed-up', None)]
    t_start = time.perf_counter()
    torch.manual_seed(0)
    official = official_model(ctx.official, imagenet=False)  # full size: the official code has no smoke sizes
    randomize_norms(official)
    ours = timm.create_model('alternet_50_cifar')
    ours.load_state_dict(convert_official_alternet(official.state_dict(), ours))
    x, y = ctx.batch(s.cifar_batch, 32, 100)
    diff = check_same_outputs(official, ours, x[:4].cpu())
    train, infer, peaks, reps = _train_and_infer(
        ctx, 'official', {'official': lambda: official, 'ours': lambda: ours}, x, y, optimizer=False)
    rows = [Row(name, 'train (fwd+bwd) speed-up', speed_ratio(train, 'ours', 'official'),
                note=f'> 1: ours faster; same outputs (max abs diff {diff:.1e})'),
            Row(name, 'inference speed-up', speed_ratio(infer, 'ours', 'official'), note='> 1: ours faster')]
    return _record(name, config, {'train': train, 'inference': infer}, peaks, reps,
                   time.perf_counter() - t_start), rows


def measure_convstem(ctx: Context) -> Tuple[Dict[str, Any], List[Row]]:
    """vit_small_convstem vs timm's patchify vit_small_patch16_224 (the paper accepts the stem's cost)."""
    s = ctx.sizes
    t_start = time.perf_counter()
    torch.manual_seed(0)
    x, y = ctx.batch(s.batch, s.img, 1000)
    models = {'convstem': lambda: _vit(ctx, 'vit_small_convstem'),
              'patchify': lambda: _vit(ctx, 'vit_small_patch16_224')}
    train, infer, peaks, reps = _train_and_infer(ctx, 'convstem', models, x, y)
    name = 'conv-stem ViT-S / patchify ViT-S'
    config = f'{s.img} px, batch {s.batch}, {"bf16" if ctx.amp else "fp32"}, AdamW'
    rows = [Row(name, 'train-step throughput', speed_ratio(train, 'convstem', 'patchify')),
            Row(name, 'inference throughput', speed_ratio(infer, 'convstem', 'patchify'))]
    return _record(name, config, {'train': train, 'inference': infer}, peaks, reps,
                   time.perf_counter() - t_start), rows


def measure_hvp(ctx: Context) -> Tuple[Dict[str, Any], List[Row]]:
    """One Hessian-vector product (graph built once, as power iteration uses it) / one forward+backward, fp32."""
    seconds = ctx.budget.take('hvp')
    s = ctx.sizes
    t_start = time.perf_counter()
    torch.manual_seed(0)
    model = _vit(ctx, 'vit_small_patch16_224', num_classes=10).to(ctx.device).eval()
    x, y = ctx.batch(s.hvp_batch, s.img, 10)
    params = [p for p in model.parameters() if p.requires_grad]
    v = [torch.randn_like(p) for p in params]

    def fwd_bwd() -> Step:
        return lambda: torch.autograd.grad(F.cross_entropy(model(x), y), params)

    def hvp() -> Step:
        with hessian_context(model):
            operator = HessianOperator(model, F.cross_entropy, (x, y))

        def product() -> None:
            with hessian_context(model):
                operator(v)
        return product

    fns, peaks = build_in_memory_windows({'fwd+bwd': fwd_bwd, 'hvp': hvp}, ctx.device, s.warmup)
    times, reps = _time(ctx, fns, seconds - (time.perf_counter() - t_start))
    name = 'HVP / (fwd+bwd)'
    config = f'vit_small_patch16_224{" (smoke)" if s.vit else ""}, {s.img} px, batch {s.hvp_batch}, fp32'
    rows = [Row(name, 'one HVP / one forward+backward', time_ratio(times, 'hvp', 'fwd+bwd'), goal=HVP_GOAL)]
    return _record(name, config, {'': times}, peaks, reps, time.perf_counter() - t_start), rows


def measurements(ctx: Context) -> List[Callable[[], Tuple[Dict[str, Any], List[Row]]]]:
    return ([lambda: measure_sam(ctx)] + [lambda c=c, b=b: measure_cb(ctx, c, b) for c, b in CB_PAIRS]
            + [lambda: measure_alternet(ctx), lambda: measure_official(ctx), lambda: measure_convstem(ctx),
               lambda: measure_hvp(ctx)])


# ---- the report -----------------------------------------------------------------------------------------------

def _print_rows(rows: List[Row]) -> None:
    for r in rows:
        value = 'n/a' if r.value is None else f'{r.value:.3f}{r.unit}'
        verdict = 'n/a' if r.met is None else ('met' if r.met else 'MISSED')
        goal = '' if r.goal is None else f'  goal {r.goal}: {verdict}'
        claim = f'  (paper {r.claim:g}x)' if r.claim else ''
        print(f'  {r.name:<38} {value:>12}{goal}{claim}', flush=True)


def run_report(args: argparse.Namespace) -> Dict[str, Any]:
    device = torch.device(args.device)
    amp = torch.bfloat16 if args.amp == 'bf16' or (args.amp == 'auto' and device.type == 'cuda') else None
    sizes = SMOKE if args.smoke else FULL
    weights = dict(WEIGHTS) if args.official else {k: w for k, w in WEIGHTS.items() if k != 'official'}
    weights.setdefault('official', 0.)
    budget = Budget(args.budget_s, weights, start=_START)
    ctx = Context(device, amp, sizes, budget, args.official)
    print(f'GPU report on {device_name(device)} ({os.cpu_count()} CPUs): torch {torch.__version__}, '
          f'timm {timm.__version__}, '
          f'AMP {"bf16" if amp else "off"}, {"smoke sizes, " if args.smoke else ""}budget {args.budget_s:.0f} s '
          f'(the repeats fill it; {budget.elapsed():.0f} s spent on imports)', flush=True)
    records, rows = [], []
    steps = measurements(ctx)
    for i, measure in enumerate(steps, 1):
        record, new_rows = measure()
        gc.collect()  # the measurement's models and optimizers go before the next one's memory windows
        if device.type == 'cuda':
            torch.cuda.empty_cache()
        records.append(record)
        rows += new_rows
        print(f'[{i}/{len(steps)}] {record["name"]} ({record["config"]}): '
              f'{record["status"] if record["status"] != "ok" else str(record["reps"]) + " reps"}, '
              f'{record["seconds"]:.1f} s; elapsed {budget.elapsed():.0f} s, ETA <= {budget.left():.0f} s',
              flush=True)
        _print_rows(new_rows)
    return dict(
        schema='timm-ext gpu report 1', device=device_name(device), device_type=device.type, cpus=os.cpu_count(),
        torch=torch.__version__, timm=timm.__version__, timm_ext=timm_ext.__version__,
        cuda=torch.version.cuda if device.type == 'cuda' else None, amp='bf16' if amp else 'off', smoke=args.smoke,
        sizes=asdict(sizes), budget_s=args.budget_s, elapsed_s=budget.elapsed(),
        date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
        argv=args.argv, measurements=records, rows=[r.to_json() for r in rows], all_goals_met=all_met(rows))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='gpu_report.py', description=__doc__.splitlines()[0])
    parser.add_argument('--smoke', action='store_true', help='every measurement at tiny sizes (any device; CI)')
    parser.add_argument('--device', default=None, help='default: cuda when available, else cpu')
    parser.add_argument('--amp', choices=('auto', 'bf16', 'off'), default='auto',
                        help='bf16 autocast (auto: on CUDA only; the HVP row is always fp32)')
    parser.add_argument('--budget-s', type=float, default=None,
                        help='total seconds, imports included; scales the repeats down (default 220; smoke 60)')
    parser.add_argument('--official', type=Path, default=None,
                        help='checkout of xxxnell/how-do-vits-work (needs einops): time its AlterNet against ours')
    parser.add_argument('--out', type=Path, default=None, help=f'folder for {" and ".join(OUT_FILES)}')
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f'--device {args.device}: not a torch device; use cuda, cuda:N or cpu')
    if device.type == 'cuda' and not torch.cuda.is_available():
        parser.error(f'--device {args.device}: CUDA is not available here; use --device cpu --smoke')
    if device.type != 'cuda' and not args.smoke:
        parser.error(f'--device {args.device}: the full sizes (ViT-B/16 at batch 256) take hours off a GPU; '
                     'add --smoke for the tiny-size run')
    if args.budget_s is None:
        args.budget_s = 60. if args.smoke else 220.
    elif args.budget_s <= 0:
        parser.error(f'--budget-s {args.budget_s:g}: give a positive number of seconds, e.g. 220')
    if args.official is not None and not (args.official / 'models' / 'alternet.py').is_file():
        parser.error(f'--official {args.official}: no models/alternet.py there; give a how-do-vits-work checkout')
    if args.out is not None:
        taken = [f for f in OUT_FILES if (args.out / f).exists()]
        if taken:
            parser.error(f'--out {args.out}: already holds {", ".join(taken)}; give a new folder (nothing is '
                         'overwritten)')
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.device == 'cpu':  # one thread, as bench_sam_cost.py: on a loaded machine, threads' spin-waits stall
        torch.set_num_threads(1)
    try:
        report = run_report(args)
    finally:
        torch.set_num_threads(threads)
    table = markdown(report)
    print()
    print(table, end='')
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / 'gpu_report.json').write_text(json.dumps(report, indent=2) + '\n')
        (args.out / 'gpu_report.md').write_text(table)
        print(f'written: {args.out / "gpu_report.json"}, {args.out / "gpu_report.md"}')
    return report


if __name__ == '__main__':
    main()
