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
and, for a full command line (recipe + arguments, :func:`check_train_args`):
* ``--device cuda`` (train.py's default) where CUDA is not available;
* an ImageFolder whose class count differs from the number of classes the model will have
  (train.py keeps the model's default, usually 1000, when ``--num-classes`` is not given);
* a baseline ``--opt adamw`` over a SAM recipe whose ``opt_kwargs`` still carry SAM's ``rho``;
and for validate.py (:func:`check_validate_args`): a ``--checkpoint`` that does not exist, no CUDA.

Recipes ship in the repository's ``recipes/`` folder (inside the wheel as ``timm_ext/_recipes``) and
are named by their path without ``.yaml``: ``examples/sam_minimal``, ``vit-sam/imagenet/vit_b16_sam``.
"""
import argparse
import contextlib
import difflib
import io
import os
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import yaml

from timm_ext._resources import packaged_dir

__all__ = [
    'RecipeError', 'check_recipe', 'check_train_args', 'check_validate_args', 'effective_args', 'find_recipe',
    'is_sam_optimizer', 'list_recipes', 'load_recipe', 'recipes_dir',
]

_SUFFIX = '.yaml'
# SAM's own optimizer arguments (opt_kwargs); none of them is a train.py argument
_SAM_ONLY_KEYS = ('rho', 'adaptive', 'eta', 'base')
# what a non-SAM optimizer rejects when a SAM recipe's opt_kwargs are kept
_SAM_OPT_KWARGS = _SAM_ONLY_KEYS + ('clip_grad', 'clip_mode')
_IMAGE_FOLDER_DATASETS = ('', 'folder', 'image_folder')


class RecipeError(ValueError):
    """A recipe cannot be found or read (one line)."""


def recipes_dir() -> Path:
    """The folder of packaged recipes (``recipes/`` of the repository, ``timm_ext/_recipes`` in a wheel)."""
    return packaged_dir('recipes')


def list_recipes() -> List[str]:
    """Names of every packaged recipe, sorted (``examples/sam_minimal``, ...)."""
    root = recipes_dir()
    return sorted(p.relative_to(root).with_suffix('').as_posix() for p in root.rglob(f'*{_SUFFIX}'))


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
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f'; did you mean {", ".join(close)}?' if close else ''
    raise RecipeError(f'unknown recipe {str(name_or_path)!r}: not a file and not one of the {len(names)} packaged '
                      f'recipes (`timm-ext recipes list`){hint}')


def load_recipe(path: Union[str, Path]) -> Dict[str, Any]:
    """The recipe as a dict (a YAML mapping; an empty file is an empty recipe)."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise RecipeError(f'recipe {path} is not valid YAML: {" ".join(str(e).split())}') from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise RecipeError(f'recipe {path} must be a mapping of train.py arguments, not a {type(config).__name__}')
    return config


def is_sam_optimizer(opt: str) -> bool:
    """True when timm's factory (with timm_ext loaded) builds SAM for ``opt`` (``samadamw``, ``lookahead_sam``)."""
    from timm.optim import get_optimizer_info, list_optimizers

    import timm_ext.optim  # noqa: F401  (registers SAM with timm's factory)
    from timm_ext.optim.sam_factory import create_sam

    name = str(opt).lower().split('_')[-1]
    if name not in list_optimizers():
        return False
    opt_class = get_optimizer_info(name).opt_class
    return isinstance(opt_class, partial) and opt_class.func is create_sam


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
    return problems


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
    if args.checkpoint and not Path(args.checkpoint).expanduser().is_file():
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
    from timm.data.dataset_factory import _search_split

    train_root = Path(_search_split(str(root), args.train_split)) if os.path.isdir(root) else None
    if train_root is None or not train_root.is_dir():
        return []
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
