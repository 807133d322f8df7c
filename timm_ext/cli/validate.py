"""``timm-ext validate [validate.py arguments ...]``: timm's own validate.py with timm-ext imported first."""
import argparse
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext.cli._scripts import resolve_script, run_child
from timm_ext.launch.commands import TrainConfigError, build_validate_command

PASSTHROUGH = True


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'validate', allow_abbrev=False,
        help='run timm\'s validate.py (of the installed timm) with timm-ext imported first',
        description='Run timm\'s own validate.py, found and verified like train.py\'s, with timm-ext imported '
                    'before it starts (validate.py has no --device-modules), so timm-ext models and checkpoints '
                    'written by `timm-ext train` validate. Every argument not listed here goes to validate.py '
                    'unchanged; `timm-ext validate --validate-help` shows them.')
    parser.add_argument('--timm-validate', metavar='PATH',
                        help='timm\'s validate.py (or its folder) instead of the one found for the installed timm')
    parser.add_argument('--allow-unverified', action='store_true',
                        help='run a validate.py whose sha256 is not in timm-ext\'s table of timm releases')
    parser.add_argument('--import', dest='imports', metavar='MODULE', action='append', default=[],
                        help='another module to import before validate.py runs (repeatable), e.g. one that '
                             'registers your own models')
    parser.add_argument('--no-check', action='store_true',
                        help='skip timm-ext\'s checks of the arguments (checkpoint exists, CUDA available, the model '
                             'known, the data folder and its split there)')
    parser.add_argument('--dry-run', action='store_true', help='print the command instead of running it')
    parser.add_argument('--validate-help', action='store_true', help='show validate.py\'s own arguments')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    script = resolve_script('validate.py', args.timm_validate, args.allow_unverified)
    try:
        command = build_validate_command(
            ['--help'] if args.validate_help else extra, imports=args.imports,
            check=not (args.no_check or args.validate_help), script=script)
    except TrainConfigError as e:
        raise CliError(str(e)) from None
    return run_child(command.argv, dry_run=args.dry_run and not args.validate_help)
