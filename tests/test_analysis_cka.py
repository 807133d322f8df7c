"""Mini-batch linear CKA (Nguyen et al. 2021): the unbiased HSIC against its U-statistic, CKA's invariances."""
import itertools

import pytest
import timm
import torch

from timm_ext.analysis.cka import MinibatchCKA, cka, cka_matrix, hsic_unbiased, linear_kernel

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def hsic_u_statistic(k, l):  # noqa: E741
    """Song et al.'s HSIC_1 as the U-statistic over ordered 4-tuples of distinct indices (the definition)."""
    n = k.shape[0]
    total = 0.0
    for i, j, q, r in itertools.permutations(range(n), 4):
        total += float(k[i, j] * l[i, j] + k[i, j] * l[q, r] - 2 * k[i, j] * l[i, q])
    return total / (n * (n - 1) * (n - 2) * (n - 3))


def test_unbiased_hsic_equals_its_u_statistic():
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    k, l = linear_kernel(x), linear_kernel(y)  # noqa: E741
    assert float(hsic_unbiased(k, l)) == pytest.approx(hsic_u_statistic(k, l), rel=1e-9)


def test_cka_of_a_representation_with_itself_is_one():
    x = torch.randn(10, 7)
    assert cka(x, x) == pytest.approx(1.0)


def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scaling():
    x, y = torch.randn(12, 6, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    base = cka(x, y)
    assert cka(x @ q, y) == pytest.approx(base, rel=1e-9)
    assert cka(3.7 * x, 0.2 * y) == pytest.approx(base, rel=1e-9)
    assert cka(x @ q, x) == pytest.approx(1.0, rel=1e-9)
    assert cka(x, x + torch.randn(12, 6, dtype=torch.float64)) < 0.99  # and it is not always one


def test_minibatch_accumulation_is_a_ratio_of_summed_hsic():
    xs = [torch.randn(5, 3, dtype=torch.float64) for _ in range(3)]
    ys = [torch.randn(5, 2, dtype=torch.float64) for _ in range(3)]
    acc = MinibatchCKA(1, 1)
    for x, y in zip(xs, ys):
        acc.update([x], [y])
    hxy = sum(float(hsic_unbiased(linear_kernel(x), linear_kernel(y))) for x, y in zip(xs, ys))
    hxx = sum(float(hsic_unbiased(linear_kernel(x), linear_kernel(x))) for x in xs)
    hyy = sum(float(hsic_unbiased(linear_kernel(y), linear_kernel(y))) for y in ys)
    assert float(acc.compute()[0, 0]) == pytest.approx(hxy / (hxx * hyy) ** 0.5, rel=1e-9)


def test_layer_matrix_of_one_and_two_models():
    kw = dict(img_size=16, patch_size=4, depth=2, embed_dim=16, num_heads=2, num_classes=3)
    a = timm.create_model('vit_tiny_patch16_224', **kw)
    b = timm.create_model('vit_tiny_patch16_224', **kw)
    images = [torch.randn(6, 3, 16, 16) for _ in range(2)]
    self_sim = cka_matrix(a, images)
    m = self_sim['cka']
    assert m.shape == (5, 5) and self_sim['layers'][0] == 'patch_embed'
    torch.testing.assert_close(m.diagonal(), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(m, m.T)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(cka_matrix(a, images, other=b)['cka'], m)
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in a.modules())


def test_small_batches_are_refused():
    with pytest.raises(ValueError, match='at least 4 examples, got 3'):
        cka(torch.randn(3, 2), torch.randn(3, 2))
