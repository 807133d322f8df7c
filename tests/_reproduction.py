"""Shared by the reproduction study's tests: the study's modules, a tiny ImageFolder, fake measured runs.

``reproduction/`` is an application beside the package: its scripts import each other by name, as they do
when run as ``python reproduction/<script>.py``. The fake runs carry every key the report reads.
"""
import json
import math
import sys
from pathlib import Path

import pytest
from _timm_train import TRAIN_PY

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / 'reproduction'))
# the study's power analysis (power.py) needs scipy, which scikit-learn brings (the demo extra): without it, as in
# the floor's virtualenv, the study's tests skip like the demo's
pytest.importorskip('scipy', reason='the reproduction study needs scipy (pip install "timm-ext[demo]")')

import claims  # noqa: E402
import convergence_text  # noqa: E402
import cost_gain  # noqa: E402
import keep_runs  # noqa: E402
import longer_schedules  # noqa: E402
import looksam_reuse  # noqa: E402
import measure_run  # noqa: E402
import plan  # noqa: E402
import power  # noqa: E402
import readings  # noqa: E402
import recover_earlier_runs  # noqa: E402
import registration  # noqa: E402
import report  # noqa: E402
import report_tables  # noqa: E402
import reproduce  # noqa: E402
import run_ledger  # noqa: E402
import run_metrics  # noqa: E402
import run_results  # noqa: E402
import run_times  # noqa: E402
import sections  # noqa: E402
import step_cost  # noqa: E402
import study_jobs  # noqa: E402
import supporting_runs  # noqa: E402

__all__ = ['REPO', 'TRAIN_PY', 'claims', 'convergence_text', 'cost_gain', 'fake_run', 'fake_runs', 'keep_runs',
           'longer_schedules', 'looksam_reuse', 'measure_run', 'plan', 'power', 'readings', 'recover_earlier_runs',
           'registration', 'report', 'report_tables', 'reproduce', 'run_ledger', 'run_metrics', 'run_results',
           'run_times', 'sections', 'step_cost', 'study_jobs', 'supporting_runs', 'tiny_folder', 'write_run']


def tiny_folder(root: Path) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ('train', 'validation'):  # the digits' layout, small: 10 classes, 2 noise images each
        for cls in range(10):
            (root / split / str(cls)).mkdir(parents=True)
            for i in range(2):
                pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / str(cls) / f'{i}.png')
    return root


def fake_run(arm, seed: int) -> dict:
    """A measurement dict with every key the report reads; values move with the arm and the seed."""
    shift = 0.01 * seed
    cb = arm.name.startswith('vit_cb')
    sam = arm.opt.startswith('sam')
    m = dict(arm=arm.name, seed=seed, top1=90.0 + (2.0 if sam else 0.0) + seed, best_top1=93.0 + seed,
             top1_curve=[20.0 + seed] * (arm.epochs - 1) + [90.0 + seed], train_loss_curve=[1.0] * arm.epochs,
             epochs=arm.epochs, converged=True)
    if arm.measure == plan.CURVE:
        return m
    m.update(lambda_max=(20.0 if sam else 40.0) + seed, train_loss=0.1, noisy_loss=(0.8 if sam else 1.0) + shift,
             spectrum=[[5.0, 3.0, -1.0 if arm.model.startswith('vit') else 1.0, 2.0, 1.0]] * 2)
    m['nep'], m['ape'] = (0.2, 2.75) if arm.model.startswith('vit') else (0.0, 2.4)
    if arm.model.startswith('vit'):
        m['activity'] = {'blocks.0.mlp.act': (0.3 if sam else 0.4) + shift, 'blocks.1.mlp.act': 0.5}
    if arm.measure in (plan.VIT_ALL, plan.CNN_ALL, supporting_runs.ATTENTION):
        msa = arm.name == 'alternet'
        m['variance'] = {'stem': 1.0, 'b1': 2.0, 'b2': 1.5 if msa else 3.0}
        m['variance_ratio'] = {'b1': 2.0, 'b2': 0.75 if msa else 1.5}
        m['fourier_at_pi'] = {'stem': -1.0, 'b1': -0.5, 'b2': -0.9 if msa else -0.4}
        m['kinds'] = {'stem': 'stem', 'b1': 'conv', 'b2': 'msa' if msa else 'conv'}
    if arm.measure in (plan.VIT_ALL, supporting_runs.ATTENTION):
        m.update(entropy=[2.0, 1.8, 1.5 - (0.2 if cb else 0.0) + shift, 1.5], cls_entropy=[2.0, 1.8, 1.4, 1.4],
                 distance=[0.6, 0.6, 0.6 + shift, 0.6], max_entropy=math.log(17),
                 tokens={'patch_embed': (0.05 if 'convstem' in arm.model else 0.15) + shift, 'blocks.0': 0.3},
                 cb_layers=[2, 3] if cb else [])
    return m


def fake_runs(root: Path, seeds=(0, 1, 2)) -> Path:
    for arm in supporting_runs.ALL_ARMS:
        for seed in seeds:
            d = root / f'{arm.name}-s{seed}'
            d.mkdir(parents=True)
            (d / 'last.pth.tar').write_bytes(b'x')
            (d / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n' + ''.join(
                f'{e},1.0,1.0,50.0,90.0,0.001\n' for e in range(arm.epochs)))
            (d / 'args.yaml').write_text(f'model: {arm.model}\nseed: {seed}\n')
            (d / measure_run.MEASURE_FILE).write_text(json.dumps(fake_run(arm, seed)))
    return root


def write_run(runs: Path, arm, seed: int, gain: float = 0.0) -> Path:
    """A fake run of ``arm`` whose curve gains ``gain`` points in its last 20 % of epochs (the rule: <= 0.6)."""
    d = runs / f'{arm.name}-s{seed}'
    d.mkdir(parents=True, exist_ok=True)
    m = fake_run(arm, seed)
    tail = round(arm.epochs * plan.CONVERGED_TAIL)
    m['top1_curve'] = [90.0] * (arm.epochs - tail) + [90.0 + gain] * tail
    m['converged'] = measure_run.converged(m['top1_curve'])
    (d / 'last.pth.tar').write_bytes(b'x')
    (d / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n' + ''.join(
        f'{e},1.0,1.0,{top1},99.0,0.001\n' for e, top1 in enumerate(m['top1_curve'])))
    (d / 'args.yaml').write_text(f'model: {arm.model}\nseed: {seed}\n')
    (d / measure_run.MEASURE_FILE).write_text(json.dumps(m))
    return d
