"""timm_ext.demo.builtin_loop: the demo's own loop of timm's parts, for a machine without train.py.

It takes the demo's train.py arguments and no others (one line naming the argument, exit 2), parses them to
train.py's own values, and gives train.py's results: the slow test trains the quick demo's two runs through
both routes and finds every ``summary.csv`` number the same, epoch by epoch (train.py from
TIMM_EXT_TIMM_TRAIN, default ../shared/timm-train/v1.0.28; skipped with the reason when it is absent).
"""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _timm_train import TRAIN_PY
from conftest import require_timm_script

from timm_ext.demo import runs as demo
from timm_ext.demo.builtin_loop import PROG, main, parse_loop_args

REPO = Path(__file__).resolve().parents[1]
REFUSED = (f'{PROG}: error: --drop is not an argument of the demo\'s built-in loop, which takes only the train.py '
           f'arguments of `timm-ext demo`\'s runs; for any other, train with timm\'s train.py (timm-ext train '
           f'--timm-train PATH)')


def _args(tmp_path, name='vit', epochs=4):
    run = {r.name: r for r in demo.demo_runs()}[name]
    return run.train_args(tmp_path / 'data', tmp_path / 'out', epochs)


def _without(args, option):
    i = args.index(option)
    return args[:i] + args[i + 2:]


@pytest.mark.parametrize('change, message', [
    (lambda a: a + ['--drop', '0.1'], REFUSED),
    (lambda a: a[:a.index('--device') + 1] + ['cuda'] + a[a.index('--device') + 2:],
     f'{PROG}: error: argument --device: invalid choice: \'cuda\' (choose from \'cpu\')'),
    (lambda a: _without(a, '--lr'), f'{PROG}: error: the following arguments are required: --lr'),
    (lambda a: a + ['--hflip', 'x'], f'{PROG}: error: argument --hflip: invalid float value: \'x\''),
])
def test_what_the_loop_does_not_take_is_one_line(tmp_path, capsys, change, message):
    assert main(change(_args(tmp_path))) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == message and captured.out == ''
    assert not (tmp_path / 'out').exists()


def test_the_loop_as_a_process_refuses_in_one_line_without_a_traceback(tmp_path):
    done = subprocess.run([sys.executable, '-m', 'timm_ext.demo.builtin_loop', *_args(tmp_path), '--drop', '0.1'],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    # timm 1.0.23 on torch 2.14 warns at import (torch.jit.interface): a warning and its source line, not ours
    lines = [line for line in done.stderr.strip().splitlines()
             if 'Warning: ' not in line and line.strip() != 'warnings.warn(']
    assert done.returncode == 2 and lines == [REFUSED] and done.stdout == ''


def test_every_demo_run_parses_to_train_py_s_own_values(tmp_path):
    """Each value the loop (and timm's helpers, and ``timm-ext validate``) reads is what train.py parses, the
    arguments the demo does not give included (``TRAIN_PY_DEFAULTS``, checked against train.py's parser)."""
    from timm_ext.launch.timm_scripts import script_args

    parser = require_timm_script(TRAIN_PY)
    for run in demo.demo_runs():
        argv = run.train_args(tmp_path / 'data', tmp_path / 'out', 6)
        ours, theirs = vars(parse_loop_args(argv)), vars(script_args(parser, argv))
        assert {k: theirs[k] for k in ours} == ours, run.name


def _refuse(url, timeout=30.0):
    raise OSError(f'no route to {url}')


EPOCHS = 2  # the warmup epoch and one after it


@pytest.mark.slow
def test_both_routes_give_the_same_numbers_epoch_by_epoch(tmp_path, monkeypatch, capsys, offline_scripts):
    """The quick demo (``vit`` with AdamW, ``full`` with the conv stem, CB and SAM) through the built-in loop and
    through train.py: every summary.csv number is the same (top-1, top-5, losses, lr), epoch by epoch. Two epochs:
    the warmup epoch and one of the cosine schedule, every update on the schedule's update-wise lr; more epochs
    would repeat the second (and CI's floor lane compares the whole quick demo's two routes again).

    The train.py route runs as a user runs it, ``timm-ext demo --quick`` with train.py from TIMM_EXT_TIMM_TRAIN: the
    command line's end to end (where everything is before training starts, the table, the summary, the files)."""
    from timm_ext.cli import main as cli_main
    from timm_ext.demo import run_demo
    from timm_ext.launch import from_run, timm_scripts

    require_timm_script(TRAIN_PY)
    monkeypatch.setattr(timm_scripts, 'fetch_url', _refuse)
    lines = []
    data = tmp_path / 'data'
    builtin = run_demo(output=tmp_path / 'builtin', quick=True, epochs=EPOCHS, data_root=data, progress=False,
                       log=lines.append)
    assert lines[0].startswith('timm-ext demo: timm\'s train.py for timm ') and 'no route to' in lines[0]
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(TRAIN_PY))  # after: it is cached where the loop's run looked
    out = tmp_path / 'train_py'
    capsys.readouterr()
    code = cli_main(['demo', '--quick', '--epochs', str(EPOCHS), '--output', str(out), '--data-root', str(data),
                     '--no-progress'])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    summary = json.loads((out / 'summary.json').read_text())
    train_py = summary['runs']
    assert [r.name for r in builtin.runs] == [r['name'] for r in train_py] == ['vit', 'full']
    for ours, theirs in zip(builtin.runs, train_py):
        folder = out / theirs['name']
        assert len(ours.eval_top1) == EPOCHS
        assert ours.eval_top1 == theirs['eval_top1'], ours.name  # the same validation images right, epoch by epoch
        assert (Path(ours.folder) / 'summary.csv').read_text() == (folder / 'summary.csv').read_text()
        # args.yaml: every value the loop records is train.py's (only the output folder differs)
        ours_args = yaml.safe_load((Path(ours.folder) / 'args.yaml').read_text())
        theirs_args = yaml.safe_load((folder / 'args.yaml').read_text())
        assert {k: v for k, v in ours_args.items() if k != 'output'} == \
            {k: theirs_args[k] for k in ours_args if k != 'output'}
        run = from_run.read_run(ours.folder)  # what `timm-ext validate --checkpoint RUN_FOLDER` reads
        assert run.arch == theirs_args['model'] and run.args['model_kwargs'] == theirs_args['model_kwargs']
        assert (Path(ours.folder) / 'model_best.pth.tar').is_file()

    # the command line: where everything is, before training starts
    digits = data / 'digits_16px_val0.2_seed0'
    printed = stdout.splitlines()
    assert printed[0] == f'data:    {digits} (1438 training, 359 validation images, 16 px)'
    assert printed[1] == f'output:  {out}'
    assert printed[2].startswith(f'runs:    2 train.py runs of {EPOCHS} epochs (vit, full), ')
    assert summary['data'] == str(digits) and summary['epochs'] == EPOCHS and summary['train_images'] == 1438
    table = [line for line in printed if line.startswith('| ViT')]
    assert len(table) == 2
    for run, row in zip(train_py, table):
        with open(out / run['name'] / 'summary.csv', newline='') as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == EPOCHS
        assert run['eval_top1'] == [float(r['eval_top1']) for r in rows]
        assert run['train_loss'] == [float(r['train_loss']) for r in rows]
        assert run['top1'] > 15.0, run  # 10 classes: chance is 10 %
        assert row.startswith(f'| {run["label"]} | {EPOCHS} | {run["top1"]:.1f} % |')
        assert (out / f'{run["name"]}.log').stat().st_size > 0
        assert (out / run['name'] / 'last.pth.tar').is_file()
        assert run['argv'][1] == str(TRAIN_PY) and run['argv'][-2:] == ['--device-modules', 'timm_ext']
        assert f'{run["name"]}: done in ' in stdout
    assert summary['contributions'] and f'- {summary["contributions"][0]}' in printed
    assert summary['contributions'][0].startswith('conv stem + CB + SAM together: ')
    assert (out / 'curves.png').read_bytes()[:4] == b'\x89PNG'
    assert sorted(p.name for p in out.iterdir()) == ['curves.png', 'full', 'full.log', 'summary.json', 'vit', 'vit.log']
    assert f'summary: {out / "summary.json"}' in printed
