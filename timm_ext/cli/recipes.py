"""``timm-ext recipes list | show NAME | check [RECIPE ...]``: the packaged train.py recipes."""
import argparse
import sys
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext.cli._scripts import resolve_script
from timm_ext.recipes import RecipeError, check_recipe, find_recipe, list_recipes, load_recipe, recipes_dir
from timm_ext.scripts import load_script_parser


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'recipes', help='list, show and check train.py recipes',
        description='The train.py recipes that ship with timm-ext (`timm-ext train -c NAME` runs one).')
    actions = parser.add_subparsers(dest='action', metavar='ACTION')
    actions.required = True
    actions.add_parser('list', help='the name of every packaged recipe')
    show = actions.add_parser('show', help='print a recipe')
    show.add_argument('name', metavar='RECIPE', help='a packaged recipe name or a YAML file')
    check = actions.add_parser(
        'check', help='check recipes against train.py\'s own arguments (exit 1 when one has a problem)',
        description='Check that every key of a recipe is an argument of train.py (of the installed timm), with a '
                    'value of the right kind, and that a SAM optimizer name is one timm\'s factory builds.')
    check.add_argument('names', metavar='RECIPE', nargs='*',
                       help='packaged recipe names or YAML files (default: every packaged recipe)')
    check.add_argument('--timm-train', metavar='PATH', help='timm\'s train.py (or its folder) to check against')
    check.add_argument('--allow-unverified', action='store_true',
                       help='accept a train.py whose sha256 is not in timm-ext\'s table')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    try:
        if args.action == 'list':
            print('\n'.join(list_recipes()))
            return 0
        if args.action == 'show':
            path = find_recipe(args.name)
            print(f'# {path}')
            print(path.read_text(), end='')
            return 0
        return _check(args)
    except RecipeError as e:
        raise CliError(str(e)) from None


def _check(args: argparse.Namespace) -> int:
    paths = [find_recipe(name) for name in args.names] or [recipes_dir() / f'{n}.yaml' for n in list_recipes()]
    script = resolve_script('train.py', args.timm_train, args.allow_unverified)
    parser = load_script_parser(script.path)
    failed = 0
    for path in paths:
        problems = check_recipe(load_recipe(path), parser)
        failed += bool(problems)
        print(f'{"FAIL" if problems else "ok  "} {path}')
        for problem in problems:
            print(f'     {problem}')
    print(f'{len(paths) - failed} of {len(paths)} recipes fit train.py of {script.tag or "unverified origin"}',
          file=sys.stderr)
    return 1 if failed else 0
