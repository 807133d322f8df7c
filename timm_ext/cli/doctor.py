"""``timm-ext doctor [--json]``: the environment for a bug report, and whether a training run can start."""
import argparse
import json
import sys
from typing import List

from timm_ext_cli.commands import COMMANDS


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'doctor', help=COMMANDS['doctor'],
        description='Print what a bug report needs: the versions of python, torch, torchvision, timm, timm-ext, '
                    'safetensors and huggingface-hub, whether torch and torchvision match (one torchvision op is '
                    'run), the devices, which timm train.py and validate.py would be used (given, cached, or '
                    'downloadable now: the server is asked for a script on neither, a few seconds at most, not '
                    'while offline) and whether their sha256 is known, the cache folder and whether huggingface_hub '
                    'is offline. Nothing is downloaded or written. Exit 0 when everything a training run needs is '
                    'there, 1 otherwise; the last line says which commands cannot start (timm-ext demo runs without '
                    'timm\'s scripts) and the one thing to do first.')
    parser.add_argument('--json', action='store_true', help='print the report as JSON')
    parser.add_argument('--timm-train', metavar='PATH', help='check this train.py (or its folder), as train would')
    parser.add_argument('--timm-validate', metavar='PATH',
                        help='check this validate.py (or its folder), as validate would')
    parser.add_argument('--allow-unverified', action='store_true',
                        help='accept a script whose sha256 timm-ext does not know, as train and validate would')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    from timm_ext.doctor import collect

    report = collect(timm_train=args.timm_train, timm_validate=args.timm_validate,
                     allow_unverified=args.allow_unverified)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        if not report.ok:
            print(f'timm-ext doctor: {report.summary}', file=sys.stderr)
        return 0 if report.ok else 1
    width = max(len(check.name) for check in report.checks)
    for check in report.checks:
        print(f'{check.status:<4}  {check.name:<{width}}  {check.value}')
        if not check.ok:
            print(f'{"":<4}  {"":<{width}}  fix: {check.fix}')
    print(report.summary)
    return 0 if report.ok else 1
