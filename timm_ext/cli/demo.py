"""``timm-ext demo``: CB + SAM against a plain ViT + AdamW on real digits, through timm's train.py."""
import argparse
from typing import List

from timm_ext.cli._errors import CliError


def add_parser(subparsers) -> argparse.ArgumentParser:
    from timm_ext import demo

    parser = subparsers.add_parser(
        'demo', help='train CB + SAM vs a plain ViT + AdamW on real digits through timm\'s train.py',
        description='The whole pipeline on real images, in minutes on a laptop CPU: scikit-learn\'s 1,797 '
                    'handwritten digits are written once as an ImageFolder, then timm\'s own train.py trains a '
                    'Context Broadcasting ViT with SAM and the same ViT without CB with AdamW, with the same budget. '
                    'Prints a results table and writes curves.png and summary.json. It shows the pipeline; it '
                    'claims nothing about ImageNet.')
    parser.add_argument('--epochs', type=int, default=None,
                        help=f'epochs per run (default {demo.DEFAULT_EPOCHS}; {demo.QUICK_EPOCHS} with --quick)')
    parser.add_argument('--output', metavar='DIR', default=None,
                        help='a new or empty folder for the results (default: ./timm-ext-demo/<date-time>)')
    parser.add_argument('--quick', action='store_true',
                        help=f'{demo.QUICK_EPOCHS} epochs per run: a couple of minutes on 2 CPU cores (for CI)')
    parser.add_argument('--model', default=demo.DEFAULT_MODEL,
                        help=f'the model trained with SAM (default {demo.DEFAULT_MODEL}); it gets the demo\'s '
                             f'model kwargs {demo.MODEL_KWARGS}')
    parser.add_argument('--baseline', default=demo.DEFAULT_BASELINE,
                        help=f'the model trained with AdamW (default {demo.DEFAULT_BASELINE}, the same ViT without CB)')
    parser.add_argument('--rho', type=float, default=demo.DEMO_RHO, help=f'SAM radius (default {demo.DEMO_RHO})')
    parser.add_argument('--timm-train', metavar='PATH', default=None,
                        help='timm\'s train.py (or its folder) to use instead of the one found for the installed timm')
    parser.add_argument('--data-root', metavar='DIR', default=None,
                        help='where the digits ImageFolder is cached (default: $TIMM_EXT_CACHE/data)')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    from timm_ext.demo import run_demo
    from timm_ext.training import TrainConfigError

    try:
        result = run_demo(
            output=args.output, epochs=args.epochs, quick=args.quick, model=args.model, baseline=args.baseline,
            rho=args.rho, timm_train=args.timm_train, data_root=args.data_root, progress=not args.no_progress)
    except (ValueError, FileExistsError, ImportError, TrainConfigError) as e:
        raise CliError(str(e)) from None
    except RuntimeError as e:  # a train.py run failed: its log tail is in the message
        raise CliError(str(e), exit_code=1) from None
    print(result.table)
    print()
    if result.plot is not None:
        print(f'plot:    {result.plot}')
    else:
        print('plot:    (matplotlib is not installed: pip install "timm-ext[demo]")')
    print(f'summary: {result.summary}')
    print(f'runs:    {", ".join(r.folder for r in result.runs)} (train.py logs, checkpoints, summary.csv)')
    return 0
