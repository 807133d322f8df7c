"""timm_ext_cli.commands: the command table and the fast commands' helpers that both the entry point and the
package use, with the standard library only (importing it imports neither torch nor timm-ext)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from timm_ext_cli import commands

REPO = Path(__file__).resolve().parents[1]


def test_importing_it_imports_nothing_heavy():
    code = ('import sys, timm_ext_cli.commands\n'
            'print(sorted(m for m in ("torch", "timm", "timm_ext", "numpy") if m in sys.modules))')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0 and proc.stdout.strip() == '[]', proc.stderr


def test_the_folders_are_found_without_the_package():
    assert commands.package_dir() == REPO / 'timm_ext'
    assert commands.packaged_dir('recipes') == REPO / 'recipes' and commands.packaged_dir('patches') == REPO / 'patches'
    with pytest.raises(ValueError, match='one of: recipes, patches'):
        commands.packaged_dir('data')


def test_the_models_table_is_typed():
    rows = commands.models_table()
    assert rows and set(rows[0]) == set(commands.MODEL_FIELDS)
    assert all(isinstance(r['params'], int) and isinstance(r['gmacs'], float) and len(r['input_size']) == 3
               for r in rows)


def test_the_parser_names_the_version_and_every_command_has_a_line():
    parser = commands.top_level_parser()
    assert parser.prog == 'timm-ext' and parser.description == commands.DESCRIPTION
    assert commands.version() and all(text and '\n' not in text for text in commands.COMMANDS.values())


def test_the_recipe_listing_has_every_recipe_once():
    names = commands.recipe_names()
    assert names == sorted(names) and 'examples/sam_minimal' in names
    assert [row['recipe'] for row in commands.recipe_listing()] == names
