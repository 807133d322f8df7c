"""Train-step throughput of AlterNet next to its pre-activation ResNet baselines, measured side by side.

The paper (App. E) reports Alter-ResNet-50 20% faster than the pre-activation ResNet-50 on CIFAR-100
on a GPU (473 vs ~394 img/s). Pairs, each timed interleaved (A, B, A, B, ...), median of repeats:

  * alternet_50_cifar  vs alternet_50_nomsa_cifar (the paper's baseline), 32 x 32, 100 classes;
  * alternet_50        vs timm's resnetv2_50 (pre-activation ResNet-50, 3-4-6-3, BatchNorm), 224 x 224.

A train step is forward + cross-entropy + backward + AdamW step. Ratio = AlterNet img/s / baseline img/s.

    python benchmarks/bench_alternet.py [--cifar-batch 32] [--imagenet-batch 4] [--reps 5] [--device cpu]
"""
import argparse

import timm
import torch
from _timing import interleaved_median_seconds, train_step

import timm_ext  # noqa: F401

PAIRS = [  # (model, baseline, image size, batch-size argument)
    ('alternet_50_cifar', 'alternet_50_nomsa_cifar', 32, 'cifar_batch'),
    ('alternet_50', 'resnetv2_50', 224, 'imagenet_batch'),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--cifar-batch', type=int, default=32)
    parser.add_argument('--imagenet-batch', type=int, default=4)
    parser.add_argument('--reps', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
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


if __name__ == '__main__':
    main()
