"""``timm-ext train [-c RECIPE] [train.py arguments ...]``: timm's own train.py with timm-ext loaded."""
import argparse
import sys
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext.cli._scripts import resolve_script, run_child
from timm_ext.launch.commands import TrainConfigError, build_train_command

PASSTHROUGH = True


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'train', allow_abbrev=False,
        help='run timm\'s train.py (of the installed timm) with timm-ext loaded',
        description='Run timm\'s own train.py for the installed timm version with timm-ext loaded '
                    '(--device-modules timm_ext is added when absent). Every argument not listed here goes to '
                    'train.py unchanged; `timm-ext train --train-help` shows them.',
        epilog='Before train.py starts, the recipe and the arguments are checked (unknown recipe keys, a SAM name '
               'timm\'s factory would not build, no CUDA without --device, an ImageFolder whose class count '
               'differs from --num-classes, SAM arguments left over under a baseline --opt, an unknown model, '
               'a missing --data-dir or split folder, fewer images per process than the batch, a paper recipe '
               'at another global batch than its paper\'s).')
    parser.add_argument('-c', '--config', metavar='RECIPE',
                        help='a recipe: a YAML file or a packaged recipe name (`timm-ext recipes list`)')
    parser.add_argument('--timm-train', metavar='PATH',
                        help='timm\'s train.py (or its folder) to run instead of the one found for the installed timm')
    parser.add_argument('--allow-unverified', action='store_true',
                        help='run a train.py whose sha256 is not in timm-ext\'s table of timm releases')
    parser.add_argument('--nproc-per-node', type=int, metavar='N',
                        help='run N processes through torch.distributed.run (torchrun), like timm\'s '
                             'distributed_train.sh')
    parser.add_argument('--allow-batch-change', action='store_true',
                        help='run a packaged paper recipe at another global batch (batch x processes x accumulation '
                             'steps) than its paper\'s, with a one-line warning instead of an error')
    parser.add_argument('--no-check', action='store_true',
                        help='skip timm-ext\'s checks of the recipe and arguments')
    parser.add_argument('--dry-run', action='store_true', help='print the command instead of running it')
    parser.add_argument('--train-help', action='store_true', help='show train.py\'s own arguments')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    script = resolve_script('train.py', args.timm_train, args.allow_unverified)
    if args.train_help:
        return run_child([sys.executable, str(script.path), '--help'])
    try:
        command = build_train_command(
            extra, recipe=args.config, nproc_per_node=args.nproc_per_node, check=not args.no_check, script=script,
            allow_batch_change=args.allow_batch_change)
    except TrainConfigError as e:
        raise CliError(str(e)) from None
    for warning in command.warnings:
        print(f'timm-ext train: warning: {warning}', file=sys.stderr)
    return run_child(command.argv, dry_run=args.dry_run)
