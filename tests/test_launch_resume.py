"""timm_ext.launch.resume: the run's folder and the command that resumes it (the --resume refusals:
tests/test_launch_command_checks.py)."""
import argparse
import os
import time

from timm_ext.launch.resume import resume_command, run_folder


def _args(**kw):
    return argparse.Namespace(**dict(dict(output='', experiment=''), **kw))


def test_run_folder_is_output_and_experiment(tmp_path):
    assert run_folder(_args(output=str(tmp_path), experiment='run')) == tmp_path / 'run'
    assert run_folder(_args(experiment='run')) == __import__('pathlib').Path('output/train/run')  # train.py's default


def test_run_folder_train_py_named_is_the_newest_with_a_checkpoint(tmp_path):
    started = time.time() - 5
    for name, age in (('20261127-000000-old', 3600), ('20261127-010000-new', 0), ('20261127-020000-empty', 0)):
        (tmp_path / name).mkdir()
        if name.endswith('empty'):
            continue
        (tmp_path / name / 'last.pth.tar').write_bytes(b'x')
        os.utime(tmp_path / name / 'last.pth.tar', (time.time() - age, time.time() - age))
    assert run_folder(_args(output=str(tmp_path)), started) == tmp_path / '20261127-010000-new'
    assert run_folder(_args(output=str(tmp_path / 'absent')), started) is None


def test_resume_command_replaces_an_earlier_resume_and_keeps_the_folder(tmp_path):
    argv = ['train', '-c', 'my recipe.yaml', '--resume', 'old.pth.tar', '--epochs', '3']
    assert resume_command(argv, tmp_path / 'run', experiment_given=True) == (
        f"timm-ext train -c 'my recipe.yaml' --epochs 3 --resume {tmp_path / 'run' / 'last.pth.tar'}")
    assert resume_command(['train', '--resume=old'], tmp_path / '2026-x', experiment_given=False) == (
        f"timm-ext train --resume {tmp_path / '2026-x' / 'last.pth.tar'} --experiment 2026-x")
