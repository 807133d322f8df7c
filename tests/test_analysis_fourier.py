"""Fourier delta log amplitude and feature-map variance against signals with known spectra and hand computations."""
import math

import pytest
import timm
import torch

import timm_ext  # noqa: F401 (registers AlterNet)
from timm_ext.analysis.fourier import (
    delta_log_amplitude,
    feature_map_variance,
    feature_variance_per_block,
    fourier_per_block,
    normalized_frequencies,
)

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

EPS = 1e-6


def test_checkerboard_has_its_energy_at_pi():
    side, a, b = 8, 2.0, 0.5
    idx = torch.arange(side)
    sign = (-1.0) ** (idx[:, None] + idx[None, :])
    x = (a + b * sign).expand(2, 3, side, side)  # DC amplitude a * side^2, amplitude b * side^2 at (pi, pi)
    delta = delta_log_amplitude(x)
    assert delta.shape == (side // 2 + 1,)
    assert float(delta[0]) == 0.0
    assert float(delta[-1]) == pytest.approx(math.log(b * 64 + EPS) - math.log(a * 64 + EPS), abs=1e-5)
    assert float(delta[1]) == pytest.approx(math.log(EPS) - math.log(a * 64 + EPS), abs=1e-3)  # nothing in between
    torch.testing.assert_close(normalized_frequencies(side), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))


def test_diagonal_cosine_lands_in_its_bin():
    side, k0 = 16, 3
    idx = torch.arange(side, dtype=torch.float64)
    x = 1.0 + torch.cos(2 * math.pi * k0 * (idx[:, None] + idx[None, :]) / side)
    delta = delta_log_amplitude(x[None, None])
    # |F(k0, k0)| = side^2 / 2 (half of the cosine at +k0, half at -k0); DC: side^2
    assert float(delta[k0]) == pytest.approx(math.log(side ** 2 / 2 + EPS) - math.log(side ** 2 + EPS), abs=1e-5)
    others = torch.cat([delta[1:k0], delta[k0 + 1:]])
    assert float(others.max()) < -10  # amplitude ~0 elsewhere on the diagonal


def test_variance_is_the_spatial_variance_averaged():
    x = torch.randn(3, 4, 5, 6)
    expected = sum(float(x[b, c].flatten().var()) for b in range(3) for c in range(4)) / 12
    assert float(feature_map_variance(x)) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match=r'expected a \(B, C, H, W\) feature map, got shape \(3, 4\)'):
        feature_map_variance(torch.randn(3, 4))


def test_vit_points_split_msa_and_mlp():
    model = timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2,
                              num_classes=10).eval()
    x = torch.randn(3, 3, 16, 16)
    variance = feature_variance_per_block(model, x)
    assert list(variance) == ['patch_embed', 'blocks.0.msa', 'blocks.0.mlp', 'blocks.1.msa', 'blocks.1.mlp']
    with torch.no_grad():
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        block = model.blocks[0]
        after_msa = tokens + block.ls1(block.attn(block.norm1(tokens)))
        after_mlp = after_msa + block.ls2(block.mlp(block.norm2(after_msa)))

    def as_map(t):
        return t[:, 1:].transpose(1, 2).reshape(3, 32, 4, 4)

    assert variance['blocks.0.msa'] == pytest.approx(float(feature_map_variance(as_map(after_msa))), rel=1e-5)
    assert variance['blocks.0.mlp'] == pytest.approx(float(feature_map_variance(as_map(after_mlp))), rel=1e-5)
    fourier = fourier_per_block(model, [x[:1], x[1:]])  # image-weighted over batches
    torch.testing.assert_close(fourier['blocks.0.mlp'], delta_log_amplitude(as_map(after_mlp)), rtol=1e-5,
                               atol=1e-5)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_alternet_points_and_kinds():
    from timm_ext.analysis._hooks import feature_points

    model = timm.create_model('alternet_18_cifar', num_classes=10, channels=(8, 16, 32, 64), num_heads=(1, 1, 1, 1),
                              head_dim=8, stem_chs=8)
    kinds = [p.kind for p in feature_points(model).values()]
    assert kinds == ['stem', 'conv', 'conv', 'conv', 'msa', 'conv', 'msa', 'conv', 'msa']
    out = fourier_per_block(model, torch.randn(2, 3, 16, 16))
    assert out['stages.3.blocks.1'].shape == (2,)  # a 2x2 map: frequencies 0 and pi


def test_named_modules_and_bad_names():
    model = timm.create_model('resnet10t', num_classes=2)
    out = feature_variance_per_block(model, torch.randn(2, 3, 64, 64), modules=['layer1', 'layer4'])
    assert list(out) == ['layer1', 'layer4']
    with pytest.raises(ValueError, match="has no module 'layer9'"):
        feature_variance_per_block(model, torch.randn(2, 3, 64, 64), modules=['layer9'])
