"""Cost of the Scaled-ReLU conv stem: ViT_c (vit_*_convstem) next to timm's patchify ViT, side by side.

Prints the train-step throughput (forward + backward + AdamW, interleaved repeats, median) of each pair
and its ratio, and the MACs per 224x224 image counted by torch's FlopCounterMode (FLOPs / 2). The stem
adds about +1.0 GMAC whatever the width (the three 64-channel convs at 112x112), so the relative
cost is largest for ViT-Ti. There is no pass/fail target: the paper accepts this cost for 79.8 -> 81.9.

    python benchmarks/bench_convstem.py [--batch-size 8] [--reps 5] [--models small] [--device cpu]
"""
import argparse

import timm
import torch
from timing import imagenet_batch, interleaved_median_seconds, train_step
from torch.utils.flop_counter import FlopCounterMode

import timm_ext  # noqa: F401

PAIRS = {
    'tiny': ('vit_tiny_convstem', 'vit_tiny_patch16_224'),
    'small': ('vit_small_convstem', 'vit_small_patch16_224'),
    'base': ('vit_base_convstem', 'vit_base_patch16_224'),
}


def gmacs(model: torch.nn.Module, img_size: int = 224, in_chans: int = 3) -> float:
    """Multiply-accumulates of one forward pass of one image, in G (matmul/conv/attention counted)."""
    x = torch.randn(1, in_chans, img_size, img_size, device=next(model.parameters()).device)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops() / 2 / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--reps', type=int, default=5)
    parser.add_argument('--models', nargs='+', choices=list(PAIRS), default=['small'])
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    device = torch.device(args.device)
    x, y = imagenet_batch(args.batch_size, device)
    print(f'device={device} threads={torch.get_num_threads()} batch={args.batch_size} reps={args.reps} img=224')
    print(f'{"model":<20} {"params":>12} {"GMACs":>7} {"train img/s":>12}   '
          f'{"vs base":<22} {"params":>12} {"GMACs":>7} {"train img/s":>12} {"ratio":>6} {"dGMACs":>7}')
    for key in args.models:
        names = dict(zip(('convstem', 'base'), PAIRS[key]))
        models = {k: timm.create_model(n).to(device).train() for k, n in names.items()}
        opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
        macs = {k: gmacs(m.eval()) for k, m in models.items()}
        conv_macs = gmacs(models['convstem'].patch_embed.conv)  # the three 64-channel convs alone
        params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
        for m in models.values():
            m.train()
        secs = interleaved_median_seconds(
            {k: train_step(models[k], opts[k], x, y) for k in models}, device, warmup=1, reps=args.reps)
        ips = {k: args.batch_size / s for k, s in secs.items()}
        print(f'{names["convstem"]:<20} {params["convstem"]:>12,} {macs["convstem"]:>7.3f} {ips["convstem"]:>12.2f}   '
              f'{names["base"]:<22} {params["base"]:>12,} {macs["base"]:>7.3f} {ips["base"]:>12.2f} '
              f'{ips["convstem"] / ips["base"]:>6.3f} {macs["convstem"] - macs["base"]:>+7.3f}')
        print(f'  {"":<18} of the +{macs["convstem"] - macs["base"]:.3f} GMACs: 3 convs {conv_macs:.3f} (any width), '
              f'proj 64->D k8 vs 3->D k16 {macs["convstem"] - macs["base"] - conv_macs:+.3f}')


if __name__ == '__main__':
    main()
