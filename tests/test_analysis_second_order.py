"""The second-order-friendly GELU, LayerNorm, conv and eval BatchNorm of the Hessian context: first and second
derivatives against torch's own (gradcheck / gradgradcheck in float64), Hessian-vector products of whole models
equal with and without them, repeated products (cached factors) equal, and the swap undone on exit."""
import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import BatchNormAct2d, LayerNorm2d

import timm_ext  # noqa: F401
from timm_ext.analysis._hooks import math_attention
from timm_ext.analysis._second_order import (
    batch_norm_eval,
    conv2d,
    gelu,
    layer_norm,
    second_order_activations,
)
from timm_ext.analysis.hessian import HessianOperator, hessian_context

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

f64 = dict(dtype=torch.float64)


def _leaf(*shape, scale=1.0, shift=0.0):
    return (shift + scale * torch.randn(*shape, **f64)).requires_grad_()


def test_gelu_matches_torch_and_has_a_correct_second_derivative():
    torch.manual_seed(0)
    x = _leaf(4, 6, scale=2.0)
    torch.testing.assert_close(gelu(x), F.gelu(x), rtol=0, atol=0)
    assert torch.autograd.gradcheck(gelu, (x,)) and torch.autograd.gradgradcheck(gelu, (x,))


@pytest.mark.parametrize('affine', ['weight_bias', 'weight', 'none'])
@pytest.mark.parametrize('shape', [[6], [3, 6]], ids=['last_dim', 'last_two_dims'])
def test_layer_norm_matches_torch_and_has_a_correct_second_derivative(affine, shape):
    torch.manual_seed(1)
    x = _leaf(2, 3, 6, scale=1.5, shift=0.3)
    w = _leaf(*shape, scale=0.3, shift=1.0) if affine != 'none' else None
    b = _leaf(*shape, scale=0.1) if affine == 'weight_bias' else None
    torch.testing.assert_close(layer_norm(x, shape, w, b, 1e-5), F.layer_norm(x, shape, w, b, 1e-5))
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def fn(*args):
        it = iter(args[1:])
        return layer_norm(args[0], shape, next(it) if w is not None else None, next(it) if b is not None else None)

    assert torch.autograd.gradcheck(fn, inputs) and torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize('kernel, stride, padding, dilation, groups, bias, side', [
    (3, 1, 1, 1, 1, True, 6), (3, 2, 1, 1, 1, False, 7), (1, 2, 0, 1, 1, False, 5), (3, 1, 2, 2, 2, True, 6),
    (7, 2, 3, 1, 1, False, 9),
])
def test_conv2d_matches_torch_and_has_a_correct_second_derivative(kernel, stride, padding, dilation, groups, bias,
                                                                  side):
    torch.manual_seed(2)
    x = _leaf(2, 4, side, side)
    w = _leaf(6, 4 // groups, kernel, kernel)
    b = _leaf(6) if bias else None
    torch.testing.assert_close(
        conv2d(x, w, b, stride, padding, dilation, groups), F.conv2d(x, w, b, stride, padding, dilation, groups))
    inputs = (x, w, b) if bias else (x, w)
    def fn(x, w, b=None):
        return conv2d(x, w, b, stride, padding, dilation, groups)

    assert torch.autograd.gradcheck(fn, inputs) and torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize('affine', [True, False])
def test_eval_batch_norm_matches_torch_and_has_a_correct_second_derivative(affine):
    torch.manual_seed(3)
    x = _leaf(2, 3, 4, 5)
    mean, var = torch.randn(3, **f64), torch.rand(3, **f64) + 0.5
    w, b = (_leaf(3, shift=1.0), _leaf(3)) if affine else (None, None)
    torch.testing.assert_close(
        batch_norm_eval(x, mean, var, w, b, 1e-3), F.batch_norm(x, mean, var, w, b, False, 0.0, 1e-3))
    inputs = (x, w, b) if affine else (x,)
    def fn(x, w=None, b=None):
        return batch_norm_eval(x, mean, var, w, b, 1e-3)

    assert torch.autograd.gradcheck(fn, inputs) and torch.autograd.gradgradcheck(fn, inputs)


def _models():
    yield 'vit', timm.create_model(
        'vit_tiny_patch16_224', img_size=8, patch_size=4, depth=2, embed_dim=8, num_heads=2, num_classes=3), 8
    yield 'resnet', timm.create_model('resnet18', num_classes=3), 32
    yield 'alternet', timm.create_model(
        'alternet_50_cifar', layers=(1, 2, 2, 2), msa_blocks=(0, 1, 1, 1), channels=(16, 32, 64, 64),
        num_heads=(1, 1, 1, 1), head_dim=8, stem_chs=8, num_classes=3), 16


def _randomise_norm_statistics(model: nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 1.5)


@pytest.mark.parametrize('name, model, side', list(_models()), ids=lambda v: v if isinstance(v, str) else '')
def test_model_hvps_equal_torch_double_backward(name, model, side):
    """The same Hessian-vector products (float64) with the swapped modules as with torch's own double backward,
    for a first and a repeated product on one cached graph."""
    torch.manual_seed(4)
    model = model.double().eval()
    _randomise_norm_statistics(model)
    x, y = torch.randn(3, 3, side, side, **f64), torch.tensor([0, 1, 2])
    params = list(model.parameters())
    vs = [[torch.randn_like(p) for p in params] for _ in range(2)]

    def products(swap: bool):
        context = hessian_context(model) if swap else math_attention(model)  # the latter: torch's double backward
        with context:
            assert any('forward' in m.__dict__ for m in model.modules()) == swap
            op = HessianOperator(model, F.cross_entropy, (x, y))
            return [torch.cat([h.flatten() for h in op(v)]) for v in vs]

    ours, theirs = products(True), products(False)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * float(b.abs().max()))
    assert not torch.equal(ours[0], ours[1])


def test_swap_covers_the_right_modules_and_is_undone():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), BatchNormAct2d(4, act_layer='gelu'),
        nn.Conv2d(4, 4, 3, padding='same'), LayerNorm2d(4), nn.GELU(approximate='tanh'), nn.Flatten(),
        nn.LayerNorm(64), nn.GELU())
    swapped = {0, 1, 2, 7, 8}
    x = torch.randn(2, 3, 4, 4)
    before = model(x)
    with second_order_activations(model):
        for i, m in enumerate(model):
            assert ('forward' in m.__dict__) == (i in swapped), (i, m)
        torch.testing.assert_close(model(x), before)
        model.train()  # batch statistics: BatchNorm takes torch's own path
        train_out = model(x)
        model.eval()
    assert not any('forward' in m.__dict__ for m in model.modules())
    model.train()
    torch.testing.assert_close(model(x), train_out)


def test_triple_backward_is_refused():
    """The cached factors hold for second derivatives only: a third derivative raises instead of being wrong."""
    x = _leaf(3)
    (g,) = torch.autograd.grad(gelu(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(h.sum(), x)
