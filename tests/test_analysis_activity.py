"""Fraction of active neurons (SAM paper Fig. 2) against a direct count."""
import pytest
import timm
import torch
import torch.nn as nn

from timm_ext.analysis.activity import active_neuron_fraction

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def test_counts_positive_outputs_of_each_activation():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 5), nn.GELU())
    x = torch.randn(10, 3)
    with torch.no_grad():
        h1 = model[1](model[0](x))
        h2 = model[3](model[2](h1))
    got = active_neuron_fraction(model, [x[:4], x[4:]])
    assert list(got) == ['1', '3']
    assert got['1'] == pytest.approx(float((h1 > 0).float().mean()))
    assert got['3'] == pytest.approx(float((h2 > 0).float().mean()))
    assert not any(m._forward_hooks for m in model.modules())


def test_vit_mlp_activations_and_all_negative_inputs():
    model = timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, depth=2, embed_dim=16, num_heads=2,
                              num_classes=3)
    got = active_neuron_fraction(model, torch.randn(2, 3, 16, 16))
    assert list(got) == ['blocks.0.mlp.act', 'blocks.1.mlp.act']
    for block in model.blocks:
        nn.init.zeros_(block.mlp.fc1.weight)
        nn.init.constant_(block.mlp.fc1.bias, -1.0)  # GELU(-1) < 0: nothing is active
    assert all(v == 0.0 for v in active_neuron_fraction(model, torch.randn(2, 3, 16, 16)).values())


def test_model_without_activation_modules():
    with pytest.raises(ValueError, match='has no GELU/ReLU module'):
        active_neuron_fraction(nn.Linear(2, 2), torch.randn(1, 2))
