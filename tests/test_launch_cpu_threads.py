"""timm_ext.launch.cpu_threads: how many CPU threads a train.py process of ``timm-ext train`` gets, and the child
really gets them (``OMP_NUM_THREADS`` in its environment, torch's thread count in the child)."""
import sys

import pytest
from _timm_train import TRAIN_PY
from conftest import require_timm_script

from timm_ext.launch.cpu_threads import THREAD_VARIABLES, cpu_thread_env, free_cores, free_cpu_threads


def threads_of(env):
    assert set(env) == set(THREAD_VARIABLES) and len(set(env.values())) == 1
    return int(env['OMP_NUM_THREADS'])


@pytest.mark.parametrize('cores, load, processes, torch_default, expected', [
    (2, 0.1, 1, 2, 2),    # idle: torch's default (measured 0.64x the time of 1 thread)
    (2, 1.2, 1, 2, 1),    # one core busy: 1 (2 threads measured 2.8x slower)
    (2, 0.0, 2, 2, 1),    # two processes on two cores: 1 each (2 each measured 18x slower)
    (2, 5.0, 1, 2, 1),    # overloaded: never below 1
    (16, 3.4, 1, 16, 13),  # a bigger idle-ish machine: the free cores
    (16, 0.0, 4, 16, 4),  # shared among the node's processes
    (64, 0.0, 1, 32, 32),  # never above torch's own default (its physical cores)
])
def test_free_cores_per_process(cores, load, processes, torch_default, expected):
    env, note = cpu_thread_env(None, {}, on_cpu=True, processes=processes, cores=cores, load=load,
                               torch_default=torch_default)
    assert threads_of(env) == expected
    per = f', {processes} processes' if processes > 1 else ''
    assert note == (f'{expected} CPU thread{"s" if expected > 1 else ""} per train.py process ({cores} cores, load '
                    f'average {load:.1f}{per}; docs/cli.md#cpu-threads): --threads N or OMP_NUM_THREADS=N to choose')


def test_your_own_loop_gets_the_same_count():
    """free_cpu_threads is the count ``timm-ext train`` gives, for a loop of your own (README's threads note)."""
    assert free_cpu_threads(1, cores=2, load=1.2, torch_default=2) == 1
    assert free_cpu_threads(4, cores=16, load=0.0, torch_default=16) == 4
    cores, load = free_cores()
    import torch

    assert 1 <= free_cpu_threads() <= torch.get_num_threads()  # this machine, now
    assert free_cpu_threads(1, cores, load) == threads_of(cpu_thread_env(None, {}, on_cpu=True, cores=cores,
                                                                         load=load)[0])


def test_the_user_chooses():
    assert threads_of(cpu_thread_env(3, {}, on_cpu=True, cores=2, load=0.0, torch_default=2)[0]) == 3
    assert cpu_thread_env(3, {}, on_cpu=False)[1] == ''  # --threads applies on CUDA too (CPU-side work)
    assert threads_of(cpu_thread_env(4, {'OMP_NUM_THREADS': '2'}, on_cpu=True)[0]) == 4  # the option wins
    for name in THREAD_VARIABLES:  # the user's environment, untouched and unannounced
        assert cpu_thread_env(None, {name: '2'}, on_cpu=True, cores=2, load=0.0, torch_default=2) == ({}, '')


def test_nothing_on_cuda():
    assert cpu_thread_env(None, {}, on_cpu=False, cores=2, load=0.0, torch_default=2) == ({}, '')


@pytest.mark.parametrize('bad', [0, -1])
def test_bad_thread_count(bad):
    with pytest.raises(ValueError) as e:
        cpu_thread_env(bad, {}, on_cpu=True)
    assert str(e.value) == f'--threads {bad}: give a positive number of CPU threads per train.py process'


def test_the_child_runs_with_the_thread_count(capfd):
    """run_child adds the command's variables to the child's environment: torch in the child reads them."""
    from timm_ext.cli._scripts import run_child

    code = run_child([sys.executable, '-c', 'import torch; print("threads", torch.get_num_threads())'],
                     env={'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'})
    assert code == 0 and 'threads 1' in capfd.readouterr().out


def test_train_command_carries_the_threads_and_the_note(monkeypatch):
    """build_train_command: --device cpu gets the variables and the note; --threads N sets N; --device cuda none."""
    from timm_ext.launch.build_command import build_train_command
    from timm_ext.launch.timm_scripts import find_script

    require_timm_script(TRAIN_PY)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.delenv('MKL_NUM_THREADS', raising=False)
    script = find_script('train.py', TRAIN_PY)
    argv = ['--model', 'resnet18', '--device']
    cpu = build_train_command(argv + ['cpu'], script=script, check=False)
    assert set(cpu.env) == set(THREAD_VARIABLES) and 'CPU thread' in cpu.env_note
    chosen = build_train_command(argv + ['cpu'], script=script, check=False, threads=3)
    assert chosen.env == {'OMP_NUM_THREADS': '3', 'MKL_NUM_THREADS': '3'}
    cuda = build_train_command(argv + ['cuda'], script=script, check=False)
    assert cuda.env == {} and cuda.env_note == ''


def test_the_command_line(capsys, monkeypatch, tmp_path):
    """`timm-ext train --threads 0` is one line before anything is built; a CPU run says how many threads, once."""
    from _cli import run_cli

    require_timm_script(TRAIN_PY)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.delenv('MKL_NUM_THREADS', raising=False)
    argv = ['train', '--timm-train', TRAIN_PY, '--no-check', '--dry-run', '--model', 'resnet18', '--device', 'cpu']
    code, out, err = run_cli(capsys, *argv, '--threads', '0')
    assert code == 2 and out == '' and err.splitlines()[-1] == (
        'timm-ext train: error: --threads 0: give a positive number of CPU threads per train.py process')
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and sum(line.startswith('timm-ext: note: ') and 'CPU thread' in line
                             for line in err.splitlines()) == 1
    code, out, err = run_cli(capsys, *argv, '--threads', '2')
    assert code == 0 and 'CPU thread' not in err
