"""Packaged train.py recipes by name: list them, find one (with close names for a typo), read it.

A recipe is a YAML file for timm's own ``train.py -c``: its keys are train.py's argument names (``dest``:
``opt_kwargs``, not ``--opt-kwargs``). Recipes ship in the repository's ``recipes/`` folder (inside the
wheel as ``timm_ext/_recipes``) and are named by their path without ``.yaml``: ``examples/sam_minimal``,
``vit-sam/imagenet/vit_b16_sam``.
"""
import difflib
import os
from pathlib import Path
from typing import Any, Dict, List, Union

import yaml

from timm_ext._resources import packaged_dir
from timm_ext_cli.commands import recipe_names

__all__ = ['RecipeError', 'close_recipe_names', 'find_recipe', 'list_recipes', 'load_recipe', 'recipes_dir']

SUFFIX = '.yaml'
_YAML_LOADER = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)  # libyaml's safe loader when PyYAML has it: ~10x faster


class RecipeError(ValueError):
    """A recipe cannot be found or read (one line)."""


def recipes_dir() -> Path:
    """The folder of packaged recipes (``recipes/`` of the repository, ``timm_ext/_recipes`` in a wheel)."""
    return packaged_dir('recipes')


def list_recipes() -> List[str]:
    """Names of every packaged recipe, sorted (``examples/sam_minimal``, ...)."""
    return recipe_names(recipes_dir())


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
    name = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
    names = list_recipes()
    if name in names:
        return recipes_dir() / f'{name}{SUFFIX}'
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
