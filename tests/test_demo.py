"""``timm-ext demo``: the README's main job, end to end through timm's real train.py on real digits.

The entry point (:func:`timm_ext.demo.run_demo`) through the command line: where everything is, the
errors, a failed run. Its pieces have their own tests: the runs (``test_demo_runs.py``), the report
(``test_demo_report.py``), the runner and its progress (``test_demo_runner.py``, ``test_demo_progress.py``)
and the train.py runs as data (``test_demo_train_runs.py``). End to end, ``timm-ext demo --quick`` with train.py
from TIMM_EXT_TIMM_TRAIN (default ../shared/timm-train/v1.0.28) runs in
``test_demo_builtin_loop.py::test_both_routes_give_the_same_numbers_epoch_by_epoch``, beside the built-in loop's run
of the same demo, and skips with the reason when train.py is absent.
"""
from pathlib import Path

import pytest
from _timm_train import TRAIN_PY
from conftest import require_timm_script

from timm_ext.cli import main
from timm_ext.demo import runner

pytest.importorskip('sklearn', reason='the demo data needs scikit-learn (pip install "timm-ext[demo]")')

REPO = Path(__file__).resolve().parents[1]


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


def test_a_failed_run_exits_1_with_its_log_tail(tmp_path, capsys, monkeypatch):
    require_timm_script(TRAIN_PY)

    def fail(jobs, env, lanes, on_update, **kwargs):
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
