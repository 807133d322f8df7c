"""The ``timm-ext`` command's fast half: the command table and what answers without torch.

``import timm_ext`` registers the models with timm, which imports torch and torchvision (3-4 s of CPU), and
any ``timm_ext.*`` module imports the package first. So this module lives beside the package, not in it, and
uses the standard library only (it imports nothing of ``timm_ext``): the subcommands' one-line help
(``COMMANDS``), the top-level parser, the folders that ship with the package, and ``timm-ext models`` /
``timm-ext recipes list``, answered from the package's files (``timm_ext/_data/models.tsv``, measured by
:mod:`timm_ext.catalog` and checked against it by the tests; the recipe index). They are defined here once
and used by both the entry point (:func:`timm_ext_cli.main`) and :mod:`timm_ext.cli`; this is the one module
above the package that the package may import.
"""
import argparse
import csv
import fnmatch
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

__all__ = ['COMMANDS', 'DESCRIPTION', 'LIST_COLUMNS', 'MODELS_TABLE', 'MODEL_FIELDS', 'format_recipe_table',
           'models_table', 'package_dir', 'packaged_dir', 'print_models', 'print_recipe_list', 'recipe_listing',
           'recipe_names', 'top_level_parser', 'version']

DESCRIPTION = 'timm-ext: Context Broadcasting, Scaled-ReLU conv stems, AlterNet and SAM for timm.'
# the subcommands in the order `timm-ext --help` lists them, with their one-line help
COMMANDS: Dict[str, str] = {
    'train': 'run timm\'s train.py (of the installed timm) with timm-ext loaded',
    'validate': 'run timm\'s validate.py (of the installed timm) with timm-ext imported first',
    'recipes': 'list, show and check train.py recipes',
    'models': 'list timm-ext\'s models: family, parameters, GMACs, paper',
    'convert': 'convert an official AlterNet checkpoint to timm-ext\'s layout (safetensors)',
    'patch': 'patch timm train.py v1.0.15 ... v1.0.22 so that SAM runs in it',
    'demo': 'train a plain ViT against the ViT with conv stem + CB + SAM on real digits through train.py',
    'export': 'write a train.py checkpoint as a Hugging Face Hub folder (safetensors + config + card)',
    'push': 'upload a folder made by `timm-ext export` to the Hugging Face Hub',
    'analyze': 'measure attention entropy, Hessian spectra, loss landscapes, ... of a model',
    'doctor': 'versions, devices and timm\'s scripts, for a bug report; exit 1 when training cannot start',
}
MODELS_TABLE = '_data/models.tsv'  # in the package: every registered model, measured by timm_ext.catalog
MODEL_FIELDS = ('name', 'family', 'params', 'gmacs', 'input_size', 'num_classes', 'paper', 'cite', 'arxiv')
_FOLDERS = ('recipes', 'patches')


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version('timm-ext')
    except PackageNotFoundError:  # a bare source checkout: the package's own file says it
        text = (package_dir() / 'version.py').read_text()
        return text.split('__version__', 1)[1].split('=', 1)[1].split('\n', 1)[0].strip().strip('\'"')


def top_level_parser() -> argparse.ArgumentParser:
    """``timm-ext``'s parser with its subcommands; :func:`timm_ext.cli.build_parser` adds their options."""
    parser = argparse.ArgumentParser(prog='timm-ext', description=DESCRIPTION)
    parser.add_argument('--version', action='version', version=f'timm-ext {version()}')
    return parser


def package_dir() -> Path:
    """The ``timm_ext`` package's folder, found without importing it."""
    spec = importlib.util.find_spec('timm_ext')
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError('timm_ext is not installed: pip install timm-ext')
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def packaged_dir(name: str) -> Path:
    """The shipped folder ``name`` ('recipes' or 'patches'): inside an installed wheel (``timm_ext/_recipes``) or,
    in a source checkout, beside the package (``pyproject.toml``'s ``package-dir``)."""
    if name not in _FOLDERS:
        raise ValueError(f'Unknown packaged folder {name!r}; one of: {", ".join(_FOLDERS)}')
    package = package_dir()
    inside = package / f'_{name}'
    if inside.is_dir():
        return inside
    checkout = package.parent
    if (checkout / name).is_dir() and (checkout / 'pyproject.toml').is_file():
        return checkout / name
    raise FileNotFoundError(
        f'timm-ext\'s {name}/ folder is missing: looked in {inside} (installed wheel) and in '
        f'{checkout / name} (source checkout); reinstall timm-ext')


# --- models ---------------------------------------------------------------------------------------

def models_table() -> List[Dict[str, object]]:
    """The rows of ``timm_ext/_data/models.tsv``, typed as :class:`timm_ext.catalog.ModelInfo`'s fields."""
    with open(package_dir() / MODELS_TABLE, newline='') as f:
        rows = list(csv.DictReader(f, delimiter='\t'))
    return [dict(row, params=int(row['params']), gmacs=float(row['gmacs']), num_classes=int(row['num_classes']),
                 input_size=[int(v) for v in row['input_size'].split('x')]) for row in rows]


def print_models(pattern: Optional[str] = None, as_json: bool = False, rows: Optional[List[Dict]] = None) -> int:
    """``timm-ext models``: the table (or JSON) of the models matching ``pattern``; 2 when none does."""
    rows = models_table() if rows is None else rows
    shown = [r for r in rows if not pattern or fnmatch.fnmatchcase(str(r['name']), pattern)]
    if not shown:
        print(f'timm-ext models: error: no timm-ext model matches {pattern!r}; `timm-ext models` lists all '
              f'{len(rows)}', file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps([dict(r, gmacs=round(float(r['gmacs']), 4)) for r in shown], indent=2))
        return 0
    lines = [('model', 'family', 'params (M)', 'GMACs', 'input', 'paper')]
    lines += [(str(r['name']), str(r['family']), f'{int(r["params"]) / 1e6:.2f}', f'{float(r["gmacs"]):.2f}',
               'x'.join(map(str, list(r['input_size'])[1:])), str(r['cite'])) for r in shown]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print('  '.join(cell.rjust(w) if i in (2, 3) else cell.ljust(w)
                        for i, (cell, w) in enumerate(zip(line, widths))).rstrip())
    return 0


# --- recipes list ---------------------------------------------------------------------------------

# `timm-ext recipes list`: (index column, title)
LIST_COLUMNS = (('recipe', 'recipe'), ('table', 'table'), ('row', 'row'), ('model', 'model'),
                ('global_batch', 'batch'), ('expected_top1', 'top1'))
# how the list narrows to a width, least needed first: (column, narrowest useful width, dropped below it);
# the recipe name (what `timm-ext train -c` takes) narrows last, batch and top-1 never
_LIST_FIT = (('row', 16, True), ('table', 8, True), ('model', 16, False), ('recipe', 24, False))
_ELIDED_IN_MIDDLE = ('recipe', 'model')  # their ends differ (variant, dataset, pretrained tag)


def format_recipe_table(rows: Sequence[Dict[str, str]], width: Optional[int] = None) -> str:
    """The aligned ``LIST_COLUMNS`` of ``rows`` (index rows; blank cells for recipes no paper row covers).

    With ``width`` (a terminal's), lines are at most that wide as long as it is at least 55: the paper's
    row text, then its table, then the model and the recipe name are shortened with ``...``; the row and
    table columns are left out when less than 16 / 8 characters of them would fit.
    """
    cells = [[title for _, title in LIST_COLUMNS]] + [[row.get(key, '') for key, _ in LIST_COLUMNS] for row in rows]
    widths = {key: max(len(line[i]) for line in cells) for i, (key, _) in enumerate(LIST_COLUMNS)}
    for key, narrowest, droppable in _LIST_FIT if width is not None else ():
        excess = sum(widths.values()) + 2 * (len(widths) - 1) - width
        if excess <= 0:
            break
        if widths[key] - excess >= narrowest or not droppable:
            widths[key] = max(widths[key] - excess, min(narrowest, widths[key]))
        else:
            del widths[key]
    shown = [(i, key) for i, (key, _) in enumerate(LIST_COLUMNS) if key in widths]
    return '\n'.join('  '.join(_shorten(line[i], widths[key], key in _ELIDED_IN_MIDDLE).ljust(widths[key])
                               for i, key in shown).rstrip() for line in cells)


def _shorten(text: str, width: int, middle: bool) -> str:
    if len(text) <= width:
        return text
    if not middle:
        return text[:width - 3] + '...'
    head = (width - 3 + 1) // 2
    return text[:head] + '...' + text[len(text) - (width - 3 - head):]


def recipe_names(root: Optional[Path] = None) -> List[str]:
    """Names of every recipe under ``root`` (default: the packaged ones), sorted (``examples/sam_minimal``, ...)."""
    root = packaged_dir('recipes') if root is None else root
    return sorted(p.relative_to(root).with_suffix('').as_posix() for p in root.rglob('*.yaml'))


def recipe_listing() -> List[Dict[str, str]]:
    """The rows of the committed recipe index (``recipes/index.csv``, names without .yaml) and, with blank
    columns, the recipes no paper row covers."""
    with open(packaged_dir('recipes') / 'index.csv', newline='') as f:
        index = {row['recipe'][:-len('.yaml')]: row for row in csv.DictReader(f)}
    return [dict(index.get(name, {}), recipe=name) for name in recipe_names()]


def print_recipe_list(names_only: bool = False, wide: bool = False) -> int:
    """``timm-ext recipes list``: the table, fitted to a terminal unless ``wide``; or only the names."""
    if names_only:
        print('\n'.join(recipe_names()))
        return 0
    rows = recipe_listing()
    width = None if wide or not sys.stdout.isatty() else shutil.get_terminal_size().columns
    table = format_recipe_table(rows, width)
    print(table)
    if width is not None and table != format_recipe_table(rows):
        print(f'(fitted to {width} columns: `timm-ext recipes list --wide` shows every column whole)', file=sys.stderr)
    return 0
