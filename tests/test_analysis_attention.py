"""Attention entropy and distance (timm_ext.analysis.attention) against hand-made maps and timm's own maps."""
import math

import pytest
import timm
import torch
from timm.utils import AttentionExtract

import timm_ext  # noqa: F401 (registers the CB models)
from timm_ext.analysis.attention import (
    attention_distance,
    attention_entropy,
    attention_modules,
    attention_probs,
    attention_stats,
    entropy_per_query,
    grid_distances,
    head_distances,
)

TINY = dict(img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2, num_classes=10)


def tiny_vit(name='vit_tiny_patch16_224', **kwargs):
    return timm.create_model(name, **dict(TINY, **kwargs)).eval()


def test_entropy_of_hand_made_rows():
    attn = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]])
    expected = [0.0, math.log(4), math.log(2), -(0.7 * math.log(0.7) + 3 * 0.1 * math.log(0.1))]
    torch.testing.assert_close(entropy_per_query(attn), torch.tensor(expected), rtol=0, atol=1e-6)


def test_grid_distances_are_l1_over_side():
    d = grid_distances(2)  # cells (0,0) (0,1) (1,0) (1,1), coordinates / 2
    expected = torch.tensor([[0, .5, .5, 1], [.5, 0, 1, .5], [.5, 1, 0, .5], [1, .5, .5, 0]])
    torch.testing.assert_close(d, expected)


def test_distance_of_hand_made_maps():
    prefix = 1
    n = 1 + 4  # class token + 2x2 patches
    uniform = torch.full((1, 1, n, n), 1.0 / n)
    # to the other patches: two neighbours at 0.5 and the opposite corner at 1.0, self and class token excluded
    torch.testing.assert_close(head_distances(uniform, prefix), torch.tensor([[2.0 / 3.0]]))
    corner = torch.zeros(1, 1, n, n)
    corner[..., 1:, 1:] = torch.eye(4).flip(1)  # every patch attends only to the opposite corner
    torch.testing.assert_close(head_distances(corner, prefix), torch.tensor([[1.0]]))


def test_uniform_attention_gives_log_n_and_grid_distance():
    model = tiny_vit()
    for m in attention_modules(model):
        torch.nn.init.zeros_(m.qkv.weight)  # q = k = 0: every row of the map is uniform over N = 17 tokens
    stats = attention_stats(model, torch.randn(3, 3, 16, 16))
    torch.testing.assert_close(stats['entropy'], torch.full((2, 2), math.log(17)))
    torch.testing.assert_close(stats['max_entropy'], torch.full((2,), math.log(17)))
    d = grid_distances(4)
    torch.testing.assert_close(stats['distance'], torch.full((2, 2), float(d.sum() / (16 * 15))))


def test_hook_maps_equal_timm_explicit_maps_with_fused_attention_on():
    model = tiny_vit()
    x = torch.randn(2, 3, 16, 16)
    modules = attention_modules(model)
    assert all(m.fused_attn for m in modules) or not timm.layers.use_fused_attn()
    captured = []
    handles = [m.register_forward_hook(lambda mod, args, out: captured.append(attention_probs(mod, args[0])))
               for m in modules]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    for m in modules:
        m.fused_attn = False
    reference = AttentionExtract(model, method='hook')(x)  # timm's softmax output, explicit path
    for ours, theirs in zip(captured, reference.values()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_fused_and_explicit_paths_give_the_same_statistics():
    model = tiny_vit()
    x = torch.randn(2, 3, 16, 16)
    fused = attention_stats(model, x)
    for m in attention_modules(model):
        m.fused_attn = False
    explicit = attention_stats(model, x)
    for key in fused:
        torch.testing.assert_close(fused[key], explicit[key])


def test_entropy_shape_batches_and_queries():
    model = tiny_vit('vit_tiny_cb', num_heads=4)
    x = torch.randn(4, 3, 16, 16)
    whole = attention_entropy(model, x)
    assert whole.shape == (2, 4)
    torch.testing.assert_close(attention_entropy(model, [x[:1], x[1:]]), whole)  # image-weighted over batches
    cls = attention_entropy(model, x, queries='cls')
    patches = attention_entropy(model, x, queries='patches')
    torch.testing.assert_close(whole, (cls + 16 * patches) / 17)
    assert attention_distance(model, x).shape == (2, 4)
    assert (whole <= math.log(17) + 1e-5).all()


def test_model_is_left_as_found():
    model = tiny_vit().train()
    attention_stats(model, torch.randn(2, 3, 16, 16))
    assert model.training and all(m.training for m in model.modules())
    assert not any(m._forward_hooks for m in model.modules())


def test_bad_input_messages():
    with pytest.raises(ValueError, match=r"queries must be one of all, cls, patches, got 'first'"):
        attention_stats(tiny_vit(), torch.randn(1, 3, 16, 16), queries='first')
    with pytest.raises(ValueError, match='has no timm.layers.Attention module'):
        attention_entropy(timm.create_model('resnet10t', num_classes=2), torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match="queries='cls' needs a class token"):
        attention_entropy(tiny_vit(class_token=False, global_pool='avg'), torch.randn(1, 3, 16, 16), queries='cls')
