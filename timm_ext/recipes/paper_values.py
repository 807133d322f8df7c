"""The paper recipes traced to their papers: the paper-values tables and a recipe's differences from its row.

The paper recipes (``recipes/<paper>/<dataset>/<name>.yaml``) are traced to their papers by the
paper-values tables (``timm_ext/_data/paper_values/<paper>.yaml``): for each recipe the table and
row, the model, the global batch, the expected top-1, and every setting the paper states, as
train.py argument names with the paper's value and where the paper says it. A recipe that differs
from its paper does so only where the row lists a ``deviations`` entry with the reason
(:func:`check_against_paper`).
"""
import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml

from timm_ext.arg_types import is_positive_int
from timm_ext.papers import PAPERS
from timm_ext.recipes import lookup
from timm_ext.recipes.checks import actions_by_dest, kind_of
from timm_ext.recipes.lookup import SUFFIX, RecipeError, close_recipe_names, load_recipe

__all__ = [
    'DATASETS', 'PaperRow', 'check_against_paper', 'find_paper_row', 'load_paper_values', 'packaged_row',
    'paper_values_dir',
]

DATASETS = ('imagenet', 'cifar10', 'cifar100')
_ROW_FIELDS = ('table', 'row', 'model', 'global_batch', 'expected_top1', 'values')
_PAPER_VALUES = Path(__file__).resolve().parents[1] / '_data' / 'paper_values'


@dataclass(frozen=True)
class PaperRow:
    """One recipe's row of a paper-values table: where the paper reports it and the values it states.

    ``values`` maps a train.py argument (``opt``, or ``model_kwargs.proj_drop_rate`` for one entry of a
    mapping argument) to ``{'value': ..., 'source': 'Table 12'}``; ``deviations`` maps the arguments the
    recipe sets differently to ``{'recipe': ..., 'reason': ...}``; ``not_expressible`` lists, as text, the
    paper's settings that have no train.py argument (pad-4 crop, per-core SAM) and the recipe's choices
    where the paper states nothing.
    """
    recipe: str
    paper: str
    title: str
    table: str
    row: str
    model: str
    global_batch: int
    expected_top1: Optional[float]
    values: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    deviations: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    not_expressible: Tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The recipe's name, as `timm-ext train -c` takes it (its path under recipes/ without .yaml)."""
        return self.recipe[:-len(SUFFIX)]

    @property
    def dataset(self) -> str:
        return self.recipe.split('/')[1]

    @property
    def cite(self) -> str:
        return f'{self.paper} {self.table} {self.row!r}'


def paper_values_dir() -> Path:
    """The folder of paper-values tables (package data: one ``<paper>.yaml`` per paper)."""
    return _PAPER_VALUES


def load_paper_values(folder: Optional[Union[str, Path]] = None) -> Dict[str, PaperRow]:
    """Every paper-values row, by recipe path under recipes/ (``vit-sam/imagenet/vit_s16_sam.yaml``)."""
    folder = Path(folder) if folder is not None else paper_values_dir()
    rows: Dict[str, PaperRow] = {}
    for path in sorted(folder.glob(f'*{SUFFIX}')):
        for row in _read_paper_values(path):
            if row.recipe in rows:
                raise RecipeError(f'{path}: recipe {row.recipe!r} already has a row in {rows[row.recipe].paper}.yaml')
            rows[row.recipe] = row
    return rows


def find_paper_row(name: Union[str, Path], rows: Optional[Dict[str, PaperRow]] = None) -> PaperRow:
    """The paper row of a packaged recipe: its name (``vit-sam/imagenet/vit_s16_sam``), with or without
    ``.yaml``, or the path of the packaged file."""
    rows = load_paper_values() if rows is None else rows
    key = _recipe_key(name)
    if key in rows:
        return rows[key]
    names = [r.name for r in rows.values()]
    close = close_recipe_names(key[:-len(SUFFIX)], names)
    hint = f'; did you mean {", ".join(close)}?' if close else ''
    raise RecipeError(f'no paper row for {str(name)!r}: not one of the {len(rows)} paper recipes '
                      f'(`timm-ext recipes list`){hint}')


def packaged_row(path: Union[str, Path], rows: Optional[Dict[str, PaperRow]] = None) -> Optional[PaperRow]:
    """The paper row of ``path`` when it is a packaged paper recipe, else None."""
    try:
        rel = Path(path).resolve().relative_to(lookup.recipes_dir().resolve()).as_posix()
    except ValueError:
        return None
    rows = load_paper_values() if rows is None else rows
    return rows.get(rel)


def check_against_paper(
        config: Dict[str, Any], row: PaperRow, parser: argparse.ArgumentParser, explicit: bool = False,
) -> List[str]:
    """Where a recipe differs from its paper row: each paper value must be the recipe's, except where the row
    documents a deviation (then the recipe must have the deviation's value). ``explicit``: a value left to
    train.py's default is a problem even when the default happens to agree (packaged recipes)."""
    actions = actions_by_dest(parser)
    problems = []
    if config.get('model') != row.model:
        problems.append(f'model is {config.get("model")!r}; {row.cite} trains {row.model!r}')
    for key, entry in row.values.items():
        top, _, sub = key.partition('.')
        action = actions.get(top)
        if action is None or (sub and not isinstance(action.default, dict)):
            problems.append(f'paper value {key!r} of {row.recipe} is not a train.py argument: fix {row.paper}.yaml')
            continue
        present, got = _recipe_value(config, top, sub, action)
        deviation = row.deviations.get(key)
        expected = deviation['recipe'] if deviation else entry['value']
        if not (_same(got, expected) and (present or not explicit)):
            problems.append(_paper_difference(key, row, entry, deviation, present, got, action))
    return problems


def _recipe_value(config: Dict[str, Any], top: str, sub: str, action: argparse.Action) -> Tuple[bool, Any]:
    """(whether the recipe sets it, the value train.py uses): ``sub`` is an entry of the mapping ``top``."""
    if sub:
        mapping = config.get(top) or {}
        return sub in mapping, mapping.get(sub)
    return top in config, config.get(top, action.default)


def _paper_difference(
        key: str, row: PaperRow, entry: Dict[str, Any], deviation: Optional[Dict[str, Any]], present: bool,
        got: Any, action: argparse.Action,
) -> str:
    expected = deviation['recipe'] if deviation else entry['value']
    paper = f'{row.table} has {entry["value"]!r} ({entry["source"]})'
    if deviation:
        paper += f', and the recipe\'s documented deviation is {expected!r} ({deviation["reason"]})'
    if not present:
        default = 'not set' if '.' in key else f'not set (train.py\'s default: {action.default!r})'
        return f'{key} is {default}; {paper}: write `{_yaml_item(key, expected)}`'
    return f'{key} is {got!r}; {paper}' if deviation else f'{key} is {got!r} but {paper}'


def _recipe_key(name: Union[str, Path]) -> str:
    path = Path(name)
    if path.is_file():
        try:
            return path.resolve().relative_to(lookup.recipes_dir().resolve()).as_posix()
        except ValueError:
            pass
    key = str(name).replace(os.sep, '/')
    return key if key.endswith(SUFFIX) else f'{key}{SUFFIX}'


def _read_paper_values(path: Path) -> List[PaperRow]:
    """The rows of one paper-values file; a malformed file is a one-line RecipeError naming the entry."""
    data = load_recipe(path)
    paper = data.get('paper')
    if paper != path.stem:
        raise RecipeError(f'{path}: `paper` is {paper!r}; it must be the file\'s name {path.stem!r}')
    if paper not in PAPERS:
        raise RecipeError(f'{path}: paper {paper!r} is not in timm_ext.papers.PAPERS ({", ".join(PAPERS)})')
    recipes = data.get('recipes')
    if not isinstance(recipes, dict) or not recipes:
        raise RecipeError(f'{path}: `recipes` must be a non-empty mapping of recipe path -> row')
    title = PAPERS[paper].title  # the one source of paper metadata
    return [_paper_row(path, paper, title, key, row) for key, row in recipes.items()]


def _paper_row(path: Path, paper: str, title: str, key: Any, row: Any) -> PaperRow:
    where = f'{path.name}: {key!r}'
    parts = str(key).split('/')
    if len(parts) != 3 or parts[0] != paper or parts[1] not in DATASETS or not parts[2].endswith(SUFFIX):
        raise RecipeError(f'{where}: a recipe path must be {paper}/<dataset>/<name>.yaml with dataset one of '
                          f'{", ".join(DATASETS)}')
    if not isinstance(row, dict):
        raise RecipeError(f'{where}: the row must be a mapping, not {kind_of(row)}')
    missing = [f for f in _ROW_FIELDS if f not in row]
    unknown = [f for f in row if f not in _ROW_FIELDS + ('deviations', 'not_expressible')]
    if missing or unknown:
        raise RecipeError(f'{where}: ' + '; '.join(
            ([f'missing {", ".join(missing)}'] if missing else []) + ([f'unknown {", ".join(unknown)}'] if unknown
                                                                      else [])))
    top1 = row['expected_top1']
    if not is_positive_int(row['global_batch']):  # True is no batch size
        raise RecipeError(f'{where}: global_batch {row["global_batch"]!r} must be a positive integer')
    if top1 is not None and (isinstance(top1, bool) or not isinstance(top1, (int, float)) or not 0 < top1 <= 100):
        raise RecipeError(f'{where}: expected_top1 {top1!r} must be a percentage or null (given only in a figure)')
    values = _entries(where, 'values', row['values'], ('value', 'source'))
    deviations = _entries(where, 'deviations', row.get('deviations') or {}, ('recipe', 'reason'))
    for name, dev in deviations.items():
        if name not in values:
            raise RecipeError(f'{where}: deviation {name!r} has no paper value under `values`')
        if _same(dev['recipe'], values[name]['value']):
            raise RecipeError(f'{where}: deviation {name!r} gives the paper\'s own value {dev["recipe"]!r}; remove it')
    notes = row.get('not_expressible') or []
    if not isinstance(notes, list) or not all(isinstance(n, str) and n for n in notes):
        raise RecipeError(f'{where}: not_expressible must be a list of texts')
    return PaperRow(
        recipe=str(key), paper=paper, title=title, table=str(row['table']), row=str(row['row']),
        model=str(row['model']), global_batch=row['global_batch'], expected_top1=top1,
        values=values, deviations=deviations, not_expressible=tuple(notes))


def _entries(where: str, what: str, entries: Any, fields: Tuple[str, str]) -> Dict[str, Dict[str, Any]]:
    """``values`` / ``deviations``: argument -> {fields[0]: any, fields[1]: non-empty text}."""
    if not isinstance(entries, dict):
        raise RecipeError(f'{where}: `{what}` must be a mapping, not {kind_of(entries)}')
    for name, entry in entries.items():
        if not isinstance(entry, dict) or set(entry) != set(fields) or not (
                isinstance(entry[fields[1]], str) and entry[fields[1]]):
            raise RecipeError(f'{where}: {what} {name!r} must be {{{fields[0]}: ..., {fields[1]}: "text"}}, '
                              f'not {entry!r}')
    return {str(k): v for k, v in entries.items()}


def _normal(value: Any) -> Any:
    """A value as train.py would hold it after parsing: numbers (and numeric text) as floats, tuples as lists."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    a, b = _normal(a), _normal(b)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _yaml_item(key: str, value: Any) -> str:
    top, _, sub = key.partition('.')
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    text = text[:-len('...')].strip() if text.endswith('...') else text
    return f'{top}: {{{sub}: {text}}}' if sub else f'{top}: {text}'
