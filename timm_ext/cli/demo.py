"""``timm-ext demo``: what the conv stem, CB and SAM bring to a small ViT on real digits, through timm's train.py."""
import argparse
import sys
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext_cli.commands import COMMANDS


def add_parser(subparsers) -> argparse.ArgumentParser:
    from timm_ext import demo

    parser = subparsers.add_parser(
        'demo', help=COMMANDS['demo'],
        description='The whole pipeline on real images, in minutes on a laptop CPU: scikit-learn\'s 1,797 '
                    'handwritten digits are written once as an ImageFolder, then timm\'s own train.py trains '
                    'timm\'s plain ViT with AdamW and the same ViT with timm-ext\'s conv stem, Context Broadcasting '
                    'and SAM, with the same data, epochs and seed; the full demo also leaves out one piece at a time. '
                    'Runs go side by side, one per CPU core. Prints a results table and one line per piece, and '
                    'writes curves.png and summary.json. It claims nothing about ImageNet. Where train.py is not on '
                    'the machine and cannot be downloaded, it says so in one line and trains the same runs in its own '
                    'loop of timm\'s parts, with the same top-1.')
    parser.add_argument('--epochs', type=int, default=None,
                        help=f'epochs per run (default {demo.DEFAULT_EPOCHS}; {demo.QUICK_EPOCHS} with --quick)')
    parser.add_argument('--output', metavar='DIR', default=None,
                        help='a new or empty folder for the results (default: ./timm-ext-demo/<date-time>)')
    parser.add_argument('--quick', action='store_true',
                        help=f'2 runs (plain ViT, ViT + conv stem + CB + SAM) of {demo.QUICK_EPOCHS} epochs, without '
                             f'the one-piece-off ablation: about 30 s on 2 CPU cores')
    parser.add_argument('--rho', type=float, default=demo.DEMO_RHO, help=f'SAM radius (default {demo.DEMO_RHO})')
    parser.add_argument('--jobs', type=int, default=None, metavar='N',
                        help='train.py runs at a time (default: one per CPU core, at most one per run); each has '
                             'one torch thread, so the top-1 does not depend on N')
    parser.add_argument('--timm-train', metavar='PATH', default=None,
                        help='timm\'s train.py (or its folder) to use instead of the one found for the installed timm '
                             '(without any, the demo trains in its built-in loop)')
    parser.add_argument('--data-root', metavar='DIR', default=None,
                        help='where the digits ImageFolder is cached (default: $TIMM_EXT_CACHE/data)')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    # removed when the demo became an ablation of fixed arms; kept to answer with a one-line error
    parser.add_argument('--model', default=None, help=argparse.SUPPRESS)
    parser.add_argument('--baseline', default=None, help=argparse.SUPPRESS)
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    from timm_ext.demo import run_demo
    from timm_ext.launch.build_command import TrainConfigError

    for option in ('model', 'baseline'):
        if getattr(args, option) is not None:
            raise CliError(f'--{option} was removed: the demo now compares fixed runs (plain ViT, conv stem, CB, SAM; '
                           f'docs/demo.md); train your own models with `timm-ext train --model NAME`')
    try:
        result = run_demo(
            output=args.output, epochs=args.epochs, quick=args.quick, rho=args.rho, timm_train=args.timm_train,
            data_root=args.data_root, progress=not args.no_progress, jobs=args.jobs,
            log=lambda line: print(line, flush=True))
    except (ValueError, FileExistsError, ImportError, TrainConfigError) as e:
        raise CliError(str(e)) from None
    except RuntimeError as e:  # a train.py run failed: its log tail is in the message
        raise CliError(str(e), exit_code=1) from None
    sys.stdout.flush()
    print()
    print(result.table)
    print()
    for line in result.contributions:
        print(f'- {line}')
    print()
    if result.plot is not None:
        print(f'plot:    {result.plot}')
    else:
        print('plot:    (matplotlib is not installed: pip install "timm-ext[demo]")')
    print(f'summary: {result.summary}')
    print(f'runs:    {result.output} (per run: <run>/ with its summary.csv, args.yaml, checkpoints; <run>.log)')
    print(f'total:   {result.wall_s:.0f} s')
    return 0
