"""timm_ext_cli (the package's __init__): the ``timm-ext`` entry point answers --help, --version, models and
recipes list without torch, with the same text as the full command line, and every other command goes to
timm_ext.cli. What it answers with, timm_ext_cli.commands, has its own tests: test_timm_ext_cli_commands.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import run_cli

from timm_ext.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
NO_TORCH = '''
import sys, timm_ext_cli
code = timm_ext_cli.main(sys.argv[1:])
heavy = sorted(m for m in ('torch', 'timm', 'timm_ext', 'numpy') if m in sys.modules)
print('IMPORTED', heavy, file=sys.stderr)
sys.exit(code)
'''


def _fast(*argv):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, '-c', NO_TORCH, *argv], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize('argv', [['--help'], ['--version'], ['models'], ['models', 'vit_*_cb', '--json'],
                                  ['recipes', 'list'], ['recipes', 'list', '--names', '--wide']])
def test_answers_without_importing_torch(argv):
    proc = _fast(*argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == 'IMPORTED []' and proc.stdout.strip()


def test_help_is_the_full_command_lines(capsys):
    assert _fast('--help').stdout == build_parser().format_help()


def test_models_and_recipes_list_print_what_the_full_command_prints(capsys):
    for argv in (['models'], ['models', 'alternet_50*', '--json'], ['recipes', 'list', '--wide'],
                 ['recipes', 'list', '--names']):
        code, full, _ = run_cli(capsys, *argv)  # timm_ext.cli.main: the path `python -m timm_ext` ... took
        assert code == 0 and _fast(*argv).stdout == full, argv


def test_models_from_the_table():
    rows = json.loads(_fast('models', 'vit_small_cb', '--json').stdout)
    assert [r['name'] for r in rows] == ['vit_small_cb'] and rows[0]['input_size'] == [3, 224, 224]
    assert rows[0]['params'] == 22050664 and rows[0]['family'] == 'Context Broadcasting'
    proc = _fast('models', 'no_such_*')
    assert proc.returncode == 2 and proc.stderr.splitlines()[0] == (
        "timm-ext models: error: no timm-ext model matches 'no_such_*'; `timm-ext models` lists all 41")


@pytest.mark.slow
def test_everything_else_goes_to_the_full_command_line(capsys):
    code, _, err = run_cli(capsys, 'models', '--no-such-flag')  # argparse's own error, from timm_ext.cli
    assert code == 2 and 'unrecognized arguments' in err
    proc = _fast('recipes', 'show', 'examples/sam_minimal')
    assert proc.returncode == 0 and 'opt: samadamw' in proc.stdout
    assert "'timm_ext'" in proc.stderr.splitlines()[-1]  # it needed the package


@pytest.mark.slow
def test_the_later_release_note_once_per_cache(capsys, monkeypatch, tmp_path):
    from conftest import require_timm_script

    from timm_ext.launch.timm_scripts import first_time_in_cache

    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    assert first_time_in_cache('a note') and not first_time_in_cache('a note') and first_time_in_cache('another')
    train_py = REPO.parent / 'shared' / 'timm-train' / 'v1.0.28' / 'train.py'
    require_timm_script(train_py)
    from test_launch_command_checks import image_folder

    data = image_folder(tmp_path / 'data', {'train': 1, 'validation': 1})
    notes = []
    for _ in range(2):  # a dry run: the note is the script's, whatever the command (no train.py process to wait for)
        code, _, err = run_cli(capsys, 'train', '--timm-train', train_py, '--data-dir', data, '--num-classes', '2',
                               '-b', '2', '--device', 'cpu', '--dry-run')
        assert code == 0, err
        notes.append([line for line in err.splitlines() if 'runs on later timm releases' in line])
    import timm
    if timm.__version__ == '1.0.28':
        pytest.skip('timm 1.0.28 runs its own train.py: no note')
    assert len(notes[0]) == 1 and notes[1] == []
