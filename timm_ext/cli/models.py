"""``timm-ext models [PATTERN] [--json]``: the models timm-ext registers, with size, cost and paper."""
import argparse
import json
from typing import List

from timm_ext.cli._errors import CliError


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'models', help='list timm-ext\'s models: family, parameters, GMACs, paper',
        description='Every model timm-ext registers with timm, with its family, exact parameter count, GMACs '
                    'of one image at its native input size (measured with torch.utils.flop_counter on the meta '
                    'device, attention matmuls included) and the paper it comes from.')
    parser.add_argument('pattern', nargs='?', metavar='PATTERN',
                        help='a wildcard on the model name, as in timm.list_models (e.g. "vit_*_cb*")')
    parser.add_argument('--json', action='store_true', help='print a JSON list instead of a table')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    from timm_ext.catalog import list_timm_ext_models, model_info

    names = list_timm_ext_models(args.pattern)
    if not names:
        raise CliError(f'no timm-ext model matches {args.pattern!r}; `timm-ext models` lists all '
                       f'{len(list_timm_ext_models())}')
    infos = [model_info(name) for name in names]
    if args.json:
        print(json.dumps([dict(info.as_dict(), gmacs=round(info.gmacs, 4)) for info in infos], indent=2))
        return 0
    rows = [('model', 'family', 'params (M)', 'GMACs', 'input', 'paper')]
    for info in infos:
        rows.append((info.name, info.family, f'{info.params / 1e6:.2f}', f'{info.gmacs:.2f}',
                     'x'.join(map(str, info.input_size[1:])), info.cite))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {2, 3}
    for row in rows:
        print('  '.join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              .rstrip())
    return 0
