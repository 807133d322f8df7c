"""tests/_timm_train.py: the suite reads ``$TIMM_EXT_TIMM_TRAIN`` in one place and as timm-ext does (the folder of
timm's scripts, or its train.py). Three test files once read it as the script file alone, so with the folder (README's
``TIMM_EXT_TIMM_TRAIN=DIR``) their 52 tests skipped while the rest of the suite ran."""
import re
from pathlib import Path

import pytest
from _timm_train import DEFAULT, scripts_dir

from timm_ext.launch.timm_scripts import locate_script

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize('form', ['folder', 'train.py'])
def test_both_forms_name_the_folder_timm_ext_takes_the_scripts_from(tmp_path, monkeypatch, form):
    folder = tmp_path / 'scripts'
    folder.mkdir()
    for name in ('train.py', 'validate.py'):
        (folder / name).write_text('# not a release of timm\n')
    value = str(folder if form == 'folder' else folder / 'train.py')
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', value)
    assert scripts_dir(value) == folder
    for name in ('train.py', 'validate.py'):
        assert locate_script(name, allow_unverified=True).path == folder / name


def test_a_missing_script_or_nothing_given():
    assert scripts_dir('/nowhere/v1.0.28/train.py') == Path('/nowhere/v1.0.28')  # a skip names /nowhere/.../train.py
    assert scripts_dir('/nowhere/v1.0.28') == Path('/nowhere/v1.0.28')
    assert scripts_dir('') == DEFAULT and DEFAULT.parts[-3:] == ('shared', 'timm-train', 'v1.0.28')


def test_no_other_test_module_reads_the_variable():
    """Setting it (monkeypatch.setenv, a child's env) is fine; reading it (over lines too) is _timm_train's alone."""
    reads = re.compile(r"environ(\.get\(|\[)\s*'TIMM_EXT_TIMM_TRAIN'|'TIMM_EXT_TIMM_TRAIN' (not )?in os\.environ")
    found = [f'{path.name}:{text.count(chr(10), 0, match.start()) + 1}' for path in sorted(TESTS.glob('*.py'))
             if path.name != '_timm_train.py' for text in [path.read_text()] for match in reads.finditer(text)]
    assert found == []
