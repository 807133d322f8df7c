"""``timm-ext analyze METRIC``: one of the papers' diagnostics on a model and images, as JSON, CSV and a plot."""
import argparse
import inspect
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from timm_ext.cli._errors import CliError
from timm_ext_cli.commands import COMMANDS


def add_parser(subparsers) -> argparse.ArgumentParser:
    from timm_ext.analysis.runner import LOSS_METRICS, METRICS, load_batches
    from timm_ext.analysis.runner import option_default as d

    metrics = '\n'.join(f'  {name:12s} {text}' for name, text in METRICS.items())
    parser = subparsers.add_parser(
        'analyze', help=COMMANDS['analyze'],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description='Measure one diagnostic of the CB, scaled-ReLU, how-do-vits-work and SAM papers on a timm or '
                    'timm-ext model, and write METRIC.json, METRIC.csv and METRIC.png to --out.\n\nmetrics:\n'
                    + metrics + f'\n\n{", ".join(LOSS_METRICS)} use the training split by default, the others the '
                    'validation split.')
    parser.add_argument('metric', metavar='METRIC', help='one of: ' + ', '.join(METRICS))
    parser.add_argument('--model', default=None, help='timm model name (default: the checkpoint\'s architecture)')
    parser.add_argument('--checkpoint', metavar='PATH', default=None,
                        help='train.py checkpoint, a train.py run folder (its last.pth.tar) or .safetensors; the '
                             'model arguments and the preprocessing (size, mean/std, crop) train.py recorded are used')
    parser.add_argument('--best', action='store_true',
                        help='with a run folder as --checkpoint: its model_best.pth.tar')
    parser.add_argument('--model-kwargs', nargs='*', default=[], metavar='KEY=VALUE',
                        help='keyword arguments of timm.create_model, e.g. img_size=32 patch_size=4')
    parser.add_argument('--other-model', default=None, help='cka: a second model to compare with (default: itself)')
    parser.add_argument('--other-checkpoint', metavar='PATH', default=None, help='cka: the second model\'s weights')
    parser.add_argument('--data', default='digits', metavar='digits|DIR',
                        help='"digits" (scikit-learn\'s, embedded; 32 px) or an ImageFolder (with train/ and '
                             'validation/ subfolders, or the images\' class folders directly)')
    parser.add_argument('--img-size', type=int, default=None,
                        help='image side for a folder (default: the ViT\'s img_size, else the pretrained config\'s)')
    parser.add_argument('--split', default=None, help='subfolder of the data (default: train or validation, see above)')
    parser.add_argument('--out', metavar='DIR', default='timm-ext-analysis', help='output folder (created)')
    parser.add_argument('--batches', type=int, default=4, help='number of batches (default 4)')
    parser.add_argument('--batch-size', type=int, default=16, help='images per batch (default 16, as App. A.1)')
    # metric options default to None: the library function's own default applies (shown here, not repeated)
    parser.add_argument('--k', type=int, help=f'hessian: eigenvalues per batch (default {d("hessian", "k")})')
    parser.add_argument('--max-iter', type=int,
                        help=f'hessian: power iterations (default {d("hessian", "max_iter")})')
    parser.add_argument('--weight-decay', type=float,
                        help='hessian/trace/density/landscape: add weight_decay/2 ||w||^2 to the loss '
                             f'(default {d("hessian", "weight_decay")})')
    parser.add_argument('--samples', type=int,
                        help=f'trace: Hutchinson samples (default {d("trace", "samples")}); noise: noise draws '
                             f'(default {d("noise", "samples")})')
    parser.add_argument('--runs', type=int, help=f'density: Lanczos runs (default {d("density", "runs")})')
    parser.add_argument('--iterations', type=int,
                        help=f'density: Lanczos steps (default {d("density", "iterations")})')
    parser.add_argument('--sigma', type=float,
                        help=f'noise: std of the weight noise (default {d("noise", "sigma")})')
    parser.add_argument('--steps', type=int, help=f'landscape: grid points per axis (default '
                                                  f'{d("landscape", "steps")}; 2-D: {d("landscape2d", "steps")})')
    parser.add_argument('--span', type=float,
                        help=f'landscape: coordinates in [-span, span] (default {d("landscape", "span")})')
    parser.add_argument('--seed', type=int, default=inspect.signature(load_batches).parameters['seed'].default,
                        help='seed of the data order, directions and probes (default %(default)s)')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    return parser


def _options(args: argparse.Namespace) -> dict:
    """The metric options given on the command line (the library's defaults fill in the others)."""
    from timm_ext.analysis.runner import METRIC_OPTIONS

    return {name: getattr(args, name) for name in METRIC_OPTIONS if getattr(args, name) is not None}


def run(args: argparse.Namespace, extra: List[str]) -> int:
    from timm_ext.analysis.runner import (
        LOSS_METRICS,
        METRICS,
        build_model,
        load_batches,
        parse_kwargs,
        progress_total,
        run_metric,
    )

    if args.metric not in METRICS:
        raise CliError(f'unknown metric {args.metric!r}: choose one of {", ".join(METRICS)}')
    if args.model is None and args.checkpoint is None:
        raise CliError('name a model with --model NAME (or give a train.py --checkpoint that records it)')
    if args.samples is not None and args.metric == 'density':
        raise CliError('density counts Lanczos runs with --runs N, not --samples')
    if (args.other_model or args.other_checkpoint) and args.metric != 'cka':
        raise CliError(f'--other-model/--other-checkpoint are for the cka metric only, not {args.metric!r}')
    split = args.split or ('train' if args.metric in LOSS_METRICS else 'validation')
    num_classes = 10 if args.data == 'digits' else None
    try:
        checkpoint, data_config = _run_checkpoint(args.checkpoint, args.best)
        kwargs = parse_kwargs(args.model_kwargs)
        model = build_model(args.model, checkpoint, kwargs, num_classes)
        other = None
        if args.other_model or args.other_checkpoint:
            other = build_model(args.other_model or args.model, args.other_checkpoint, kwargs, num_classes)
        batches = load_batches(args.data, split, args.batch_size, args.batches, model, args.seed, args.img_size,
                               data_config=data_config)
    except FileNotFoundError as e:
        raise CliError(str(e)) from None
    except (ValueError, TypeError, RuntimeError, ImportError, OSError) as e:
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise CliError(lines[0]) from None

    options = _options(args)
    from tqdm.auto import tqdm
    with tqdm(total=progress_total(args.metric, len(batches), options) or None, disable=args.no_progress,
              desc=f'analyze {args.metric}', unit='step') as bar:
        try:
            result = run_metric(args.metric, model, batches, args.out, options, progress=bar.update, other=other)
        except ImportError as e:
            raise CliError(f'{e}') from None
        except (ValueError, RuntimeError, AssertionError) as e:  # e.g. images of the wrong size for the model
            raise CliError((str(e).strip().splitlines() or [type(e).__name__])[0]) from None
    print(f'{args.metric}: {_headline(result.summary)}')
    print(f'json: {result.json}')
    print(f'csv:  {result.csv}')
    if result.plot is not None:
        print(f'plot: {result.plot}')
    return 0


def _run_checkpoint(path: Optional[str], best: bool) -> Tuple[Optional[Path], Dict[str, Any]]:
    """The checkpoint file (a run folder's last or best) and the preprocessing its run recorded; a note names
    what is taken from the run."""
    from timm_ext.hub import HubError, load_checkpoint
    from timm_ext.launch.from_run import RunError, run_checkpoint

    if path is None:
        if best:
            raise CliError('--best picks model_best.pth.tar of the run folder given with --checkpoint: add it')
        return None, {}
    try:
        checkpoint = run_checkpoint(path, best)
        ckpt = load_checkpoint(checkpoint)
    except (RunError, HubError) as e:
        raise CliError(str(e)) from None
    config = ckpt.data_config()
    taken = [f'model {ckpt.arch}'] if ckpt.arch else []
    taken += [f'{k} {v}' for k, v in ckpt.model_kwargs().items()]
    taken += [f'{k} {v}' for k, v in config.items()]
    if taken:
        print(f'timm-ext analyze: note: from {checkpoint.parent.name}/{checkpoint.name}: {", ".join(taken)}',
              file=sys.stderr)
    return checkpoint, config


def _headline(summary: dict) -> str:
    """A one-line summary of the numbers (the JSON has them all)."""
    import torch

    parts = []
    for key in ('lambda_max', 'nep', 'ape', 'trace', 'std_error', 'noisy_loss', 'loss', 'baseline'):
        if isinstance(summary.get(key), (int, float)):
            parts.append(f'{key} {summary[key]:.4g}')
    if 'entropy' in summary:
        parts.append('entropy per layer ' + ' '.join(f'{v:.3f}' for v in summary['entropy'].mean(dim=1).tolist()))
    if 'values' in summary:
        parts.append(' '.join(f'{v:.3g}' for v in summary['values'].values()))
    if 'at_pi' in summary:
        parts.append('at pi: ' + ' '.join(f'{v:.3g}' for v in summary['at_pi'].values()))
    if 'cka' in summary and torch.is_tensor(summary['cka']):
        parts.append(f'{tuple(summary["cka"].shape)} matrix')
    if 'loss' in summary and torch.is_tensor(summary['loss']):
        parts.append(f'loss from {float(summary["loss"].min()):.4g} to {float(summary["loss"].max()):.4g}')
    return ', '.join(parts) or 'done'
