"""``timm-ext demo``: the README's main job, end to end through timm's real train.py on real digits.

The end-to-end test runs ``timm-ext demo --quick`` (2 epochs per run) with train.py from
TIMM_EXT_TIMM_TRAIN (default ../shared/timm-train/v1.0.28) and skips with the reason when it is absent.
"""
import csv
import json
import os
from pathlib import Path

import pytest
import timm
from conftest import require_timm_script

from timm_ext import demo
from timm_ext.cli import main

pytest.importorskip('sklearn', reason='the demo data needs scikit-learn (pip install "timm-ext[demo]")')

REPO = Path(__file__).resolve().parents[1]
_ENV = os.environ.get('TIMM_EXT_TIMM_TRAIN')
_SCRIPTS = Path(_ENV) if _ENV else REPO.parent / 'shared' / 'timm-train' / 'v1.0.28'
TRAIN_PY = _SCRIPTS if _SCRIPTS.suffix == '.py' else _SCRIPTS / 'train.py'


def _result(name, top1, loss):
    return demo.RunResult(
        name=name, label=name.upper(), epochs=[1, 2], train_loss=[2.3, loss], eval_loss=[2.2, loss - 0.1],
        eval_top1=[20.0, top1], wall_s=10.0, train_images=100, folder=f'/x/{name}')


def test_table_has_every_run_and_the_measured_values():
    table = demo.format_table([_result('a', 55.5, 1.25), _result('b', 40.0, 1.5)])
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith('| A | 2 | 55.5 % | 55.5 % | 1.250 | 1.150 | 10 s | 20 |')
    assert '| B | 2 | 40.0 %' in lines[3]


def test_plot_is_written(tmp_path):
    pytest.importorskip('matplotlib')
    path = demo.plot_curves([_result('a', 55.5, 1.25)], tmp_path / 'curves.png')
    assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_runs_are_cb_sam_and_a_plain_adamw_baseline(tmp_path):
    cb_sam, baseline = demo.demo_runs()
    assert (cb_sam.model, cb_sam.opt, cb_sam.opt_kwargs) == ('vit_tiny_cb', 'samadamw', {'rho': demo.DEMO_RHO})
    assert (baseline.model, baseline.opt, baseline.opt_kwargs) == ('vit_tiny_patch16_224', 'adamw', {})
    args = cb_sam.train_args(tmp_path, tmp_path / 'out', 4, demo.MODEL_KWARGS)
    assert args[args.index('--epochs') + 1] == '4'
    assert args[args.index('--opt-kwargs') + 1] == f'rho={demo.DEMO_RHO}'
    # the same budget and data for both: only model, optimizer and run name differ
    a = baseline.train_args(tmp_path, tmp_path / 'out', 4, demo.MODEL_KWARGS)
    differing = {x for x in set(args) ^ set(a)}
    assert differing <= {'cb_sam', 'baseline', 'vit_tiny_cb', 'vit_tiny_patch16_224', 'samadamw', 'adamw',
                         '--opt-kwargs', f'rho={demo.DEMO_RHO}'}
    # the CB model and the baseline are the same ViT apart from Context Broadcasting
    kw = dict(demo.MODEL_KWARGS, num_classes=10)
    cb_model = timm.create_model('vit_tiny_cb', **kw)
    base_model = timm.create_model('vit_tiny_patch16_224', **kw)
    assert sum(p.numel() for p in cb_model.parameters()) == sum(p.numel() for p in base_model.parameters())
    assert cb_model.state_dict().keys() == base_model.state_dict().keys()


def test_existing_output_is_never_written_into(tmp_path, capsys):
    out = tmp_path / 'mine'
    out.mkdir()
    (out / 'results.txt').write_text('keep me')
    code = main(['demo', '--output', str(out), '--no-progress', '--data-root', str(tmp_path / 'data')])
    err = capsys.readouterr().err
    assert code == 2
    assert f'--output {out} exists and is not an empty folder' in err
    assert (out / 'results.txt').read_text() == 'keep me' and len(list(out.iterdir())) == 1


@pytest.mark.parametrize('argv, message', [
    (['--epochs', '0'], '--epochs must be a positive integer, got 0'),
    (['--rho', '0'], '--rho must be > 0, got 0.0'),
])
def test_bad_values_are_one_line(tmp_path, capsys, argv, message):
    code = main(['demo', *argv, '--output', str(tmp_path / 'o'), '--data-root', str(tmp_path / 'data')])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f'timm-ext demo: error: {message}'
    assert not (tmp_path / 'o').exists()


def test_missing_train_py_is_one_line_before_anything_is_written(tmp_path, capsys):
    code = main(['demo', '--timm-train', str(tmp_path / 'nowhere'), '--output', str(tmp_path / 'o'),
                 '--data-root', str(tmp_path / 'data'), '--no-progress'])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and 'nowhere' in err
    assert not (tmp_path / 'o').exists()


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path, capsys, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(TRAIN_PY))
    out = tmp_path / 'demo'
    code = main(['demo', '--quick', '--output', str(out), '--data-root', str(tmp_path / 'data'), '--no-progress'])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    summary = json.loads((out / 'summary.json').read_text())
    assert [r['name'] for r in summary['runs']] == ['cb_sam', 'baseline']
    for run in summary['runs']:
        with open(out / run['name'] / 'summary.csv', newline='') as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == demo.QUICK_EPOCHS
        assert run['eval_top1'] == [float(r['eval_top1']) for r in rows]
        assert run['train_loss'] == [float(r['train_loss']) for r in rows]
        assert run['top1'] > 20.0, run  # 10 classes: chance is 10 %
        assert run['train_loss'][-1] < run['train_loss'][0]
        assert (out / f'{run["name"]}.log').stat().st_size > 0
        assert f'{run["top1"]:.1f} %' in stdout
    assert summary['train_images'] == 1438
    assert (out / 'curves.png').read_bytes()[:4] == b'\x89PNG'
    assert 'summary:' in stdout and str(out / 'summary.json') in stdout
