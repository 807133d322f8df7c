"""``timm-ext validate [validate.py arguments ...]``: timm's own validate.py with timm-ext imported first."""
import argparse
import sys
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext.cli._scripts import resolve_script, run_child
from timm_ext.launch.build_command import TrainConfigError, build_validate_command
from timm_ext.launch.from_run import RunError, validate_command_from_run
from timm_ext.launch.timm_scripts import ScriptError, load_script_parser
from timm_ext_cli.commands import COMMANDS

PASSTHROUGH = True


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'validate', allow_abbrev=False,
        help=COMMANDS['validate'],
        description='Run timm\'s own validate.py, found and verified like train.py\'s, with timm-ext imported '
                    'before it starts (validate.py has no --device-modules), so timm-ext models and checkpoints '
                    'written by `timm-ext train` validate. A --checkpoint of a train.py run (or the run\'s folder) '
                    'gives validate.py what train.py evaluated with: the model and its arguments, the class count, '
                    'image size, crop, interpolation, mean/std, AMP, the data and the device; your own flags win. '
                    'The folder\'s classes are compared with the run\'s: some of the run\'s classes are mapped to its '
                    'indices by name (--class-map, said in a note), other classes stop with one line. '
                    'Every argument not listed here goes to validate.py unchanged; `timm-ext validate '
                    '--validate-help` shows them.')
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
    parser.add_argument('--best', action='store_true',
                        help='with a run folder as --checkpoint: its model_best.pth.tar (default: last.pth.tar)')
    parser.add_argument('--no-run-args', action='store_true',
                        help='do not read the model and preprocessing from the checkpoint\'s run (validate.py\'s '
                             'own defaults apply, e.g. --model dpn92)')
    parser.add_argument('--dry-run', action='store_true', help='print the command instead of running it')
    parser.add_argument('--validate-help', action='store_true', help='show validate.py\'s own arguments')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    if args.best and args.no_run_args:
        raise CliError('--best reads the run folder, --no-run-args does not: drop one')
    script = resolve_script('validate.py', args.timm_validate, args.allow_unverified)
    if not (args.validate_help or args.no_run_args):
        extra = _from_run(script.path, extra, args.best)
    try:
        command = build_validate_command(
            ['--help'] if args.validate_help else extra, imports=args.imports,
            check=not (args.no_check or args.validate_help), script=script)
    except TrainConfigError as e:
        raise CliError(str(e)) from None
    return run_child(command.argv, dry_run=args.dry_run and not args.validate_help)


def _from_run(script_path, extra: List[str], best: bool) -> List[str]:
    """validate.py's arguments completed from the checkpoint's run; a note names what was taken."""
    try:
        from_run = validate_command_from_run(load_script_parser(script_path), extra, best=best)
    except (RunError, ScriptError) as e:
        raise CliError(str(e)) from None
    if from_run is None:
        return extra
    for line in from_run.taken:
        print(f'timm-ext validate: note: {line}', file=sys.stderr)
    for line in from_run.overrides:
        print(f'timm-ext validate: warning: {line}', file=sys.stderr)
    return from_run.args
