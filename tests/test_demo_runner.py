"""timm_ext.demo.runner, the one runner of train.py jobs (the demo's, the reproduction study's, the SAM-variant
table's): longest first, one thread per run, progress from summary.csv, every process stopped on failure or Ctrl-C."""
import os
import sys
import textwrap
from pathlib import Path

import pytest

from timm_ext.demo import runner


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


# --- real child processes ---------------------------------------------------------------------------------

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
        runner.run_jobs([sleeper, failing], dict(os.environ), lanes=2, poll_s=0.05, label='demo run')
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


def test_a_jobs_commands_run_in_order_in_its_lane_and_keep_going_collects_failures(tmp_path):
    write = ('import pathlib, sys; p = pathlib.Path(sys.argv[1]); '
             'p.write_text((p.read_text() if p.exists() else "") + sys.argv[2])')
    order = tmp_path / 'order'
    ok = runner.Job('ok', [sys.executable, '-c', write, str(order), 'train,'], tmp_path / 'ok.log',
                    tmp_path / 'ok' / 'summary.csv', 1, then=([sys.executable, '-c', write, str(order), 'measure'],))
    bad = runner.Job('bad', [sys.executable, '-c', 'raise SystemExit(3)'], tmp_path / 'bad.log',
                     tmp_path / 'bad' / 'summary.csv', 1, cost=9.0,
                     then=([sys.executable, '-c', write, str(tmp_path / 'never'), 'x'],))
    (tmp_path / 'ok.log').write_text('an earlier attempt\n')
    done = runner.run_jobs([ok, bad], dict(os.environ), lanes=1, poll_s=0.05, longest_first=False, keep_going=True)
    assert order.read_text() == 'train,measure'  # the second command ran after the first, in the same job
    assert not (tmp_path / 'never').exists()  # a failed command ends its job
    assert done.failed == {'bad': 3} and list(done.finished) == ['ok', 'bad']  # as given, not longest first
    assert (tmp_path / 'ok.log').read_text().startswith('an earlier attempt\n')  # logs are appended to


def test_a_failed_command_after_train_py_is_named_as_such(tmp_path):
    job = runner.Job('run', [sys.executable, '-c', 'pass'], tmp_path / 'run.log', tmp_path / 'run' / 'summary.csv',
                     1, then=([sys.executable, '-c', 'raise SystemExit(2)'],))
    with pytest.raises(runner.JobFailed, match=r"^a command after train.py failed for the study run 'run' \(exit "):
        runner.run_jobs([job], dict(os.environ), lanes=1, poll_s=0.05, label='study run')


def test_thread_env_sets_the_torch_threads():
    env = runner.thread_env(3)
    assert env['OMP_NUM_THREADS'] == env['MKL_NUM_THREADS'] == '3'
