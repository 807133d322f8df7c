"""``timm-ext recipes list | show NAME | check [RECIPE ...] | index``: the packaged train.py recipes."""
import argparse
import sys
from pathlib import Path
from typing import List, Optional

from timm_ext.cli._errors import CliError
from timm_ext.cli._scripts import resolve_script
from timm_ext.launch.timm_scripts import load_script_parser
from timm_ext.recipes import (
    PaperRow,
    RecipeError,
    build_index,
    check_against_paper,
    check_recipe,
    find_paper_row,
    find_recipe,
    format_index,
    format_index_markdown,
    list_recipes,
    load_paper_values,
    load_recipe,
    packaged_row,
    readme_with_index,
    recipes_dir,
)
from timm_ext_cli.commands import COMMANDS, print_recipe_list


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'recipes', help=COMMANDS['recipes'],
        description='The train.py recipes that ship with timm-ext (`timm-ext train -c NAME` runs one).')
    actions = parser.add_subparsers(dest='action', metavar='ACTION')
    actions.required = True
    listing = actions.add_parser(
        'list', help='every packaged recipe with its paper table, row, model, global batch and expected top-1')
    listing.add_argument('--names', action='store_true', help='only the recipe names, one a line')
    listing.add_argument('--wide', action='store_true',
                         help='every column whole, however wide (the default when the output is not a terminal; '
                              'on a terminal the paper row and table are shortened or left out to fit its width)')
    show = actions.add_parser('show', help='print a recipe')
    show.add_argument('name', metavar='RECIPE', help='a packaged recipe name or a YAML file')
    check = actions.add_parser(
        'check', help='check recipes against train.py\'s own arguments and their paper (exit 1 on a problem)',
        description='Check that every key of a recipe is an argument of train.py (of the installed timm), with a '
                    'value of the right kind, that a SAM optimizer name is one timm\'s factory builds and that its SAM '
                    'settings (opt_kwargs) pass the optimizer\'s own checks. A packaged paper recipe, or any '
                    'recipe with --against, is also compared value by value with the paper.')
    check.add_argument('names', metavar='RECIPE', nargs='*',
                       help='packaged recipe names or YAML files (default: every packaged recipe)')
    check.add_argument('--against', metavar='PAPER_RECIPE',
                       help='compare with the paper values of this packaged recipe (e.g. vit-sam/imagenet/vit_s16_sam)')
    check.add_argument('--timm-train', metavar='PATH', help='timm\'s train.py (or its folder) to check against')
    check.add_argument('--allow-unverified', action='store_true',
                       help='accept a train.py whose sha256 is not in timm-ext\'s table')
    index = actions.add_parser('index', help='print recipes/index.csv as generated from the paper-values tables')
    index.add_argument('--write', action='store_true',
                       help='write it to recipes/index.csv (and its table into recipes/README.md) instead')
    index.add_argument('--markdown', action='store_true', help='print it as a Markdown table')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    try:
        if args.action == 'list':
            if args.names:
                print('\n'.join(list_recipes()))
            else:
                print_recipe_list(wide=args.wide)
            return 0
        if args.action == 'show':
            path = find_recipe(args.name)
            print(f'# {path}')
            print(path.read_text(), end='')
            return 0
        if args.action == 'index':
            if args.write:
                print(_write_index(recipes_dir() / 'index.csv'))
            else:
                print((format_index_markdown if args.markdown else format_index)(build_index()), end='')
            return 0
        return _check(args)
    except RecipeError as e:
        raise CliError(str(e)) from None


def _write_index(path: Path) -> Path:
    """Regenerate ``path`` (recipes/index.csv) from the paper-values tables, and the table between the
    ``INDEX_MARKERS`` of the README.md beside it."""
    index = build_index()
    path.write_text(format_index(index))
    readme = path.parent / 'README.md'
    text = readme_with_index(readme.read_text(), index) if readme.is_file() else None
    if text is not None:
        readme.write_text(text)
    return path


def _check(args: argparse.Namespace) -> int:
    paths = [find_recipe(name) for name in args.names] or [recipes_dir() / f'{n}.yaml' for n in list_recipes()]
    rows = load_paper_values()
    against: Optional[PaperRow] = find_paper_row(args.against, rows) if args.against else None
    script = resolve_script('train.py', args.timm_train, args.allow_unverified)
    parser = load_script_parser(script.path)
    failed = 0
    for path in paths:
        config = load_recipe(path)
        problems = check_recipe(config, parser)
        own = packaged_row(path, rows)
        row = against or own
        if row is not None:
            problems += check_against_paper(config, row, parser, explicit=row is own)
        failed += bool(problems)
        note = f'  [{row.cite}: {len(row.values)} paper values, {len(row.deviations)} documented deviations]' \
            if row is not None and not problems else ''
        print(f'{"FAIL" if problems else "ok  "} {path}{note}')
        for problem in problems:
            print(f'     {problem}')
    print(f'{len(paths) - failed} of {len(paths)} recipes fit train.py of {script.tag or "unverified origin"}'
          f'{" and their papers" if rows else ""}', file=sys.stderr)
    return 1 if failed else 0
