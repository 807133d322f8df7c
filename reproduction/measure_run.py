"""Measure one finished run of the reproduction study: ``python reproduction/measure_run.py RUN_DIR ARM SEED``.

Loads the run's ``last.pth.tar`` and measures what its arm's ``measure`` set asks for with
:mod:`timm_ext.analysis`, on the run's own 16 px images through train.py's evaluation transform:
``MEASURE_TRAIN`` training images (the Hessian, weight noise and active neurons, as the papers use
training data for these) and ``MEASURE_VAL`` validation images (attention, tokens, feature maps). The
images are the same for every run of a seed. It writes ``timm_ext_measurements.json`` beside the
checkpoint; a separate process per run keeps one thread and no state between runs.
"""
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch
import torch.nn.functional as F
from plan import (
    CNN_ALL,
    CONVERGED_GAIN,
    CONVERGED_TAIL,
    CURVE,
    IMAGE_SIZE,
    MEASURE_FILE,
    VIT_ALL,
    WEIGHT_DECAY,
    Arm,
)

from timm_ext.machine import cpu_name

BATCH = 16  # the how-do-vits-work Hessian spectra use mini-batches of 16
TRAIN_BATCHES = 4  # 64 training images
VAL_BATCHES = 8  # 128 validation images (batches of 16)
NOISE_SIGMA = 0.05
NOISE_SAMPLES = 10
SPECTRUM_TOP_K = 5
SPECTRUM_MAX_ITER = 50


def tail_gain(curve: List[float]) -> float:
    """Best top-1 of the last ``CONVERGED_TAIL`` of the epochs minus the best before them (inf: too short to tell)."""
    tail = max(1, int(round(len(curve) * CONVERGED_TAIL)))
    return max(curve[-tail:]) - max(curve[:-tail]) if len(curve) > tail else math.inf


def converged(curve: List[float]) -> bool:
    """The study's convergence rule on a top-1 curve (see ``plan.CONVERGED_GAIN``)."""
    return tail_gain(curve) <= CONVERGED_GAIN


def curves(run_dir: Path) -> Dict[str, Any]:
    """Top-1 and training loss per epoch from the run's summary.csv, and whether it converged."""
    from timm_ext.demo.runner import read_summary

    rows = read_summary(run_dir / 'summary.csv')
    top1 = [r['eval_top1'] for r in rows]
    return dict(top1=top1[-1], best_top1=max(top1), top1_curve=top1, train_loss_curve=[r['train_loss'] for r in rows],
                epochs=len(rows), converged=converged(top1))


def run_batches(data_dir: Path, split: str, batches: int, seed: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` seeded batches of ``BATCH`` images of ``split`` with train.py's evaluation transform."""
    from timm.data import ImageDataset, create_transform

    transform = create_transform(input_size=(3, IMAGE_SIZE, IMAGE_SIZE), crop_pct=1.0, interpolation='bilinear',
                                 mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), is_training=False)
    dataset = ImageDataset(str(data_dir / split), transform=transform)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    out = []
    for b in range(batches):
        items = [dataset[i] for i in order[b * BATCH:(b + 1) * BATCH]]
        out.append((torch.stack([x for x, _ in items]), torch.tensor([int(y) for _, y in items])))
    return out


def _ratios(values: Dict[str, float]) -> Dict[str, float]:
    names = list(values)
    return {n: values[n] / values[p] for p, n in zip(names, names[1:])}


def measure(run_dir: Path, arm: Arm, seed: int, data_dir: Path, val_dir: Path) -> Dict[str, Any]:
    """Every number the report needs from one run (``arm.measure`` decides which)."""
    from timm_ext import analysis as A
    from timm_ext.analysis import feature_points
    from timm_ext.analysis.runner import build_model

    out: Dict[str, Any] = dict(arm=arm.name, seed=seed, **curves(run_dir))
    if arm.measure == CURVE:
        return out
    model = build_model(arm.model, run_dir / 'last.pth.tar', dict(arm.model_kwargs), num_classes=10)
    train = run_batches(data_dir, 'train', TRAIN_BATCHES, seed)
    timings: Dict[str, float] = {}
    hessian = arm.measure != 'attention'  # the supporting training-length runs (supporting_runs.ATTENTION)

    def timed(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        value = fn(*args, **kwargs)
        timings[name] = round(time.perf_counter() - t0, 2)
        return value

    if hessian:
        out['lambda_max'] = timed('lambda_max', A.hessian_lambda_max, model, F.cross_entropy, train, max_iter=20,
                                  tol=1e-2)
        noise = timed('noise', A.noisy_loss, model, F.cross_entropy, train, sigma=NOISE_SIGMA,
                      samples=NOISE_SAMPLES, seed=seed)
        out.update(train_loss=noise['loss'], noisy_loss=noise['noisy_loss'])
        spectrum = timed('spectrum', A.hessian_max_eigenvalue_spectrum, model, F.cross_entropy, train,
                         k=SPECTRUM_TOP_K, weight_decay=WEIGHT_DECAY, max_iter=SPECTRUM_MAX_ITER, tol=1e-3,
                         seed=seed)
        out['spectrum'] = spectrum
        out['nep'], out['ape'] = A.nep_ape([v for batch in spectrum for v in batch])
    if arm.model.startswith('vit'):
        out['activity'] = dict(timed('activity', A.active_neuron_fraction, model, [x for x, _ in train]))
    if arm.measure in (VIT_ALL, CNN_ALL, 'attention'):
        val = [x for x, _ in run_batches(val_dir, 'validation', VAL_BATCHES, seed)]
        variance = timed('variance', A.feature_variance_per_block, model, val)
        out['variance'] = dict(variance)
        out['variance_ratio'] = _ratios(variance)
        out['fourier_at_pi'] = {k: float(v[-1]) for k, v in timed('fourier', A.fourier_per_block, model,
                                                                    val).items()}
        points = feature_points(model)
        out['kinds'] = {n: points[n].kind for n in variance}
    if arm.measure in (VIT_ALL, 'attention'):
        stats = timed('attention', A.attention_stats, model, val)
        out['entropy'] = stats['entropy'].mean(dim=1).tolist()
        out['cls_entropy'] = A.attention_entropy(model, val, queries='cls').mean(dim=1).tolist()
        out['distance'] = stats['distance'].mean(dim=1).tolist()
        out['max_entropy'] = float(stats['max_entropy'][0])
        out['tokens'] = dict(timed('tokens', A.token_cosine_similarity, model, val))
        out['cb_layers'] = list(getattr(model, 'cb_layers', ()) or ())
    out['measure_seconds'] = timings
    for key in ('lambda_max', 'ape'):
        if key in out and not math.isfinite(out[key]):
            out[key] = None
    return out


def main(argv: List[str]) -> int:
    run_dir, arm_name, seed = Path(argv[0]), argv[1], int(argv[2])
    torch.set_num_threads(1)
    from supporting_runs import ALL_ARMS_BY_NAME

    from timm_ext.data import digits_image_folder, digits_subset_folder

    arm = ALL_ARMS_BY_NAME[arm_name]
    full = digits_image_folder(size=IMAGE_SIZE)
    data_dir = digits_subset_folder(arm.fraction, size=IMAGE_SIZE) if arm.fraction < 1 else full
    t0, c0 = time.perf_counter(), time.process_time()
    out = measure(run_dir, arm, seed, data_dir, full)
    out['measure_wall_s'] = round(time.perf_counter() - t0, 1)
    # this process's own CPU over the same span: wall-clock is not CPU time where lanes share the cores
    out['measure_cpu_s'] = round(time.process_time() - c0, 1)
    out['cpu'] = cpu_name()  # the machine that trained and measured the run: the report names it per run
    out['cores'] = os.cpu_count()  # and its cores, to read the CPU time and the lanes against
    tmp = run_dir / (MEASURE_FILE + '.tmp')
    tmp.write_text(json.dumps(out))
    tmp.replace(run_dir / MEASURE_FILE)
    return 0


if __name__ == '__main__':
    raise SystemExit(main(sys.argv[1:]))
