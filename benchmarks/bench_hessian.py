"""Cost of one Hessian-vector product vs a forward+backward of the same batch, side by side in one run.

Target (issue 12): one HVP <= 2.5x a forward+backward. Measured, interleaved (median of repeats):

* ``fwd+bwd``: forward, cross-entropy, backward, as a training step computes its gradient (timm's default
  attention path, fused where timm uses it);
* ``fwd+bwd (math)``: the same inside ``hessian_context`` (the math attention path the HVPs must use, no
  fused kernels; the layers of :mod:`timm_ext.analysis._second_order`);
* ``hvp``: one product as power iteration / Lanczos / Hutchinson make it on one batch
  (:class:`timm_ext.analysis.hessian.HessianOperator`: the gradient graph is built once, each product is
  one double backward);
* ``hvp (cold)``: a product that also rebuilds the gradient graph (forward + create_graph backward +
  double backward), what each product costs when the loss spans several batches;
* ``hvp (torch)``: a warm product with torch's own double backward of GELU, LayerNorm, Conv2d and
  BatchNorm (the math attention path only, without :mod:`timm_ext.analysis._second_order`).

Run from the repo root: ``python benchmarks/bench_hessian.py [--model vit_tiny_patch16_224] [--batch-size 16]``.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import timm  # noqa: E402
from timing import interleaved_median_seconds  # noqa: E402

import timm_ext  # noqa: E402,F401
from timm_ext.analysis import math_attention  # noqa: E402
from timm_ext.analysis.hessian import HessianOperator, hessian_context  # noqa: E402

# the demo's ViT shrunk to 32 px digits (timm_ext.demo.MODEL_KWARGS)
DEFAULT_KWARGS = dict(img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='vit_tiny_patch16_224')
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--img-size', type=int, default=32)
    parser.add_argument('--reps', type=int, default=7)
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()

    device = torch.device(args.device)
    kwargs = dict(DEFAULT_KWARGS, img_size=args.img_size) if args.model.startswith('vit') else {}
    model = timm.create_model(args.model, num_classes=10, **kwargs).to(device).eval()
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    v = [torch.randn_like(p) for p in params]

    def fwd_bwd() -> None:
        torch.autograd.grad(F.cross_entropy(model(x), y), params)

    def fwd_bwd_math() -> None:
        with hessian_context(model):
            fwd_bwd()

    with hessian_context(model):
        warm = HessianOperator(model, F.cross_entropy, (x, y))
        warm(v)  # builds and caches the gradient graph (on the math path)

    def hvp() -> None:
        with hessian_context(model):
            warm(v)

    with math_attention(model):
        plain = HessianOperator(model, F.cross_entropy, (x, y))
        plain(v)

    def hvp_torch() -> None:
        with math_attention(model):
            plain(v)

    def hvp_cold() -> None:
        with hessian_context(model):
            HessianOperator(model, F.cross_entropy, (x, y))(v)

    times = interleaved_median_seconds(
        {'fwd+bwd': fwd_bwd, 'fwd+bwd (math)': fwd_bwd_math, 'hvp': hvp, 'hvp (cold)': hvp_cold,
         'hvp (torch)': hvp_torch}, device,
        reps=args.reps)

    n_params = sum(p.numel() for p in params)
    print(f'{args.model} ({n_params / 1e6:.2f} M params), batch {args.batch_size} x {args.img_size} px, {device}, '
          f'{torch.get_num_threads()} threads, median of {args.reps}')
    for name in ('fwd+bwd', 'fwd+bwd (math)', 'hvp', 'hvp (cold)', 'hvp (torch)'):
        print(f'  {name:16s} {times[name] * 1e3:8.1f} ms   {times[name] / times["fwd+bwd"]:5.2f}x fwd+bwd')
    ratio = times['hvp'] / times['fwd+bwd']
    print(f'hvp / fwd+bwd = {ratio:.2f} (target <= 2.5): {"ok" if ratio <= 2.5 else "MISSED"}')


if __name__ == '__main__':
    main()
