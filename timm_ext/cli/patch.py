"""``timm-ext patch PATH [--out PATH]``: make SAM work in timm's train.py v1.0.15 ... v1.0.22."""
import argparse
from pathlib import Path
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext_cli.commands import COMMANDS

DEFAULT_NAME = 'train_timm_ext.py'


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'patch',
        help=COMMANDS['patch'],
        description='Write a patched copy of timm\'s train.py (v1.0.15 ... v1.0.22, the versions before '
                    'the task API) in which SAM optimizers run their second forward-backward pass. The '
                    'script is recognised by its sha256; an unknown file is refused; the input is never '
                    'changed and no existing file is overwritten. timm >= 1.0.23 needs no patch.',
    )
    parser.add_argument('path', type=Path, metavar='PATH', help='timm\'s train.py')
    parser.add_argument('--out', type=Path, default=None, metavar='PATH',
                        help=f'where to write the patched script (default: {DEFAULT_NAME} next to PATH)')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    from timm_ext.launch.patches import patch_script

    out = args.out if args.out is not None else args.path.parent / DEFAULT_NAME
    try:
        tags = patch_script(args.path, out)
    except (ValueError, OSError) as e:
        raise CliError(str(e)) from None
    print(f'{out}: train.py of timm {tags} with the timm-ext SAM patch (from {args.path})')
    return 0
