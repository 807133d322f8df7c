"""timm_ext.launch as a package: the old module names still import (with timm's FutureWarning), and the
library reads timm's release table in one place."""
import importlib
import sys
from pathlib import Path

import pytest

import timm_ext.launch.arg_checks as arg_checks
import timm_ext.launch.commands as commands
import timm_ext.launch.find as find
import timm_ext.launch.patches as patches
import timm_ext.launch.preflight as preflight
import timm_ext.launch.release_table as release_table

PACKAGE = Path(__file__).resolve().parents[1] / 'timm_ext'


@pytest.mark.parametrize('old, new, names', [
    ('timm_ext.training', commands, ['build_train_command', 'check_train_command', 'child_env', 'TrainConfigError']),
    ('timm_ext.scripts', find, ['find_script', 'locate_script', 'load_script_parser', 'ScriptError']),
    ('timm_ext.preflight', preflight, ['script_args', 'check_train', 'split_folder']),
    ('timm_ext.script_patches', patches, ['patch_script', 'load_patch_index']),
])
def test_old_module_names_warn_and_give_the_same_objects(monkeypatch, old, new, names):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(FutureWarning, match=rf'^Importing from {old} is deprecated, please import via {new.__name__}$'):
        module = importlib.import_module(old)
    assert all(getattr(module, name) is getattr(new, name) for name in names)


def test_old_scripts_module_keeps_the_table_names():
    with pytest.warns(FutureWarning):
        module = importlib.reload(importlib.import_module('timm_ext.scripts'))
    assert module.release_table is release_table.release_table and module.tags_of is release_table.tags_of
    with pytest.warns(FutureWarning):
        old = importlib.reload(importlib.import_module('timm_ext.script_patches'))
    assert old.sha256_file is release_table.sha256_of


@pytest.mark.parametrize('name, new', [
    ('check_train_args', arg_checks.check_train_args), ('check_validate_args', arg_checks.check_validate_args),
    ('effective_args', preflight.script_args),
])
def test_moved_recipe_checks_warn(name, new):
    import timm_ext.recipes as recipes
    with pytest.warns(FutureWarning, match=rf'^timm_ext.recipes.{name} is deprecated, please use timm_ext.launch'):
        assert getattr(recipes, name) is new
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        recipes.no_such_name  # noqa: B018


def test_one_reader_of_the_release_table_and_one_sha256():
    readers = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob('*.py') if 'timm_scripts.tsv' in p.read_text()]
    assert readers == ['launch/release_table.py']
    hashers = [p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / 'launch').rglob('*.py')
               if 'hashlib' in p.read_text()]
    assert hashers == ['launch/release_table.py']


def test_sha256_of_a_file_and_of_bytes(tmp_path):
    (tmp_path / 'f').write_bytes(b'abc')
    digest = 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    assert release_table.sha256_of(tmp_path / 'f') == release_table.sha256_of(b'abc') == digest
    assert release_table.sha256_of(str(tmp_path / 'f')) == digest
