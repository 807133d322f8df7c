"""``timm-ext models [PATTERN] [--json]``: the models timm-ext registers, with size, cost and paper."""
import argparse
from typing import List

from timm_ext_cli.commands import COMMANDS, print_models


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'models', help=COMMANDS['models'],
        description='Every model timm-ext registers with timm, with its family, exact parameter count, GMACs '
                    'of one image at its native input size (measured with torch.utils.flop_counter on the meta '
                    'device, attention matmuls included) and the paper it comes from.')
    parser.add_argument('pattern', nargs='?', metavar='PATTERN',
                        help='a wildcard on the model name, as in timm.list_models (e.g. "vit_*_cb*")')
    parser.add_argument('--json', action='store_true', help='print a JSON list instead of a table')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    # the table timm_ext.catalog measured (timm_ext/_data/models.tsv, checked by the tests), as `timm-ext models`
    # prints it without importing torch
    return print_models(args.pattern, args.json)
