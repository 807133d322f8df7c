"""Throughput of Context Broadcasting ViTs next to their timm base models, measured side by side.

CB is O(N*C) next to O(N*C^2) transformer blocks, so the target ratio (CB / base throughput) is
>= 0.99 for both the train step (forward + backward + AdamW) and inference. A second, identical
copy of the base model is timed in the same interleaved loop: its ratio to the base ("A/A") is the
noise floor of the run; a CB ratio within it is indistinguishable from 1.

    python benchmarks/bench_cb.py [--batch-size 16] [--reps 7] [--device cpu]
"""
import argparse

import timm
import torch
from timing import imagenet_batch, inference_step, interleaved_median_seconds, train_step

import timm_ext  # noqa: F401

PAIRS = [('vit_tiny_cb_all', 'vit_tiny_patch16_224'), ('vit_small_cb_all', 'vit_small_patch16_224'),
         ('vit_small_cb', 'vit_small_patch16_224')]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--reps', type=int, default=7)
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    device = torch.device(args.device)
    x, y = imagenet_batch(args.batch_size, device)
    print(f'device={device} threads={torch.get_num_threads()} batch={args.batch_size} reps={args.reps}')
    print(f'{"model":<18} {"base":<22} {"train img/s":>14} {"ratio":>6} {"A/A":>6} '
          f'{"infer img/s":>14} {"ratio":>6} {"A/A":>6}')
    for cb_name, base_name in PAIRS:
        models = {'cb': timm.create_model(cb_name).to(device)}
        models['base'] = timm.create_model(base_name).to(device)
        models['base_again'] = timm.create_model(base_name).to(device)
        for m in models.values():
            m.load_state_dict(models['cb'].state_dict())
        train = interleaved_median_seconds({
            k: train_step(m.train(), torch.optim.AdamW(m.parameters()), x, y) for k, m in models.items()
        }, device, reps=args.reps)
        infer = interleaved_median_seconds(
            {k: inference_step(m.eval(), x) for k, m in models.items()}, device, reps=3 * args.reps)
        bs = args.batch_size
        print(f'{cb_name:<18} {base_name:<22} '
              f'{bs / train["cb"]:>6.1f} /{bs / train["base"]:>6.1f} {train["base"] / train["cb"]:>6.3f} '
              f'{train["base"] / train["base_again"]:>6.3f} '
              f'{bs / infer["cb"]:>6.1f} /{bs / infer["base"]:>6.1f} {infer["base"] / infer["cb"]:>6.3f} '
              f'{infer["base"] / infer["base_again"]:>6.3f}')


if __name__ == '__main__':
    main()
