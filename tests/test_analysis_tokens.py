"""Token cosine similarity (scaled-ReLU paper Eq. 5) against a loop over token pairs."""
import pytest
import timm
import torch

from timm_ext.analysis.tokens import cosine_similarity_tokens, token_cosine_similarity

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

TINY = dict(img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2, num_classes=10)


def eq5_loop(tokens):
    n = tokens.shape[0]
    total = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                total += float(tokens[i] @ tokens[j] / (tokens[i].norm() * tokens[j].norm()))
    return total / (n * (n - 1))


def test_matches_the_pairwise_definition():
    x = torch.randn(3, 7, 5)
    got = cosine_similarity_tokens(x)
    expected = torch.tensor([eq5_loop(x[b]) for b in range(3)])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_identical_and_opposite_tokens():
    same = torch.ones(1, 4, 3)
    torch.testing.assert_close(cosine_similarity_tokens(same), torch.tensor([1.0]))
    pair = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    torch.testing.assert_close(cosine_similarity_tokens(pair), torch.tensor([-1.0]))


def test_vit_reading_points_and_values():
    model = timm.create_model('vit_tiny_patch16_224', **TINY).eval()
    x = torch.randn(2, 3, 16, 16)
    got = token_cosine_similarity(model, x)
    assert list(got) == ['patch_embed', 'pos_embed', 'blocks.0', 'blocks.1']
    with torch.no_grad():
        patches = model.patch_embed(x)
        embedded = model.norm_pre(model.patch_drop(model._pos_embed(patches)))
        block0 = model.blocks[0](embedded)
    assert abs(got['patch_embed'] - float(cosine_similarity_tokens(patches).mean())) < 1e-6
    assert abs(got['pos_embed'] - float(cosine_similarity_tokens(embedded[:, 1:]).mean())) < 1e-6
    assert abs(got['blocks.0'] - float(cosine_similarity_tokens(block0[:, 1:]).mean())) < 1e-6
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_bad_shapes_are_refused():
    import pytest
    with pytest.raises(ValueError, match=r'expected \(B, n, C\) tokens with n >= 2, got shape \(2, 1, 4\)'):
        cosine_similarity_tokens(torch.randn(2, 1, 4))
    with pytest.raises(ValueError, match='is not a timm ViT'):
        token_cosine_similarity(timm.create_model('resnet10t', num_classes=2), torch.randn(1, 3, 16, 16))
