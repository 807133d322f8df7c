"""timm_ext.demo.routes: the demo trains through train.py where it can be had, else through its built-in loop,
said in one line; a train.py that is given but wrong stays an error. The runner is replaced: nothing trains."""
import sys
from pathlib import Path

import pytest
from _timm_train import TRAIN_PY
from conftest import require_timm_script

from timm_ext.cli import main
from timm_ext.demo import runner
from timm_ext.demo.runs import demo_runs

pytest.importorskip('sklearn', reason='the demo data needs scikit-learn (pip install "timm-ext[demo]")')

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def started(monkeypatch):
    """The jobs the demo hands the runner (which then fails, so that nothing trains)."""
    seen = []

    def record(jobs, env, lanes, on_update, **kwargs):
        seen.extend(jobs)
        raise runner.JobFailed('stopped by the test')

    monkeypatch.setattr(runner, 'run_jobs', record)
    return seen


def _demo(tmp_path, *extra):
    return main(['demo', '--quick', '--output', str(tmp_path / 'o'), '--data-root', str(tmp_path / 'data'),
                 '--no-progress', *extra])


def test_without_train_py_the_demo_says_so_in_one_line_and_uses_its_loop(tmp_path, capsys, offline_scripts, started):
    import timm

    from timm_ext.launch.timm_scripts import locate_script

    where = locate_script('train.py')
    assert _demo(tmp_path) == 1  # the replaced runner's failure
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f'timm-ext demo: timm\'s train.py for timm {timm.__version__} is not on this machine and could not be '
        f'downloaded from {where.url} (the test went to the network: {where.url}): running the demo\'s runs in its '
        f'built-in loop of timm\'s own parts (to use train.py, give --timm-train PATH or $TIMM_EXT_TIMM_TRAIN, or '
        f'save it as {where.path})')
    assert out[1].startswith('data:    ') and out[3].startswith('runs:    2 built-in loop runs of 4 epochs (vit, full)')
    data = tmp_path / 'data' / 'digits_16px_val0.2_seed0'
    runs = {r.name: r for r in demo_runs(quick=True)}
    assert [j.name for j in started] == ['vit', 'full']
    for job in started:
        assert job.argv == [sys.executable, '-m', 'timm_ext.demo.builtin_loop',
                            *runs[job.name].train_args(data, tmp_path / 'o', 4)]
        assert job.summary == tmp_path / 'o' / job.name / 'summary.csv'


def test_with_train_py_given_the_demo_uses_it(tmp_path, capsys, offline_scripts, started):
    require_timm_script(TRAIN_PY)
    assert _demo(tmp_path, '--timm-train', str(TRAIN_PY)) == 1
    out = capsys.readouterr().out
    assert 'built-in loop' not in out and out.splitlines()[2].startswith('runs:    2 train.py runs of 4 epochs')
    assert all(str(TRAIN_PY) in j.argv for j in started)  # (after timm_ext.cli._child on a timm < 1.0.29)
    assert all(j.argv[-2:] == ['--device-modules', 'timm_ext'] for j in started)


def test_a_given_train_py_that_is_wrong_stays_an_error(tmp_path, capsys, offline_scripts, started):
    wrong = tmp_path / 'train.py'
    wrong.write_text('print("not timm\'s")\n')
    assert _demo(tmp_path, '--timm-train', str(wrong)) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and 'is not the train.py of any timm release' in captured.err
    assert 'built-in loop' not in captured.out + captured.err
    assert started == [] and not (tmp_path / 'o').exists()
