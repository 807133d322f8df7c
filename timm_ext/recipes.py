"""Packaged train.py recipes: find them by name, and check a recipe and a command line before train.py runs.

A recipe is a YAML file for timm's own ``train.py -c``: its keys are train.py's argument names
(``dest``: ``opt_kwargs``, not ``--opt-kwargs``), and train.py feeds them to its parser with
``set_defaults``, which silently accepts any key. The checks here catch what would otherwise cost a
run (each problem is one line that says the fix):

* a key train.py does not know (``rho:`` at the top level instead of under ``opt_kwargs``);
* a value of the wrong kind for its argument (``device_modules: timm_ext`` instead of a list,
  ``epochs: 1.5``, a value outside the argument's choices);
* an ``opt`` name with an underscore before a SAM name (``sam_adamw``): timm's optimizer factory
  keeps only the text after the last underscore and builds plain AdamW;
* ``bce_loss: true`` with label smoothing 0 and no mixup / cutmix: train.py then builds softmax
  cross-entropy and ignores ``bce_loss`` (it builds its BCE loss only in the mixup and smoothing branches);
and, for a full command line (recipe + arguments, :func:`check_train_args`):
* ``--device cuda`` (train.py's default) where CUDA is not available;
* an ImageFolder whose class count differs from the number of classes the model will have
  (train.py keeps the model's default, usually 1000, when ``--num-classes`` is not given);
* a baseline ``--opt adamw`` over a SAM recipe whose ``opt_kwargs`` still carry SAM's ``rho``;
and for validate.py (:func:`check_validate_args`): a ``--checkpoint`` that does not exist, no CUDA.

The paper recipes (``recipes/<paper>/<dataset>/<name>.yaml``) are traced to their papers by the
paper-values tables (``timm_ext/_data/paper_values/<paper>.yaml``): for each recipe the table and
row, the model, the global batch, the expected top-1, and every setting the paper states, as
train.py argument names with the paper's value and where the paper says it. A recipe that differs
from its paper does so only where the row lists a ``deviations`` entry with the reason
(:func:`check_against_paper`). ``recipes/index.csv`` is generated from those tables
(:func:`build_index`, ``timm-ext recipes index --write``).

Recipes ship in the repository's ``recipes/`` folder (inside the wheel as ``timm_ext/_recipes``) and
are named by their path without ``.yaml``: ``examples/sam_minimal``, ``vit-sam/imagenet/vit_b16_sam``.
"""
import argparse
import contextlib
import csv
import difflib
import io
import math
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import yaml

from timm_ext._resources import packaged_dir

__all__ = [
    'INDEX_COLUMNS', 'INDEX_MARKERS', 'PaperRow', 'RecipeError', 'build_index', 'check_against_paper', 'check_recipe',
    'check_train_args', 'check_validate_args', 'effective_args', 'find_paper_row', 'find_recipe', 'format_index',
    'format_index_markdown', 'format_recipe_table', 'LIST_COLUMNS',
    'is_sam_optimizer', 'list_recipes', 'load_paper_values', 'load_recipe', 'packaged_row', 'paper_values_dir',
    'recipes_dir', 'write_index',
]

_SUFFIX = '.yaml'
# SAM's own optimizer arguments (opt_kwargs); none of them is a train.py argument
_SAM_ONLY_KEYS = ('rho', 'adaptive', 'eta', 'base')
# what a non-SAM optimizer rejects when a SAM recipe's opt_kwargs are kept
_SAM_OPT_KWARGS = _SAM_ONLY_KEYS + ('clip_grad', 'clip_mode')
_IMAGE_FOLDER_DATASETS = ('', 'folder', 'image_folder')
INDEX_COLUMNS = ('recipe', 'paper', 'dataset', 'table', 'row', 'model', 'global_batch', 'expected_top1')
DATASETS = ('imagenet', 'cifar10', 'cifar100')
_ROW_FIELDS = ('table', 'row', 'model', 'global_batch', 'expected_top1', 'values')
_PAPER_VALUES = Path(__file__).resolve().parent / '_data' / 'paper_values'
_YAML_LOADER = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)  # libyaml's safe loader when PyYAML has it: ~10x faster


class RecipeError(ValueError):
    """A recipe cannot be found or read (one line)."""


def recipes_dir() -> Path:
    """The folder of packaged recipes (``recipes/`` of the repository, ``timm_ext/_recipes`` in a wheel)."""
    return packaged_dir('recipes')


def list_recipes() -> List[str]:
    """Names of every packaged recipe, sorted (``examples/sam_minimal``, ...)."""
    root = recipes_dir()
    return sorted(p.relative_to(root).with_suffix('').as_posix() for p in root.rglob(f'*{_SUFFIX}'))


def close_recipe_names(name: str, names: List[str], n: int = 3) -> List[str]:
    """Recipes whose file name is close to ``name``'s, those in its folder first.

    Whole names are not compared: with a hundred recipes sharing ``<paper>/<dataset>/`` prefixes, any
    name in a known folder would look close to every recipe there.
    """
    folder, _, base = name.rpartition('/')
    by_base: Dict[str, List[str]] = {}
    for candidate in names:
        by_base.setdefault(candidate.rpartition('/')[2], []).append(candidate)
    bases = [b for b in sorted(by_base) if len(base) >= 3 and b.startswith(base)]  # a name cut short
    bases += [b for b in difflib.get_close_matches(base, list(by_base), n=n, cutoff=0.6) if b not in bases]
    close = [candidate for b in bases for candidate in by_base[b]]
    close.sort(key=lambda candidate: candidate.rpartition('/')[0] != folder)  # stable: closeness within
    return close[:n]


def find_recipe(name_or_path: Union[str, Path]) -> Path:
    """A recipe file: an existing path, or a packaged recipe's name (with or without ``.yaml``)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = str(name_or_path).replace(os.sep, '/')
    name = name[:-len(_SUFFIX)] if name.endswith(_SUFFIX) else name
    names = list_recipes()
    if name in names:
        return recipes_dir() / f'{name}{_SUFFIX}'
    close = close_recipe_names(name, names)
    hint = f'; did you mean {", ".join(close)}?' if close else ''
    raise RecipeError(f'unknown recipe {str(name_or_path)!r}: not a file and not one of the {len(names)} packaged '
                      f'recipes (`timm-ext recipes list`){hint}')


def load_recipe(path: Union[str, Path]) -> Dict[str, Any]:
    """The recipe as a dict (a YAML mapping; an empty file is an empty recipe)."""
    try:
        config = yaml.load(Path(path).read_text(), Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        raise RecipeError(f'recipe {path} is not valid YAML: {" ".join(str(e).split())}') from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise RecipeError(f'recipe {path} must be a mapping of train.py arguments, not a {type(config).__name__}')
    return config


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
        return self.recipe[:-len(_SUFFIX)]

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
    for path in sorted(folder.glob(f'*{_SUFFIX}')):
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
    close = close_recipe_names(key[:-len(_SUFFIX)], names)
    hint = f'; did you mean {", ".join(close)}?' if close else ''
    raise RecipeError(f'no paper row for {str(name)!r}: not one of the {len(rows)} paper recipes '
                      f'(`timm-ext recipes list`){hint}')


def packaged_row(path: Union[str, Path], rows: Optional[Dict[str, PaperRow]] = None) -> Optional[PaperRow]:
    """The paper row of ``path`` when it is a packaged paper recipe, else None."""
    try:
        rel = Path(path).resolve().relative_to(recipes_dir().resolve()).as_posix()
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
    actions = _actions_by_dest(parser)
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


def build_index(rows: Optional[Dict[str, PaperRow]] = None) -> List[Dict[str, str]]:
    """The rows of ``recipes/index.csv``, one per paper recipe, sorted by recipe path."""
    rows = load_paper_values() if rows is None else rows
    return [{
        'recipe': r.recipe, 'paper': r.paper, 'dataset': r.dataset, 'table': r.table, 'row': r.row,
        'model': r.model, 'global_batch': str(r.global_batch),
        'expected_top1': '' if r.expected_top1 is None else str(float(r.expected_top1)),
    } for r in sorted(rows.values(), key=lambda r: r.recipe)]


def format_index(index: Sequence[Dict[str, str]]) -> str:
    """The index as CSV text (``INDEX_COLUMNS``, ``\\n`` line ends)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=INDEX_COLUMNS, lineterminator='\n')
    writer.writeheader()
    writer.writerows(index)
    return out.getvalue()


def format_index_markdown(index: Sequence[Dict[str, str]]) -> str:
    """The index as a Markdown table (recipes/README.md holds it between the ``INDEX_MARKERS``)."""
    lines = ['| recipe | paper | table | row | model | global batch | top-1 |', '|---|---|---|---|---|---:|---:|']
    for r in index:
        cells = [f'[`{r["recipe"][:-len(_SUFFIX)]}`]({r["recipe"]})', r['paper'], r['table'], r['row'],
                 f'`{r["model"]}`', r['global_batch'], r['expected_top1'] or '(figure)']
        lines.append('| ' + ' | '.join(c.replace('|', '\\|') for c in cells) + ' |')
    return '\n'.join(lines) + '\n'


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


INDEX_MARKERS = ('<!-- index: generated by `timm-ext recipes index --write` -->', '<!-- index: end -->')


def write_index(path: Optional[Union[str, Path]] = None) -> Path:
    """Regenerate ``recipes/index.csv`` (or ``path``) from the paper-values tables, and the table between the
    ``INDEX_MARKERS`` of the README.md beside it."""
    path = Path(path) if path is not None else recipes_dir() / 'index.csv'
    index = build_index()
    path.write_text(format_index(index))
    readme = path.parent / 'README.md'
    if readme.is_file():
        text = readme.read_text()
        start, end = (text.find(m) for m in INDEX_MARKERS)
        if 0 <= start < end:
            text = text[:start + len(INDEX_MARKERS[0])] + '\n' + format_index_markdown(index) + text[end:]
            readme.write_text(text)
    return path


def _recipe_key(name: Union[str, Path]) -> str:
    path = Path(name)
    if path.is_file():
        try:
            return path.resolve().relative_to(recipes_dir().resolve()).as_posix()
        except ValueError:
            pass
    key = str(name).replace(os.sep, '/')
    return key if key.endswith(_SUFFIX) else f'{key}{_SUFFIX}'


def _read_paper_values(path: Path) -> List[PaperRow]:
    """The rows of one paper-values file; a malformed file is a one-line RecipeError naming the entry."""
    data = load_recipe(path)
    paper = data.get('paper')
    if paper != path.stem:
        raise RecipeError(f'{path}: `paper` is {paper!r}; it must be the file\'s name {path.stem!r}')
    recipes = data.get('recipes')
    if not isinstance(recipes, dict) or not recipes:
        raise RecipeError(f'{path}: `recipes` must be a non-empty mapping of recipe path -> row')
    return [_paper_row(path, paper, str(data.get('title', '')), key, row) for key, row in recipes.items()]


def _paper_row(path: Path, paper: str, title: str, key: Any, row: Any) -> PaperRow:
    where = f'{path.name}: {key!r}'
    parts = str(key).split('/')
    if len(parts) != 3 or parts[0] != paper or parts[1] not in DATASETS or not parts[2].endswith(_SUFFIX):
        raise RecipeError(f'{where}: a recipe path must be {paper}/<dataset>/<name>.yaml with dataset one of '
                          f'{", ".join(DATASETS)}')
    if not isinstance(row, dict):
        raise RecipeError(f'{where}: the row must be a mapping, not {_kind(row)}')
    missing = [f for f in _ROW_FIELDS if f not in row]
    unknown = [f for f in row if f not in _ROW_FIELDS + ('deviations', 'not_expressible')]
    if missing or unknown:
        raise RecipeError(f'{where}: ' + '; '.join(
            ([f'missing {", ".join(missing)}'] if missing else []) + ([f'unknown {", ".join(unknown)}'] if unknown
                                                                      else [])))
    top1 = row['expected_top1']
    if not (isinstance(row['global_batch'], int) and row['global_batch'] > 0):
        raise RecipeError(f'{where}: global_batch {row["global_batch"]!r} must be a positive int')
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
        raise RecipeError(f'{where}: `{what}` must be a mapping, not {_kind(entries)}')
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


def is_sam_optimizer(opt: str) -> bool:
    """True when timm's factory (with timm_ext loaded) builds a SAM-family optimizer for ``opt`` (``samadamw``,
    ``gsamadamw``, ``looksamadamw``, ``lookahead_sam``)."""
    from timm.optim import get_optimizer_info, list_optimizers

    import timm_ext.optim  # noqa: F401  (registers SAM with timm's factory)
    from timm_ext.optim.sam_factory import create_gsam, create_looksam, create_sam

    name = str(opt).lower().split('_')[-1]
    if name not in list_optimizers():
        return False
    opt_class = get_optimizer_info(name).opt_class
    return isinstance(opt_class, partial) and opt_class.func in (create_sam, create_gsam, create_looksam)


def check_recipe(config: Dict[str, Any], parser: argparse.ArgumentParser) -> List[str]:
    """Problems of a recipe against train.py's ``parser``: unknown keys, values of the wrong kind, a SAM name
    that timm's factory would not build. Each problem is one line that says the fix."""
    actions = _actions_by_dest(parser)
    problems = []
    for key, value in config.items():
        action = actions.get(key)
        if action is None:
            problems.append(_unknown_key(key, actions))
        elif key == 'device_modules' and isinstance(value, str):
            problems.append(f'device_modules is the string {value!r}: train.py would import each of its characters; '
                            f'write a list: `device_modules: [{value}]`')
        else:
            problem = _value_problem(action, value)
            if problem:
                problems.append(f'recipe key {key!r}: {problem}')
    opt = config.get('opt')
    if isinstance(opt, str):
        problems += _opt_problems(opt)
    return problems + _loss_problems(lambda k: config.get(k, actions[k].default if k in actions else None))


def check_train_args(
        parser: argparse.ArgumentParser,
        argv: Sequence[str],
        config: Optional[Dict[str, Any]] = None,
        cuda_available: Optional[bool] = None,
) -> List[str]:
    """Problems of a whole train.py command line (``config``, the recipe, under the arguments ``argv``).

    Arguments train.py itself would reject are left to train.py (it prints its own usage error).
    """
    args = effective_args(parser, argv, config)
    if args is None:
        return []
    problems = []
    if isinstance(args.opt, str):
        problems += _opt_problems(args.opt)
    problems += _device_problems(args.device, cuda_available)
    problems += _loss_problems(lambda k: getattr(args, k, None))
    problems += _class_count_problems(args)
    recipe_opt = (config or {}).get('opt')
    if isinstance(recipe_opt, str) and is_sam_optimizer(recipe_opt) and not is_sam_optimizer(args.opt):
        leftover = [k for k in _SAM_OPT_KWARGS if k in (args.opt_kwargs or {})]
        if leftover:
            problems.append(
                f'--opt {args.opt} replaces the recipe\'s SAM optimizer {recipe_opt!r}, but opt_kwargs still carry '
                f'SAM\'s {", ".join(leftover)}, which {args.opt} does not take: give the baseline its own '
                f'--opt-kwargs (a bare `--opt-kwargs` clears them; train.py\'s --clip-grad clips)')
    return list(dict.fromkeys(problems))


def check_validate_args(
        parser: argparse.ArgumentParser, argv: Sequence[str], cuda_available: Optional[bool] = None) -> List[str]:
    """Problems of a validate.py command line: a checkpoint that does not exist, CUDA that is not there."""
    args = effective_args(parser, argv)
    if args is None:
        return []
    problems = []
    if args.checkpoint and not Path(args.checkpoint).expanduser().exists():  # a folder: validate.py reads each
        problems.append(f'checkpoint {args.checkpoint!r} does not exist')
    return problems + _device_problems(args.device, cuda_available)


def effective_args(
        parser: argparse.ArgumentParser, argv: Sequence[str], config: Optional[Dict[str, Any]] = None,
) -> Optional[argparse.Namespace]:
    """The script's view of recipe + arguments (the recipe as defaults), or None when the script would reject them.

    The recipe goes in as the starting namespace rather than through ``set_defaults``, which leaves the
    parser as it was (values stay as the recipe wrote them: no string-to-number conversion).
    """
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(list(argv), namespace=argparse.Namespace(**(config or {})))
    except SystemExit:
        return None


def _device_problems(device: Any, cuda_available: Optional[bool]) -> List[str]:
    if str(device).split(':')[0] != 'cuda':
        return []
    if cuda_available is None:
        import torch
        cuda_available = torch.cuda.is_available()
    if cuda_available:
        return []
    return [f'--device is {device!r} but CUDA is not available here (timm\'s scripts default to cuda): '
            f'add --device cpu']


def _actions_by_dest(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def _unknown_key(key: Any, actions: Dict[str, argparse.Action]) -> str:
    line = f'recipe key {key!r} is not a train.py argument (train.py ignores unknown keys silently)'
    if key in _SAM_ONLY_KEYS:
        return f'{line}: SAM\'s {key} goes under opt_kwargs, e.g. `opt_kwargs: {{{key}: ...}}`'
    close = difflib.get_close_matches(str(key).replace('-', '_'), list(actions), n=1, cutoff=0.6)
    return f'{line}: did you mean {close[0]!r}?' if close else f'{line}: remove it'


def _opt_problems(opt: str) -> List[str]:
    """``sam_adamw``: timm's factory keeps the text after the last underscore, so SAM silently becomes AdamW."""
    parts = opt.lower().split('_')
    prefix = ['lookahead'] if len(parts) > 1 and parts[0] == 'lookahead' else []
    rest = parts[len(prefix):]
    if len(rest) < 2 or is_sam_optimizer(rest[-1]) or not any(is_sam_optimizer(p) for p in rest[:-1]):
        return []
    joined = '_'.join(prefix + [''.join(rest)])
    fix = repr(joined) if is_sam_optimizer(joined) else (
        f"{'_'.join(prefix + [rest[0]])!r} with opt_kwargs: {{base: {rest[-1]}}}")
    return [f'opt {opt!r} builds plain {rest[-1]} in timm\'s optimizer factory (it keeps only the text after the '
            f'last underscore), not SAM: write {fix}']


def _loss_problems(get: Callable[[str], Any]) -> List[str]:
    """train.py (v1.0.28) builds BinaryCrossEntropy only when mixup / cutmix or label smoothing is on."""
    try:
        smoothing, mixup, cutmix = (float(get(k) or 0) for k in ('smoothing', 'mixup', 'cutmix'))
    except (TypeError, ValueError):  # a bad value is reported by the type checks
        return []
    if get('bce_loss') is not True or get('jsd_loss') or mixup > 0 or cutmix > 0 or get('cutmix_minmax') is not None:
        return []
    if smoothing:
        return []
    return ['bce_loss is true but smoothing is 0 and mixup / cutmix are off: train.py then trains with softmax '
            'cross-entropy and ignores bce_loss; for the sigmoid loss without smoothing set a negligible '
            'smoothing, e.g. `smoothing: 1.0e-06`']


def _kind(value: Any) -> str:
    """``an int``, ``a str``: the value's type with its article."""
    name = type(value).__name__
    return f'{"an" if name[0] in "aeiou" else "a"} {name}'


def _scalar_problem(action: argparse.Action, value: Any) -> Optional[str]:
    kind = action.type or str
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
                kind is int and isinstance(value, float)):
            return f'{value!r} is {_kind(value)}; train.py expects {kind.__name__}'
        if isinstance(value, str):
            try:
                kind(value)
            except ValueError:
                return f'{value!r} is not a number; train.py expects {kind.__name__}'
    elif kind is str and not isinstance(value, str):
        return f'{value!r} is {_kind(value)}; train.py expects text'
    if action.choices is not None and value not in action.choices:
        return f'{value!r} is not one of {", ".join(map(str, action.choices))}'
    return None


def _value_problem(action: argparse.Action, value: Any) -> Optional[str]:
    """Why ``value`` does not fit ``action`` (None when it does); None values keep train.py's default."""
    if value is None:
        return None
    if isinstance(action.default, dict):  # timm's ParseKwargs (--model-kwargs, --opt-kwargs)
        return None if isinstance(value, dict) else f'{value!r} is {_kind(value)}; train.py expects a mapping'
    if action.nargs == 0:  # flags
        return None if isinstance(value, bool) else f'{value!r} is {_kind(value)}; train.py expects true or false'
    if action.nargs in ('+', '*') or isinstance(action.nargs, int):
        if not isinstance(value, (list, tuple)):
            return f'{value!r} is {_kind(value)}; train.py expects a list, e.g. [{value}]'
        if isinstance(action.nargs, int) and len(value) != action.nargs:
            return f'{value!r} has {len(value)} items; train.py expects {action.nargs}'
        if action.nargs == '+' and not value:
            return 'an empty list; train.py expects at least one item'
        for item in value:
            problem = _scalar_problem(action, item)
            if problem:
                return problem
        return None
    return _scalar_problem(action, value)


def _class_count_problems(args: argparse.Namespace) -> List[str]:
    """An ImageFolder's class count against the classes the model will have."""
    root = args.data_dir or getattr(args, 'data', None)
    if not root or args.class_map or str(args.dataset).lower() not in _IMAGE_FOLDER_DATASETS:
        return []
    from timm_ext.preflight import split_folder

    split = split_folder(root, args.train_split) if os.path.isdir(root) else None
    if split is None or not split.folder.is_dir() or (split.fallback and split.other_splits):
        return []  # no folder, or no folder of the split (timm_ext.preflight reports that)
    train_root = split.folder
    classes = [p for p in train_root.iterdir() if p.is_dir() and not p.name.startswith('.')]
    if not classes:
        return []
    num_classes = args.num_classes
    given = num_classes is not None
    if not given:
        num_classes = _model_num_classes(args.model, args.model_kwargs or {})
        if num_classes is None:
            return []
    if len(classes) == num_classes:
        return []
    what = f'--num-classes is {num_classes}' if given else (
        f'--num-classes is not given, so train.py keeps the model\'s default of {num_classes}')
    return [f'the ImageFolder {train_root} has {len(classes)} classes but {what}: add --num-classes {len(classes)}']


def _model_num_classes(model: str, model_kwargs: Dict[str, Any]) -> Optional[int]:
    """The classes ``model`` has by default (built on the meta device: no memory, no weights)."""
    import timm
    import torch

    import timm_ext  # noqa: F401  (registers timm-ext's models)
    try:
        with torch.device('meta'):
            return int(timm.create_model(model, pretrained=False, **model_kwargs).num_classes)
    except Exception:  # an unknown model or bad kwargs: train.py reports those itself
        return None
