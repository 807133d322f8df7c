"""``timm-ext demo``: the README's main job, end to end through timm's real train.py on real digits.

Also the demo's pieces: its runs and their exact train.py arguments (:mod:`timm_ext.demo`), the
report (:mod:`timm_ext._demo_report`) and the parallel runner with its progress text
(:mod:`timm_ext._demo_runner`). The end-to-end test runs ``timm-ext demo --quick --epochs 1`` with
train.py from TIMM_EXT_TIMM_TRAIN (default ../shared/timm-train/v1.0.28) and skips with the reason
when it is absent.
"""
import csv
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import timm
from conftest import require_timm_script

from timm_ext import _demo_runner as runner
from timm_ext import demo
from timm_ext._demo_report import NOISE_POINTS, RunResult, contributions, format_table
from timm_ext.cli import main

pytest.importorskip('sklearn', reason='the demo data needs scikit-learn (pip install "timm-ext[demo]")')

REPO = Path(__file__).resolve().parents[1]
_ENV = os.environ.get('TIMM_EXT_TIMM_TRAIN')
_SCRIPTS = Path(_ENV) if _ENV else REPO.parent / 'shared' / 'timm-train' / 'v1.0.28'
TRAIN_PY = _SCRIPTS if _SCRIPTS.suffix == '.py' else _SCRIPTS / 'train.py'


# --- the runs and their train.py arguments ---------------------------------------------------------------

def _opt(args, name):
    """The values of ``name`` in an argv: everything up to the next ``--option``."""
    i = args.index(name) + 1
    values = []
    while i < len(args) and not args[i].startswith('--'):
        values.append(args[i])
        i += 1
    return values


def test_quick_is_the_plain_vit_against_all_three_pieces():
    assert [(r.name, r.model, r.opt, r.pieces) for r in demo.demo_runs(quick=True)] == [
        ('vit', 'vit_tiny_patch16_224', 'adamw', ()),
        ('full', 'vit_tiny_cb', 'samadamw', ('conv stem', 'CB', 'SAM')),
    ]


def test_ablation_runs_have_exact_train_py_arguments(tmp_path):
    runs = {r.name: r for r in demo.demo_runs(rho=0.1)}
    assert list(runs) == ['vit', 'full', 'no_stem', 'no_cb', 'no_sam']
    shared = ['img_size=16', 'patch_size=4', 'embed_dim=128', 'depth=4', 'num_heads=4']
    expected = {  # model, --model-kwargs, opt, --opt-kwargs
        'vit': ('vit_tiny_patch16_224', shared, 'adamw', None),
        'full': ('vit_tiny_cb', shared + ['stem=conv'], 'samadamw', ['rho=0.1']),
        'no_stem': ('vit_tiny_cb', shared, 'samadamw', ['rho=0.1']),
        'no_cb': ('vit_tiny_convstem', shared, 'samadamw', ['rho=0.1']),
        'no_sam': ('vit_tiny_cb', shared + ['stem=conv'], 'adamw', None),
    }
    for name, (model, kwargs, opt, opt_kwargs) in expected.items():
        args = runs[name].train_args(tmp_path / 'data', tmp_path / 'out', 7)
        assert _opt(args, '--model') == [model] and _opt(args, '--opt') == [opt], name
        assert _opt(args, '--model-kwargs') == kwargs, name
        assert (_opt(args, '--opt-kwargs') if '--opt-kwargs' in args else None) == opt_kwargs, name
        assert _opt(args, '--experiment') == [name] and _opt(args, '--epochs') == ['7']
        assert _opt(args, '--data-dir') == [str(tmp_path / 'data')]
        assert _opt(args, '--output') == [str(tmp_path / 'out')]
        # everything else is the shared TRAIN_ARGS: the same data, schedule, batch, augmentation and seed
        assert args[args.index('--num-classes'):args.index('--num-classes') + len(demo.TRAIN_ARGS)] == \
            list(demo.TRAIN_ARGS)
    assert _opt(list(demo.TRAIN_ARGS), '--input-size') == ['3', '16', '16']
    assert _opt(list(demo.TRAIN_ARGS), '--workers') == ['0']  # no loader processes competing for the cores


def _model(run):
    return timm.create_model(run.model, num_classes=10, **dict(demo.MODEL_KWARGS, **run.model_kwargs))


def test_each_ablation_run_differs_from_full_in_its_piece_only():
    runs = {r.name: r for r in demo.demo_runs()}
    models = {name: _model(run) for name, run in runs.items()}

    def shapes(m, stem):
        return {k: v.shape for k, v in m.state_dict().items() if k.startswith('patch_embed.') == stem}

    # CB has no parameters: the conv-stem ViT with and without CB have the same state_dict
    assert shapes(models['full'], True) == shapes(models['no_cb'], True) == shapes(models['no_sam'], True)
    assert shapes(models['full'], False) == shapes(models['no_cb'], False) == shapes(models['vit'], False)
    # the patchify runs share timm's PatchEmbed; the conv stem replaces it and nothing else
    assert shapes(models['no_stem'], True) == shapes(models['vit'], True) != shapes(models['full'], True)
    assert shapes(models['no_stem'], False) == shapes(models['full'], False)
    assert type(models['full'].patch_embed).__name__ == 'ConvStemPatchEmbed'
    assert type(models['vit'].patch_embed).__name__ == type(models['no_stem'].patch_embed).__name__ == 'PatchEmbed'
    assert runs['full'].cost == runs['no_cb'].cost > runs['no_stem'].cost > runs['no_sam'].cost > runs['vit'].cost


# --- the report -------------------------------------------------------------------------------------------

def _result(name, top1, loss=1.25, pieces=(), wall=10.0):
    return RunResult(
        name=name, label=name.upper(), pieces=list(pieces), epochs=[1, 2], train_loss=[2.3, loss],
        eval_loss=[2.2, loss - 0.1], eval_top1=[20.0, top1], wall_s=wall, train_images=100, folder=f'/x/{name}')


def test_table_has_every_run_and_the_measured_values():
    table = format_table([_result('a', 55.5), _result('b', 40.0, 1.5)])
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[2] == '| A | 2 | 55.5 % | 55.5 % | 1.250 | 1.150 | 10 s | 20 |'
    assert lines[3].startswith('| B | 2 | 40.0 % | 40.0 % | 1.500 |')


def test_contributions_name_each_piece_and_call_small_gaps_noise():
    runs = [_result('vit', 50.0), _result('full', 90.0, pieces=('conv stem', 'CB', 'SAM'), wall=30),
            _result('no_stem', 60.0, pieces=('CB', 'SAM')), _result('no_cb', 91.0, pieces=('conv stem', 'SAM')),
            _result('no_sam', 95.0, pieces=('conv stem', 'CB'))]
    lines = contributions(runs, val_images=400)
    assert lines == [
        'conv stem + CB + SAM together: +40.0 points (FULL 90.0 % vs VIT 50.0 %, 160 of 400 validation images), '
        'helps here; wall time 30 s vs 10 s',
        'conv stem: +30.0 points (FULL 90.0 % vs NO_STEM 60.0 %, 120 of 400 validation images), helps here; '
        'wall time 30 s vs 10 s',
        f'CB: -1.0 points (FULL 90.0 % vs NO_CB 91.0 %, 4 of 400 validation images), within the noise of one seed '
        f'(under {NOISE_POINTS:g} points); wall time 30 s vs 10 s',
        'SAM: -5.0 points (FULL 90.0 % vs NO_SAM 95.0 %, 20 of 400 validation images), costs accuracy here; '
        'wall time 30 s vs 10 s',
    ]
    # the quick demo has only the first comparison
    assert contributions(runs[:2], 400) == lines[:1]


def test_plot_is_written(tmp_path):
    pytest.importorskip('matplotlib')
    path = demo.plot_curves([_result('a', 55.5)], tmp_path / 'curves.png')
    assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


# --- scheduling, parallelism, progress and ETA -----------------------------------------------------------

def _job(name, epochs=2, cost=1.0, tmp=Path('/x')):
    return runner.Job(name, ['true'], tmp / f'{name}.log', tmp / name / 'summary.csv', epochs, cost)


def test_schedule_is_longest_first_and_stable():
    jobs = [_job('vit', 10), _job('full', 10, 2.4), _job('no_stem', 10, 2.0), _job('no_cb', 10, 2.4),
            _job('no_sam', 10, 1.2)]
    assert [j.name for j in runner.schedule(jobs)] == ['full', 'no_cb', 'no_stem', 'no_sam', 'vit']


@pytest.mark.parametrize('runs, cores, jobs, expected', [
    (2, 2, None, (2, 1)),   # the quick demo on 2 cores: both runs at once, one thread each
    (5, 2, None, (2, 1)),   # the full demo on 2 cores
    (2, 8, None, (2, 1)),   # more cores than runs: still one thread (the top-1 must not depend on the cores)
    (5, 8, None, (5, 1)),
    (5, 2, 1, (1, 1)),      # --jobs 1: one run at a time, one thread (the same top-1 as --jobs 2)
    (2, 2, 9, (2, 1)),      # never more processes than runs
])
def test_parallelism_fits_the_cores(runs, cores, jobs, expected):
    assert runner.plan_parallelism(runs, cores, jobs) == expected


def _progress(lanes=2):
    return runner.Progress([_job('a', 4, 2.0), _job('b', 4, 1.0), _job('c', 4, 1.0)], lanes)


def test_eta_lays_the_remaining_work_out_on_the_lanes():
    progress = _progress()
    progress.started.update(a=0.0, b=0.0)
    assert progress.eta(12.0) is None  # no epoch finished yet: no pace, no ETA
    # b: 5 s of start-up, then 10 s an epoch (1 unit); a (2 units an epoch) ends its first epoch at 25 s
    progress.epoch_done('b', 1, 15.0)
    progress.epoch_done('b', 2, 25.0)
    progress.epoch_done('a', 1, 25.0)
    assert progress.pace() == pytest.approx((10.0, 5.0))
    # at 30 s: a has 6 units left (60 s) less the 5 s into its epoch: 55 s; b 2 units less 5 s: 15 s;
    # then c (start-up + 4 units: 45 s) goes on b's core: 60 s
    assert progress.eta(30.0) == pytest.approx(60.0)
    progress.finished['b'] = 45.0
    progress.started['c'] = 45.0
    assert progress.eta(45.0) == pytest.approx(max(60 - 20.0, 5 + 40.0))


def test_eta_before_a_second_epoch_counts_start_up_in_the_pace():
    progress = _progress(lanes=1)
    progress.started.update(a=0.0)
    progress.epoch_done('a', 1, 30.0)  # 2 units in 30 s, start-up included: 15 s a unit, no separate start-up
    assert progress.pace() == pytest.approx((15.0, 0.0))
    # one core: a's 6 units (90 s) less the 10 s into its epoch, then b and c (4 units each) in a row
    assert progress.eta(40.0) == pytest.approx(80.0 + 60.0 + 60.0)


def test_progress_text_names_the_eta_and_the_running_runs():
    progress = runner.Progress([_job('vit', 4), _job('full', 4, 2.0)], lanes=2)
    assert progress.total_epochs == 8
    progress.started.update(full=100.0, vit=100.0)
    assert progress.postfix(105.0) == 'ETA --:--, training: full 0/4, vit 0/4'
    progress.epoch_done('vit', 1, 110.0)
    progress.epoch_done('vit', 2, 115.0)
    progress.finished['vit'] = 120.0  # not realistic (2 of 4 epochs) but shows that finished runs leave the list
    assert progress.done_epochs == 2
    # vit: 5 s a unit after 5 s of start-up; full: start-up + 8 units = 45 s from its start, 30 s left at 115 s
    assert progress.postfix(115.0) == 'ETA 0:30, training: full 0/4'
    assert runner.format_eta(3725.4) == 'ETA 62:05' and runner.format_eta(None) == 'ETA --:--'


# --- the runner: real child processes ---------------------------------------------------------------------

def _script_job(tmp_path, name, body, epochs=2, cost=1.0):
    """A job whose process runs ``body`` (Python) with ``summary`` and ``folder`` defined; no train.py."""
    folder = tmp_path / name
    code = f'import os, sys, time\nfolder = {str(folder)!r}\nsummary = os.path.join(folder, "summary.csv")\n' \
           + textwrap.dedent(body)
    return runner.Job(name, [sys.executable, '-c', code], tmp_path / f'{name}.log', folder / 'summary.csv',
                      epochs, cost)


_EPOCHS = '''
os.makedirs(folder, exist_ok=True)
with open(summary, 'w') as f:
    f.write('epoch,eval_top1\\n')
for e in range(2):
    time.sleep(0.3)
    with open(summary, 'a') as f:
        f.write(f'{e},{10 * e}\\n')
print('bye', os.environ['MARK'])
'''


def test_runner_runs_every_job_and_reports_progress(tmp_path):
    jobs = [_script_job(tmp_path, 'short', _EPOCHS), _script_job(tmp_path, 'long', _EPOCHS, cost=3.0),
            _script_job(tmp_path, 'mid', _EPOCHS, cost=2.0)]
    seen = []
    done = runner.run_jobs(jobs, dict(os.environ, MARK='env-ok'), lanes=2,
                           on_update=lambda p, now: seen.append((dict(p.done), list(p.started), list(p.finished))),
                           poll_s=0.05)
    assert set(done.finished) == {'short', 'long', 'mid'} and all(done.wall_s(n) > 0 for n in done.finished)
    if hasattr(os, 'wait4'):  # each run's own CPU time: a Python start-up at least, far less than its sleeps
        assert all(0 < done.cpu_s[n] < done.wall_s(n) for n in done.finished)
    final_done, started, finished = seen[-1]
    assert final_done == {'long': 2, 'mid': 2, 'short': 2}
    assert started == ['long', 'mid', 'short']  # longest first
    assert len(set(finished)) == 3
    # two lanes: the third run starts only when one of the first two has finished
    assert any(s == ['long', 'mid'] for _, s, _ in seen)
    assert all(len(s) - len(f) <= 2 for _, s, f in seen)
    # progress was reported epoch by epoch, and each run's output went to its own log
    assert any(d['long'] == 1 for d, _, _ in seen)
    for job in jobs:
        assert job.log.read_text().strip() == 'bye env-ok'


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return Path(f'/proc/{pid}/stat').read_text().split()[2] != 'Z'
    except OSError:
        return True


_SLEEPER = '''
import subprocess
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, 'pids'), 'w') as f:
    f.write(f'{os.getpid()} {child.pid}')
time.sleep(60)
'''


def _all_gone(pids):
    """True once none of ``pids`` runs; a signalled grandchild may take a moment to die, so wait up to 10 s."""
    import time
    for _ in range(200):
        if not any(_pid_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _wait_for(path):
    import time
    for _ in range(400):
        if path.exists() and len(path.read_text().split()) == 2:
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f'{path} never appeared')


@pytest.mark.skipif(not hasattr(os, 'killpg'), reason='process groups are POSIX')
def test_a_failed_run_stops_the_others_and_shows_its_log_tail(tmp_path):
    sleeper = _script_job(tmp_path, 'sleeper', _SLEEPER, cost=5.0)
    failing = _script_job(tmp_path, 'broken', '''
        import os
        pids = os.path.join(os.path.dirname(folder), 'sleeper', 'pids')
        while not (os.path.exists(pids) and len(open(pids).read().split()) == 2):
            time.sleep(0.05)
        print('first line'); print('RuntimeError: the model exploded'); sys.exit(3)
    ''')
    with pytest.raises(runner.JobFailed) as info:
        runner.run_jobs([sleeper, failing], dict(os.environ), lanes=2, poll_s=0.05)
    message = str(info.value)
    assert message.startswith(f"train.py failed for the demo run 'broken' (exit code 3); its log is {failing.log}:")
    assert message.endswith('first line\nRuntimeError: the model exploded')
    # the other run and the process it started (its process group) were stopped
    assert _all_gone(_wait_for(tmp_path / 'sleeper' / 'pids'))


@pytest.mark.skipif(not hasattr(os, 'killpg'), reason='process groups are POSIX')
def test_ctrl_c_stops_every_run(tmp_path):
    jobs = [_script_job(tmp_path, 'a', _SLEEPER), _script_job(tmp_path, 'b', _SLEEPER)]

    def interrupt_when_both_run(progress, now):
        if all((tmp_path / n / 'pids').exists() for n in 'ab'):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run_jobs(jobs, dict(os.environ), lanes=2, on_update=interrupt_when_both_run, poll_s=0.05, tick_s=0.05)
    for name in 'ab':
        assert _all_gone(_wait_for(tmp_path / name / 'pids'))


# --- the command line -------------------------------------------------------------------------------------

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
    (['--jobs', '0'], '--jobs must be a positive integer, got 0'),
    (['--rho', '0'], '--rho must be > 0, got 0.0'),
    (['--model', 'vit_tiny_cb'], '--model was removed: the demo now compares fixed runs (plain ViT, conv stem, CB, '
                                 'SAM; docs/demo.md); train your own models with `timm-ext train --model NAME`'),
    (['--baseline', 'x'], '--baseline was removed: the demo now compares fixed runs (plain ViT, conv stem, CB, SAM; '
                          'docs/demo.md); train your own models with `timm-ext train --model NAME`'),
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
    code = main(['demo', '--quick', '--epochs', '1', '--output', str(out), '--data-root', str(tmp_path / 'data'),
                 '--no-progress'])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    data = tmp_path / 'data' / 'digits_16px_val0.2_seed0'
    lines = stdout.splitlines()
    # where everything is, before training starts
    assert lines[0] == f'data:    {data} (1438 training, 359 validation images, 16 px)'
    assert lines[1] == f'output:  {out}'
    assert lines[2].startswith('runs:    2 train.py runs of 1 epoch (vit, full), ')
    summary = json.loads((out / 'summary.json').read_text())
    assert [r['name'] for r in summary['runs']] == ['vit', 'full']
    assert summary['data'] == str(data) and summary['epochs'] == 1 and summary['train_images'] == 1438
    table = [line for line in lines if line.startswith('| ViT')]
    assert len(table) == 2
    for run, row in zip(summary['runs'], table):
        with open(out / run['name'] / 'summary.csv', newline='') as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 1
        assert run['eval_top1'] == [float(r['eval_top1']) for r in rows]
        assert run['train_loss'] == [float(r['train_loss']) for r in rows]
        assert run['top1'] > 15.0, run  # 10 classes: chance is 10 %
        assert row.startswith(f'| {run["label"]} | 1 | {run["top1"]:.1f} % |')
        assert (out / f'{run["name"]}.log').stat().st_size > 0
        assert (out / run['name'] / 'last.pth.tar').is_file()
        assert run['argv'][1] == str(TRAIN_PY) and run['argv'][-2:] == ['--device-modules', 'timm_ext']
        assert f'{run["name"]}: done in ' in stdout
    assert summary['contributions'] and f'- {summary["contributions"][0]}' in lines
    assert summary['contributions'][0].startswith('conv stem + CB + SAM together: ')
    assert (out / 'curves.png').read_bytes()[:4] == b'\x89PNG'
    assert sorted(p.name for p in out.iterdir()) == ['curves.png', 'full', 'full.log', 'summary.json', 'vit', 'vit.log']
    assert f'summary: {out / "summary.json"}' in lines


def test_a_failed_run_exits_1_with_its_log_tail(tmp_path, capsys, monkeypatch):
    require_timm_script(TRAIN_PY)

    def fail(jobs, env, lanes, on_update):
        assert [j.name for j in jobs] == ['vit', 'full'] and lanes >= 1
        threads = runner.plan_parallelism(2, runner.available_cores())[1]
        assert env['OMP_NUM_THREADS'] == env['MKL_NUM_THREADS'] == str(threads)
        raise runner.JobFailed(f"train.py failed for the demo run 'full' (exit code 3); its log is {jobs[1].log}:\n"
                               f"Traceback (most recent call last):\nValueError: boom")

    monkeypatch.setattr(runner, 'run_jobs', fail)
    out = tmp_path / 'o'
    code = main(['demo', '--quick', '--timm-train', str(TRAIN_PY), '--output', str(out), '--no-progress',
                 '--data-root', str(tmp_path / 'data')])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.splitlines() == [
        f"timm-ext demo: error: train.py failed for the demo run 'full' (exit code 3); its log is {out / 'full.log'}:",
        'timm-ext demo: error: Traceback (most recent call last):', 'timm-ext demo: error: ValueError: boom']
    assert captured.out.splitlines()[1] == f'output:  {out}'  # it said where the logs are before training
