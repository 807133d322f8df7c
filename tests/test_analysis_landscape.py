"""Filter-normalised loss landscapes (Li et al. 2018): the directions, the origin, and exact restoration."""
import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F

from timm_ext.analysis.landscape import filter_normalized_direction, loss_landscape_1d, loss_landscape_2d

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def tiny_vit():
    return timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, depth=1, embed_dim=16, num_heads=2,
                             num_classes=3)


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 0])


def test_direction_is_filter_normalised_and_skips_bias_norm_and_positions():
    model = tiny_vit()
    direction = filter_normalized_direction(model, seed=1)
    for (name, p), d in zip(model.named_parameters(), direction):
        assert d.shape == p.shape
        if p.ndim <= 1 or 'pos_embed' in name:
            assert not d.any(), name
        else:
            torch.testing.assert_close(d.flatten(1).norm(dim=1), p.detach().flatten(1).norm(dim=1))
    again = filter_normalized_direction(model, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(direction, again))


def test_landscape_at_origin_is_the_loss_and_weights_are_restored():
    model, (x, y) = tiny_vit(), batch()
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        loss = float(F.cross_entropy(model.eval()(x), y))
    model.train()
    one = loss_landscape_1d(model, F.cross_entropy, (x, y), steps=5, span=0.5)
    torch.testing.assert_close(one['alpha'], torch.tensor([-0.5, -0.25, 0.0, 0.25, 0.5], dtype=torch.float64))
    assert float(one['loss'][2]) == loss
    two = loss_landscape_2d(model, F.cross_entropy, (x, y), steps=3)
    assert two['loss'].shape == (3, 3) and float(two['loss'][1, 1]) == loss
    assert float(one['loss'][0]) != loss  # moving along the direction changes the loss
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert model.training


def test_points_off_origin_are_w_plus_alpha_d():
    model = nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
    direction = [torch.ones(2, 3), torch.zeros(2)]
    out = loss_landscape_1d(model, F.cross_entropy, (x, y), steps=3, span=2.0, direction=direction)
    with torch.no_grad():
        expected = F.cross_entropy(x @ (model.weight + 2.0).T + model.bias, y)
    assert float(out['loss'][-1]) == pytest.approx(float(expected), rel=1e-6)
    reg = loss_landscape_1d(model, F.cross_entropy, (x, y), steps=3, direction=direction, weight_decay=0.1)
    l2 = sum(float(p.detach().pow(2).sum()) for p in model.parameters())
    assert float(reg['loss'][1]) == pytest.approx(float(out['loss'][1]) + 0.05 * l2, rel=1e-6)


def test_bad_arguments():
    model, b = nn.Linear(3, 2), (torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match='steps must be an int >= 2, got 1'):
        loss_landscape_1d(model, F.cross_entropy, b, steps=1)
    with pytest.raises(ValueError, match='span must be > 0, got 0'):
        loss_landscape_2d(model, F.cross_entropy, b, span=0)
    with pytest.raises(ValueError, match='one tensor per model parameter'):
        loss_landscape_1d(model, F.cross_entropy, b, direction=[torch.zeros(2, 3)])
