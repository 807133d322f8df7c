"""AlterNet speed, measured side by side: against the official code, or against its pre-activation ResNet baselines.

``--official PATH`` (PATH: a checkout of https://github.com/xxxnell/how-do-vits-work, which needs ``einops``;
nothing of it is copied into timm-ext) times the official ``models/alternet.py`` against ours at the same
configuration, after converting the official weights with ``convert_official_alternet`` and checking that both
give the same outputs (eval and train mode):

  * CIFAR-100: official AlterNet-50 with MSA blocks (0, 1, 1, 2), window 4, 3x3 stem vs ``alternet_50_cifar``,
    32 x 32, batch 32;
  * ImageNet: official ``dnn_50`` (MSA blocks (0, 1, 3, 2), window 7) vs ``alternet_50``, 224 x 224, batch 8.

A train step is forward + cross-entropy + backward (no optimizer step: its cost is the same for both);
inference is an eval-mode forward under ``torch.no_grad()``. Each pair runs interleaved (A, B, A, B, ...), median
of ``--reps``; ratio = official time / our time (> 1: ours is faster). The ``memory`` column is the format both
models and the input are given, as a user would run them: ``contiguous`` (NCHW, the default) or, with
``--channels-last``, channels-last. Ours is run as created (``channels_last=True``: it converts the input once and
runs its trunk channels-last whatever it is given); ``--keep-format`` adds rows of ours with
``channels_last=False`` (trunk in the given format) to show what that conversion is worth. Ours times the two
small-map routes of each last-stage conv at its first call (``timm_ext.layers.SmallMapConv2d``; the warm-up absorbs
it); ``--fixed-small-map-rule`` turns that off (the fixed rule: every small map takes the small-map route).
Every run prints the CPU or GPU it ran on: speed figures name their machine.

Without ``--official``: train steps (with AdamW) of AlterNet next to its baselines (paper App. E: Alter-ResNet-50
20 % faster than the pre-activation ResNet-50 on CIFAR-100, on a GPU):

  * alternet_50_cifar  vs alternet_50_nomsa_cifar, 32 x 32, 100 classes;
  * alternet_50        vs timm's resnetv2_50, 224 x 224.

    python benchmarks/bench_alternet.py --official /tmp/how-do-vits-work [--threads 2] [--reps 7] [--channels-last]
        [--keep-format] [--configs cifar imagenet] [--fixed-small-map-rule]
    python benchmarks/bench_alternet.py [--cifar-batch 32] [--imagenet-batch 4] [--reps 5] [--device cpu]
"""
import argparse
from pathlib import Path
from typing import Callable, Dict

import timm
import torch
import torch.nn as nn
from official_alternet import check_same_outputs, official_model, randomize_norms
from timing import device_name, forward_backward, interleaved_median_seconds, train_step

import timm_ext  # noqa: F401
from timm_ext.layers.small_map_conv import set_small_map_autotune, small_map_autotune_enabled
from timm_ext.models import convert_official_alternet

PAIRS = [  # (model, baseline, image size, batch-size argument)
    ('alternet_50_cifar', 'alternet_50_nomsa_cifar', 32, 'cifar_batch'),
    ('alternet_50', 'resnetv2_50', 224, 'imagenet_batch'),
]


def _machine_line(device: torch.device) -> str:
    return (f'machine: {device_name(device)} ({device}), torch {torch.__version__}, timm {timm.__version__}, '
            f'small-map routes: {"timed per shape" if small_map_autotune_enabled() else "fixed rule"}')


def _inference(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def forward() -> None:
        with torch.no_grad():
            model(x)
    return forward


def _time_pair(official: nn.Module, ours: nn.Module, x, y, device, args) -> Dict[str, float]:
    """Official / ours time ratio for a train step and for inference."""
    ratios = {}
    for mode in ('train', 'inference'):
        for m in (official, ours):
            m.train(mode == 'train')
        fn = (lambda m: forward_backward(m, x, y)) if mode == 'train' else (lambda m: _inference(m, x))
        t = interleaved_median_seconds({'official': fn(official), 'ours': fn(ours)}, device,
                                       warmup=args.warmup, reps=args.reps)
        ratios[mode] = t['official'] / t['ours']
        ratios[f'{mode}_ms'] = (1e3 * t['official'], 1e3 * t['ours'])
    return ratios


def compare_with_official(args: argparse.Namespace, device: torch.device) -> None:
    configs = [  # (label, ours, imagenet, size, batch)
        ('CIFAR-100', 'alternet_50_cifar', False, 32, args.cifar_batch),
        ('ImageNet', 'alternet_50', True, 224, args.imagenet_batch),
    ]
    configs = [c for c in configs if c[0].split('-')[0].lower() in args.configs]
    formats = [torch.contiguous_format] + ([torch.channels_last] if args.channels_last else [])
    trunks = [True] + ([False] if args.keep_format else [])
    print(_machine_line(device))
    print(f'official code vs timm-ext: device={device} threads={torch.get_num_threads()} reps={args.reps} '
          f'(median, interleaved; ratio = official time / ours, > 1: ours is faster)')
    print('memory: the format models and input are given; ours trunk: channels_last (the default, input converted '
          'once) or as given (channels_last=False)')
    print(f'{"config":<10} {"model":<18} {"size":>4} {"batch":>5} {"memory":<14} {"ours trunk":<14} {"max|diff|":>9} '
          f'{"train ms (off / ours)":>22} {"ratio":>6} {"infer ms (off / ours)":>22} {"ratio":>6}')
    for label, name, imagenet, size, batch in configs:
        torch.manual_seed(0)
        official = official_model(args.official, imagenet)
        randomize_norms(official)
        x = torch.randn(batch, 3, size, size)
        for channels_last in trunks:
            ours = timm.create_model(name, channels_last=channels_last)
            ours.load_state_dict(convert_official_alternet(official.state_dict(), ours))
            y = torch.randint(0, ours.num_classes, (batch,))
            diff = check_same_outputs(official, ours, x[:4])
            for fmt in formats:
                official, ours = official.to(device, memory_format=fmt), ours.to(device, memory_format=fmt)
                xd, yd = x.to(device).contiguous(memory_format=fmt), y.to(device)
                r = _time_pair(official, ours, xd, yd, device, args)
                memory = 'channels_last' if fmt == torch.channels_last else 'contiguous'
                trunk = 'channels_last' if channels_last else 'as given'
                print(f'{label:<10} {name:<18} {size:>4} {batch:>5} {memory:<14} {trunk:<14} {diff:>9.1e} '
                      f'{r["train_ms"][0]:>10.1f} /{r["train_ms"][1]:>10.1f} {r["train"]:>6.3f} '
                      f'{r["inference_ms"][0]:>10.1f} /{r["inference_ms"][1]:>10.1f} {r["inference"]:>6.3f}')
            del ours
        del official


def compare_with_baselines(args: argparse.Namespace, device: torch.device) -> None:
    print(_machine_line(device))
    print(f'device={device} threads={torch.get_num_threads()} reps={args.reps} (median, interleaved)')
    print(f'{"model":<20} {"baseline":<25} {"size":>4} {"batch":>5} {"params M":>15} '
          f'{"train img/s":>16} {"ratio":>6}')
    for name, base_name, size, batch_arg in PAIRS:
        batch = getattr(args, batch_arg)
        model = timm.create_model(name).to(device).train()
        base = timm.create_model(base_name, num_classes=model.num_classes).to(device).train()
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, model.num_classes, (batch,), device=device)
        times = interleaved_median_seconds(
            {'alt': train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), x, y),
             'base': train_step(base, torch.optim.AdamW(base.parameters(), lr=1e-4), x, y)},
            device, warmup=args.warmup, reps=args.reps)
        params = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (model, base)]
        print(f'{name:<20} {base_name:<25} {size:>4} {batch:>5} {params[0]:>6.2f} /{params[1]:>6.2f} '
              f'{batch / times["alt"]:>7.2f} /{batch / times["base"]:>7.2f} {times["base"] / times["alt"]:>6.3f}')
        del model, base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--official', type=Path, default=None,
                        help='checkout of xxxnell/how-do-vits-work: compare with its AlterNet')
    parser.add_argument('--channels-last', action='store_true', help='with --official: also time channels-last')
    parser.add_argument('--keep-format', action='store_true',
                        help='with --official: also time ours with channels_last=False (trunk in the given format)')
    parser.add_argument('--configs', nargs='+', choices=('cifar', 'imagenet'), default=('cifar', 'imagenet'),
                        help='with --official: which of the two configurations to time')
    parser.add_argument('--fixed-small-map-rule', action='store_true',
                        help='no per-shape timing of the small-map routes (SmallMapConv2d): the fixed rule')
    parser.add_argument('--cifar-batch', type=int, default=32)
    parser.add_argument('--imagenet-batch', type=int, default=None, help='default: 8 with --official, else 4')
    parser.add_argument('--reps', type=int, default=None, help='default: 7 with --official, else 5')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=None, help='torch CPU threads (default: 2 with --official)')
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    official = args.official is not None
    args.imagenet_batch = args.imagenet_batch or (8 if official else 4)
    args.reps = args.reps or (7 if official else 5)
    threads = args.threads or (2 if official else None)
    if threads:
        torch.set_num_threads(threads)
    device = torch.device(args.device)
    if args.fixed_small_map_rule:
        set_small_map_autotune(False)
    torch.manual_seed(0)
    if official:
        compare_with_official(args, device)
    else:
        compare_with_baselines(args, device)


if __name__ == '__main__':
    main()
