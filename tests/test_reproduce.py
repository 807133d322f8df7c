"""benchmarks/reproduce.py and its parts: train.py arguments per arm, the plan of what is cached, the convergence
rule, the claims' statistics and the report (no training here; the measurement runs on an untrained model)."""
import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import require_timm_script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / 'benchmarks'))  # applications beside the package, not importable modules of it
reproduce = importlib.import_module('reproduce')
plan = importlib.import_module('_repro_plan')
support = importlib.import_module('_repro_support')
measure_mod = importlib.import_module('_repro_measure')
report = importlib.import_module('_repro_report')

_ENV = os.environ.get('TIMM_EXT_TIMM_TRAIN')
_SCRIPTS = Path(_ENV) if _ENV else REPO.parent / 'shared' / 'timm-train' / 'v1.0.28'
TRAIN_PY = _SCRIPTS if _SCRIPTS.suffix == '.py' else _SCRIPTS / 'train.py'


def _tiny_folder(root: Path) -> Path:
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


def test_every_arm_is_a_valid_train_py_command(tmp_path):
    from timm_ext.launch.commands import build_train_command

    require_timm_script(TRAIN_PY)
    data = _tiny_folder(tmp_path / 'data')
    for arm in plan.ARMS + importlib.import_module('_repro_extend').EXTENSION_ARMS:  # revision 2.4's schedules too
        args = reproduce.train_args(arm, data, tmp_path / 'runs', seed=2)
        assert args.count('--seed') == 1 and args[args.index('--seed') + 1] == '2'
        assert args[args.index('--experiment') + 1] == f'{arm.name}-s2'
        assert args[args.index('--lr') + 1] == f'{arm.lr:g}'
        assert args[args.index('--epochs') + 1] == str(round(arm.schedule / arm.fraction))
        argv = build_train_command(args, timm_train=TRAIN_PY).argv  # checked against train.py's own parser
        assert argv[argv.index('--model') + 1] == arm.model


def test_plan_arms_and_claims_are_consistent():
    names = {a.name for a in plan.ARMS}
    assert len(names) == len(plan.ARMS) == 13
    for claim in plan.CLAIMS:
        sides = [s for s in (claim.a, claim.b) if s is not None]
        for side in sides:
            for arm in (side if isinstance(side, tuple) else (side,)):
                assert arm in names, (claim.key, arm)
        assert claim.direction in ('increase', 'decrease', 'unchanged') and claim.margin > 0
    assert set(plan.V1_VERDICTS) <= {c.key for c in plan.CLAIMS}
    # arms that share an architecture differ only in what the comparison is about
    assert plan.ARM_BY_NAME['vit'].model == plan.ARM_BY_NAME['vit_sam'].model
    assert plan.ARM_BY_NAME['vit_quarter'].epochs == 4 * plan.VIT_EPOCHS == 240  # the same steps as the full data
    assert plan.ARM_BY_NAME['vit'].epochs == 60 and plan.ARM_BY_NAME['resnet'].epochs == plan.EPOCHS == 30
    # revision 2.1: the ETA's cost follows the schedule (a 60-epoch ViT costs two 30-epoch units, plus measuring)
    assert plan.ARM_BY_NAME['vit'].cost == pytest.approx(2.0 + 0.35)
    assert support.ALL_ARMS_BY_NAME['vit_e30'].cost == pytest.approx(1.0 + 0.05)
    assert not {a.name for a in support.SUPPORT_ARMS} & names  # an arm is a claim arm or a supporting run


@pytest.mark.parametrize('curve, expected', [
    ([10, 50, 80, 90, 90.2, 90.4, 90.5, 90.5, 90.6, 90.5], True),  # +0.1 in the last 2 epochs: a plateau
    ([10, 50, 80, 90, 90.2, 90.4, 90.5, 90.5, 91.2, 90.5], False),  # +0.7 over the best before: not yet
    ([10, 20, 30, 40, 50, 60, 70, 80, 90, 95], False),  # still climbing
    ([10.0], False),  # one epoch: nothing to compare with
])
def test_convergence_rule(curve, expected):
    assert measure_mod.converged(curve) is expected


def _fake_run(arm, seed: int) -> dict:
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
    if arm.measure in (plan.VIT_ALL, plan.CNN_ALL, support.ATTENTION):
        msa = arm.name == 'alternet'
        m['variance'] = {'stem': 1.0, 'b1': 2.0, 'b2': 1.5 if msa else 3.0}
        m['variance_ratio'] = {'b1': 2.0, 'b2': 0.75 if msa else 1.5}
        m['fourier_at_pi'] = {'stem': -1.0, 'b1': -0.5, 'b2': -0.9 if msa else -0.4}
        m['kinds'] = {'stem': 'stem', 'b1': 'conv', 'b2': 'msa' if msa else 'conv'}
    if arm.measure in (plan.VIT_ALL, support.ATTENTION):
        m.update(entropy=[2.0, 1.8, 1.5 - (0.2 if cb else 0.0) + shift, 1.5], cls_entropy=[2.0, 1.8, 1.4, 1.4],
                 distance=[0.6, 0.6, 0.6 + shift, 0.6], max_entropy=math.log(17),
                 tokens={'patch_embed': (0.05 if 'convstem' in arm.model else 0.15) + shift, 'blocks.0': 0.3},
                 cb_layers=[2, 3] if cb else [])
    return m


def _fake_runs(root: Path, seeds=(0, 1, 2)) -> Path:
    for arm in support.ALL_ARMS:
        for seed in seeds:
            d = root / f'{arm.name}-s{seed}'
            d.mkdir(parents=True)
            (d / 'last.pth.tar').write_bytes(b'x')
            (d / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n' + ''.join(
                f'{e},1.0,1.0,50.0,90.0,0.001\n' for e in range(arm.epochs)))
            (d / 'args.yaml').write_text(f'model: {arm.model}\nseed: {seed}\n')
            (d / measure_mod.MEASURE_FILE).write_text(json.dumps(_fake_run(arm, seed)))
    return root


def test_claims_are_paired_differences_with_the_preregistered_verdicts(tmp_path):
    r = report.load_results(_fake_runs(tmp_path / 'runs'), plan.ARMS, [0, 1, 2])
    claims = {c.claim.key: c for c in report.evaluate(r)}
    assert len(claims) == len(plan.CLAIMS)
    top1 = claims['sam_vit_top1']  # +2 points in every seed: interval [2, 2] > margin 1
    assert top1.diff.diffs == (2.0, 2.0, 2.0) and top1.label == 'reproduced' and top1.agree == 3
    assert claims['sam_vit_gain_larger'].diff.diffs == (0.0, 0.0, 0.0)  # same gain for both architectures
    assert claims['sam_vit_gain_larger'].label == 'not reproduced'  # [0, 0] lies inside +-1 point
    lam = claims['sam_lambda_max']
    assert lam.diff.diffs == pytest.approx([math.log((20 + s) / (40 + s)) for s in range(3)])
    assert lam.label == 'reproduced'
    assert claims['msa_variance'].diff.diffs == pytest.approx([math.log(0.75)] * 3)  # the MSA block only
    assert claims['msa_variance'].label == 'reproduced'
    assert claims['msa_lowpass'].diff.diffs == pytest.approx([-0.4] * 3)
    assert claims['hessian_vit_nep'].diff.diffs == pytest.approx([0.2] * 3)
    assert claims['cb_entropy_all'].diff.diffs == pytest.approx([-0.1] * 3)  # -0.2 in layer 3, mean of layers 3-4
    assert claims['cb_distance'].label == 'reproduced'  # unchanged: [0, 0] inside +-0.02
    assert claims['cb_top1'].label == 'not reproduced'


def test_unchanged_verdict_branches():
    from timm_ext.analysis.stats import paired_difference

    inside = paired_difference([0.0, 0.0, 0.0], [0.001, -0.001, 0.0])
    beyond = paired_difference([0.0, 0.0, 0.0], [0.5, 0.6, 0.55])
    wide = paired_difference([0.0, 0.0, 0.0], [0.5, -0.6, 0.05])
    assert report.unchanged_verdict(inside, 0.02) == ('reproduced', 3)
    assert report.unchanged_verdict(beyond, 0.02) == ('not reproduced', 0)
    assert report.unchanged_verdict(wide, 0.02) == ('inconclusive', 0)


@pytest.mark.slow
def test_report_from_cached_runs(tmp_path):
    pytest.importorskip('matplotlib')
    runs = _fake_runs(tmp_path / 'runs')
    path = report.write_report(runs, support.ALL_ARMS, [0, 1, 2], tmp_path / 'docs', 'python benchmarks/reproduce.py',
                               wall_s=30.0, trained=0)
    text = path.read_text()
    assert text.splitlines()[0].startswith('# The papers\' claims')
    rows = [line for line in text.splitlines() if line.startswith('| SAM raises the ViT\'s top-1 |')]
    assert rows == ['| SAM raises the ViT\'s top-1 | vit-sam, Sec. 4, Table 2 | +2.00 pt [+2.00 pt, +2.00 pt] | '
                    '±1 pt | 3/3 | **reproduced** | inconclusive | not measured |']
    assert '| ViT + SAM, 1/4 data | `vit_tiny_patch16_224` | samadamw | 0.001 | 0.25 | 240 |' in text
    # the vit-sam paper's convergence test: 30 -> 60 epochs, same seed (the fake runs have the same top-1)
    assert ('top-1 gained by doubling, same seed: ViT 30 -> 60 epochs +0.00 pt [+0.00 pt, +0.00 pt]; ViT + CB 30 -> '
            '60 epochs +0.00 pt') in text
    assert '| 1.5e-3 | 60 |' in text and '| 1e-3 | 60 |' in text  # the lr table names each row's schedule
    # a cache can hold runs of several studies: the report gives their span and run time, not a study's duration
    assert 'cached runs took 0 min one core each' in text and 'From a clean cache' not in text
    for png in ('claims.png', 'sam_activity.png', 'cb_cls_entropy.png', 'hessian_spectrum.png',
                'stem_top1_lr1.5e-3.png', 'alternet_variance.png', 'sam_top1_fraction.png'):
        assert f'(reproduction/{png})' in text and (tmp_path / 'docs' / 'reproduction' / png).is_file()
    why = text[text.index('## Why the claims that fail here fail'):]
    assert '**Top-1 near the ceiling.**' in why and 'ViT + AdamW 32.3' in why  # (100 - 91) % of 359 images
    assert 'NEP / APE: ViT 0.20 / 2.8; ResNet 0.00 / 2.4' in why  # the end-of-warmup runs
    assert '**Token similarity.**' not in why  # that claim reproduced in these runs
    # CB - ViT by training length: the 30-epoch supporting runs, then the study's own 60-epoch arms
    assert 'after a complete schedule of 30 epochs +0.000' in why and '; 60 epochs +0.000' in why
    assert 'In depth (30-epoch schedules)' in why  # CB in every block against ViT and CB trained as long
    # the conv stem's lead by training length (the fake stems tie: the claim is not reproduced)
    assert ('**The conv stem at lr 1e-3.** Its lead over patchify shrinks as patchify catches up: conv stem - patchify '
            'top-1 after epoch 6 of 60 +0.00 pt [+0.00 pt, +0.00 pt]; at the end of 30-epoch schedules') in why
    assert 'Doubling the schedule from 30 to 60 epochs raised patchify by +0.00 pt' in why
    saved = json.loads((tmp_path / 'docs' / 'reproduction' / 'measurements.json').read_text())
    assert saved['runs']['vit'][1]['train_args'] == {'model': 'vit_tiny_patch16_224', 'seed': 1}
    assert saved['claims']['sam_vit_top1']['verdict'] == 'reproduced'
    assert saved['arms']['vit_half']['epochs'] == 2 * plan.VIT_EPOCHS


def test_plan_reuses_cached_runs_and_refuses_report_only_when_runs_are_missing(tmp_path, monkeypatch, capsys):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = _fake_runs(tmp_path / 'runs', seeds=(0,))
    os.remove(runs / 'vit_sam-s0' / measure_mod.MEASURE_FILE)  # trained, not measured
    arms = [plan.ARM_BY_NAME[n] for n in ('vit', 'vit_sam')]
    jobs = reproduce.plan_jobs(runs, arms, [0, 1], timm_train=str(TRAIN_PY))
    keys = {j.key: len(j.commands) for j in jobs}
    assert keys == {'vit_sam-s0': 1, 'vit-s1': 2, 'vit_sam-s1': 2}  # vit-s0 is cached
    assert jobs[0].commands[0][-3:] == [str(runs / 'vit_sam-s0'), 'vit_sam', '0']
    with pytest.raises(SystemExit):
        reproduce.main(['--runs', str(runs), '--arms', 'vit', 'vit_sam', '--seeds', '0', '1', '--report-only',
                        '--timm-train', str(TRAIN_PY)])
    err = capsys.readouterr()
    lines = {line.split()[0]: line for line in err.out.splitlines()[1:3]}
    assert lines['vit'].endswith('60 epochs: train 1, measure only 0, cached 1')
    assert lines['vit_sam'].endswith('60 epochs: train 1, measure only 1, cached 0')
    assert 'ETA:' in err.out
    assert ('--report-only: 3 run(s) are not trained or measured in ' in err.err
            and '(first: vit_sam-s0)' in err.err)


def test_unknown_arm_is_one_line(capsys):
    with pytest.raises(SystemExit):
        reproduce.main(['--arms', 'vit', 'vitt', '--dry-run'])
    assert "unknown arm 'vitt': choose from " in capsys.readouterr().err


def test_measure_reads_every_quantity_from_a_checkpoint(tmp_path, monkeypatch):
    import timm

    import timm_ext  # noqa: F401  (registers the models)

    monkeypatch.setattr(measure_mod, 'TRAIN_BATCHES', 1)
    monkeypatch.setattr(measure_mod, 'VAL_BATCHES', 1)
    monkeypatch.setattr(measure_mod, 'SPECTRUM_MAX_ITER', 3)
    data = _tiny_folder(tmp_path / 'data')
    arm = plan.ARM_BY_NAME['vit_cb']
    run = tmp_path / 'run'
    run.mkdir()
    torch.manual_seed(0)
    model = timm.create_model(arm.model, num_classes=10, **arm.model_kwargs)
    torch.save({'state_dict': model.state_dict(), 'arch': arm.model}, run / 'last.pth.tar')
    (run / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n0,2.0,2.0,10.0,50.0,0.001\n'
                                     '1,1.5,1.5,30.0,70.0,0.0005\n')
    m = measure_mod.measure(run, arm, 0, data, data)
    assert m['top1_curve'] == [10.0, 30.0] and m['converged'] is False
    assert len(m['spectrum']) == 1 and len(m['spectrum'][0]) == measure_mod.SPECTRUM_TOP_K
    assert 0.0 <= m['nep'] <= 1.0
    assert m['cb_layers'] == [2, 3] and len(m['entropy']) == len(m['cls_entropy']) == 4
    assert set(m['activity']) == {f'blocks.{i}.mlp.act' for i in range(4)}
    assert m['lambda_max'] > 0 and m['noisy_loss'] > 0


def test_run_jobs_runs_each_jobs_commands_in_order_and_names_the_failed_ones(tmp_path):
    arm = plan.ARM_BY_NAME['vit']
    ok_dir, bad_dir = tmp_path / 'runs' / 'vit-s0', tmp_path / 'runs' / 'vit-s1'
    write = 'import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True); ' \
            'p.write_text(p.read_text() + sys.argv[2] if p.exists() else sys.argv[2])'
    ok_dir.mkdir(parents=True)
    (ok_dir / 'order').write_text('stale,')  # an unfinished run: removed before its train command
    ok = reproduce.Job(arm, 0, ok_dir, [[sys.executable, '-c', write, str(ok_dir / 'order'), 'train,'],
                                        [sys.executable, '-c', write, str(ok_dir / 'order'), 'measure']], 1.0)
    bad = reproduce.Job(arm, 1, bad_dir, [[sys.executable, '-c', 'raise SystemExit(3)'],
                                          [sys.executable, '-c', write, str(bad_dir / 'order'), 'never']], 1.0)
    lines = []
    with pytest.raises(RuntimeError, match=r'^1 run\(s\) failed: vit-s1; their logs are in '):
        reproduce.run_jobs([ok, bad], tmp_path / 'runs', lanes=2, log=lines.append)
    assert (ok_dir / 'order').read_text() == 'train,measure'  # the second command ran after the first
    assert not (bad_dir / 'order').exists()  # a failed command stops its job
    assert any('vit-s0: done' in line for line in lines) and any('vit-s1: FAILED' in line for line in lines)


def _write_run(runs: Path, arm, seed: int, gain: float = 0.0) -> Path:
    """A fake run of ``arm`` whose curve gains ``gain`` points in its last 20 % of epochs (the rule: <= 0.6)."""
    d = runs / f'{arm.name}-s{seed}'
    d.mkdir(parents=True, exist_ok=True)
    m = _fake_run(arm, seed)
    tail = round(arm.epochs * plan.CONVERGED_TAIL)
    m['top1_curve'] = [90.0] * (arm.epochs - tail) + [90.0 + gain] * tail
    m['converged'] = measure_mod.converged(m['top1_curve'])
    (d / 'last.pth.tar').write_bytes(b'x')
    (d / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n' + ''.join(
        f'{e},1.0,1.0,{top1},99.0,0.001\n' for e, top1 in enumerate(m['top1_curve'])))
    (d / 'args.yaml').write_text(f'model: {arm.model}\nseed: {seed}\n')
    (d / measure_mod.MEASURE_FILE).write_text(json.dumps(m))
    return d


def test_lr_sweep_pair_trains_again_at_twice_the_schedule_until_both_runs_converge(tmp_path):
    pytest.importorskip('matplotlib')
    extend = importlib.import_module('_repro_extend')
    runs = _fake_runs(tmp_path / 'runs')
    a, b = (plan.ARM_BY_NAME[n] for n in plan.EXTENDED_PAIRS[0])
    names, seeds = [x.name for x in support.ALL_ARMS], [0, 1, 2]
    assert extend.pending(runs, names, seeds) == []  # every run converged
    _write_run(runs, a, 2, gain=0.84)  # patchify seed 2 misses the rule at 60 epochs
    todo = extend.pending(runs, names, seeds)
    assert [(arm.name, arm.epochs, seed) for arm, seed in todo] == [(f'{a.name}_x2', 120, 2),
                                                                      (f'{b.name}_x2', 120, 2)]
    assert extend.pending(runs, [a.name], seeds) == []  # a pair runs only when both of its arms are in the study
    for arm, seed in todo:
        _write_run(runs, arm, seed, gain=0.28)  # both converge at 120 epochs
    assert extend.pending(runs, names, seeds) == []
    assert extend.tried(runs, a.name, 2) == [runs / f'{a.name}-s2', runs / f'{a.name}_x2-s2']
    assert extend.tried(runs, a.name, 1) == [runs / f'{a.name}-s1']
    r = report.load_results(runs, support.ALL_ARMS, seeds)
    assert [len(m['top1_curve']) for m in r[a.name]] == [60, 60, 120] and r[a.name][2]['converged']
    assert [x['run'] for x in r[b.name][2]['replaced']] == [f'{b.name}-s2']  # the partner trains again too
    path = report.write_report(runs, support.ALL_ARMS, seeds, tmp_path / 'docs', 'python benchmarks/reproduce.py',
                               wall_s=30.0, trained=2)
    text = path.read_text()
    assert f'| {a.label} | `{a.model}` | adamw | 0.0015 | 1 | 60 (seed 2: 120) | ' in text
    assert '| 1.5e-3 | 60 (seed 2: 120) |' in text
    assert (f'with the replaced runs\' gain in their last 20% of epochs: {a.name} seed 2: 60 epochs (+0.8) -> 120; '
            f'{b.name} seed 2: 60 epochs (+70.0) -> 120.') in text
    assert 'trained 2 of the 65 runs' in text  # 21 arms x 3 seeds in the tables, 2 replaced
    saved = json.loads((tmp_path / 'docs' / 'reproduction' / 'measurements.json').read_text())
    assert saved['runs'][a.name][2]['replaced'][0]['top1_curve'][-1] == pytest.approx(90.84)
    # still missing at 120 and at 240 epochs: no third doubling, and the 240-epoch run is named as not converged
    _write_run(runs, extend.doubled(a, 1), 2, gain=1.5)
    todo = extend.pending(runs, names, seeds)
    assert [(arm.name, arm.epochs) for arm, _ in todo] == [(f'{a.name}_x4', 240), (f'{b.name}_x4', 240)]
    for arm, seed in todo:
        _write_run(runs, arm, seed, gain=2.0 if arm.name.startswith(a.name + '_') else 0.0)
    assert extend.pending(runs, names, seeds) == []
    r = report.load_results(runs, support.ALL_ARMS, seeds)
    assert len(r[a.name][2]['top1_curve']) == 240 and not r[a.name][2]['converged']
    assert f'{a.name} seed 2 (+2.0)' in '\n'.join(report._not_converged(r, plan.ARMS))


def test_report_only_refuses_while_the_lr_sweep_pair_must_train_again(tmp_path, monkeypatch, capsys):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = _fake_runs(tmp_path / 'runs', seeds=(0,))
    a, b = plan.EXTENDED_PAIRS[0]
    _write_run(runs, plan.ARM_BY_NAME[b], 0, gain=1.1)  # the conv stem misses the rule
    with pytest.raises(SystemExit):
        reproduce.main(['--runs', str(runs), '--arms', a, b, '--seeds', '0', '--report-only',
                        '--timm-train', str(TRAIN_PY)])
    err = capsys.readouterr()
    assert 'trains both again at twice the schedule (revision 2.4; up to 2 times)' in err.out
    assert f'the plan is cached; first 2 run(s) at a longer schedule (revision 2.4: {a}_x2-s0, {b}_x2-s0)' in err.out
    assert '--report-only: 2 run(s) are not trained or measured in ' in err.err and f'(first: {a}_x2-s0)' in err.err


def test_main_trains_the_pair_again_then_writes_the_report(tmp_path, monkeypatch, capsys):
    pytest.importorskip('matplotlib')
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = _fake_runs(tmp_path / 'runs', seeds=(0, 1))
    a, b = plan.EXTENDED_PAIRS[0]
    _write_run(runs, plan.ARM_BY_NAME[a], 0, gain=0.9)
    batches = []

    def fake_run_jobs(jobs, runs_dir, lanes, log=None):  # train and measure: a converged run per job
        batches.append([j.key for j in jobs])
        for job in jobs:
            _write_run(runs_dir, job.arm, job.seed, gain=0.0)

    monkeypatch.setattr(reproduce, 'run_jobs', fake_run_jobs)
    assert reproduce.main(['--runs', str(runs), '--arms', a, b, '--seeds', '0', '1', '--docs', str(tmp_path / 'docs'),
                           '--timm-train', str(TRAIN_PY)]) == 0
    assert batches == [[], [f'{a}_x2-s0', f'{b}_x2-s0']]  # nothing else to train, then one doubling
    assert f'2 run(s) at twice the schedule, where the lr sweep\'s pair missed the convergence rule: {a}_x2-s0, ' \
           f'{b}_x2-s0' in capsys.readouterr().out
    text = (tmp_path / 'docs' / 'reproduction.md').read_text()
    assert '| 0.0015 | 1 | 120 (seed 1: 60) |' in text and 'trained 2 of the 6 runs' in text
