"""Hessian eigenvalues, trace, density and weight-noise loss against the exact Hessian of a tiny MLP."""
import math

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from timm_ext.analysis.hessian import (
    HessianOperator,
    hessian_context,
    hessian_lambda_max,
    hessian_max_eigenvalue_spectrum,
    hessian_spectrum_density,
    hessian_top_eigenvalues,
    hessian_trace,
    nep_ape,
    noisy_loss,
    spectrum_density_on_grid,
)

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def tiny_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def data(n=16, seed=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def exact_hessian(model, x, y, weight_decay=0.0):
    """torch.autograd.functional.hessian of the (l2-regularised) loss over the flattened parameters."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])

    def loss(w):
        params, i = {}, 0
        for n, s in zip(names, shapes):
            params[n] = w[i:i + s.numel()].view(s)
            i += s.numel()
        return F.cross_entropy(functional_call(model, params, (x,)), y) + weight_decay / 2 * (w * w).sum()

    return torch.autograd.functional.hessian(loss, flat)


def by_magnitude(values, k):
    return values[values.abs().argsort(descending=True)][:k].tolist()


def test_top_eigenvalues_match_the_exact_hessian():
    model, (x, y) = tiny_mlp(), data()
    exact = torch.linalg.eigvalsh(exact_hessian(model, x, y))
    got = hessian_top_eigenvalues(model, F.cross_entropy, (x, y), k=4, tol=1e-10, max_iter=2000)
    assert got == pytest.approx(by_magnitude(exact, 4), rel=1e-6, abs=1e-8)
    assert any(v < 0 for v in got)  # this loss is not convex here: a negative eigenvalue is among the top 4


def test_weight_decay_is_an_l2_penalty_shifting_every_eigenvalue():
    model, (x, y) = tiny_mlp(), data()
    wd = 0.3
    exact = torch.linalg.eigvalsh(exact_hessian(model, x, y, weight_decay=wd))
    got = hessian_top_eigenvalues(model, F.cross_entropy, (x, y), k=3, weight_decay=wd, tol=1e-10, max_iter=2000)
    assert got == pytest.approx(by_magnitude(exact, 3), rel=1e-6)
    plain = torch.linalg.eigvalsh(exact_hessian(model, x, y))
    torch.testing.assert_close(exact, plain + wd)  # the reference itself: the penalty shifts the spectrum


def test_several_batches_are_one_size_weighted_loss():
    model, (x, y) = tiny_mlp(), data(n=16)
    exact = torch.linalg.eigvalsh(exact_hessian(model, x, y))
    batches = [(x[:10], y[:10]), (x[10:], y[10:])]
    got = hessian_top_eigenvalues(model, F.cross_entropy, batches, k=1, tol=1e-10, max_iter=2000)
    assert got == pytest.approx(by_magnitude(exact, 1), rel=1e-6)


def test_hutchinson_trace_is_exact_for_a_diagonal_hessian():
    class Quadratic(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, dtype=torch.float64))
            self.register_buffer('a', torch.arange(1.0, 7.0, dtype=torch.float64))

        def forward(self, x):
            return (self.a * self.w ** 2).sum() * x.sum()

    model = Quadratic()
    got = hessian_trace(model, lambda out, y: out, (torch.ones(1, dtype=torch.float64), torch.zeros(1)), samples=1)
    assert got['trace'] == pytest.approx(2 * 21.0)  # diag(2a): v^T H v = sum 2 a_i for every sign vector
    got = hessian_trace(model, lambda out, y: out, (torch.ones(1, dtype=torch.float64), torch.zeros(1)),
                        samples=3, weight_decay=0.5)
    assert got['trace'] == pytest.approx(42.0 + 0.5 * 6)


def test_hutchinson_trace_estimates_the_mlp_trace():
    model, (x, y) = tiny_mlp(), data()
    exact = float(exact_hessian(model, x, y).trace())
    got = hessian_trace(model, F.cross_entropy, (x, y), samples=200, seed=3)
    assert 0 < got['std_error'] < 0.3
    assert abs(got['trace'] - exact) < 4 * got['std_error']


def test_lanczos_density_recovers_the_spectrum():
    model, (x, y) = tiny_mlp(), data()
    exact = torch.linalg.eigvalsh(exact_hessian(model, x, y))
    n = exact.numel()  # 43 parameters: n steps exhaust the Krylov space (it stops early on repeated eigenvalues)
    nodes, weights = hessian_spectrum_density(model, F.cross_entropy, (x, y), iterations=n, runs=2)
    assert weights.sum() == pytest.approx(1.0)
    seen = nodes[weights > 1e-12]
    gaps = (seen[:, None] - exact[None, :]).abs().min(dim=1).values
    assert float(gaps.max()) < 1e-6  # every Ritz value carrying weight is an exact eigenvalue
    assert float(seen.max()) == pytest.approx(float(exact.max()), rel=1e-8)
    assert float(seen.min()) == pytest.approx(float(exact.min()), rel=1e-8)
    grid = torch.linspace(float(exact.min()) - 1, float(exact.max()) + 1, 2001)
    density = spectrum_density_on_grid(nodes, weights, grid, sigma=0.02)
    assert float(torch.trapezoid(density, grid)) == pytest.approx(1.0, rel=1e-3)


def test_nep_and_ape():
    assert nep_ape([-1.0, 2.0, 4.0, -3.0]) == (0.5, 3.0)
    nep, ape = nep_ape([-1.0])
    assert nep == 1.0 and math.isnan(ape)
    with pytest.raises(ValueError, match='at least one eigenvalue'):
        nep_ape([])


def test_max_eigenvalue_spectrum_is_per_batch():
    model, (x, y) = tiny_mlp(), data()
    batches = [(x[:8], y[:8]), (x[8:], y[8:])]
    spectrum = hessian_max_eigenvalue_spectrum(model, F.cross_entropy, batches, k=1, tol=1e-10, max_iter=2000)
    assert len(spectrum) == 2 and all(len(s) == 1 for s in spectrum)
    for (bx, by), values in zip(batches, spectrum):
        assert values == pytest.approx(by_magnitude(torch.linalg.eigvalsh(exact_hessian(model, bx, by)), 1), rel=1e-6)


def test_vit_hvp_with_fused_attention_matches_finite_differences():
    model = timm.create_model('vit_tiny_patch16_224', img_size=8, patch_size=4, depth=1, embed_dim=8, num_heads=2,
                              num_classes=3).double().eval()
    fused = [m for m in model.modules() if hasattr(m, 'fused_attn')]
    for m in fused:
        m.fused_attn = True  # the fused path has no double backward: the context must switch it off
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0])
    params = list(model.parameters())
    v = [torch.randn_like(p) for p in params]
    with hessian_context(model):
        assert not any(m.fused_attn for m in fused)
        hv = HessianOperator(model, F.cross_entropy, (x, y))(v)
    assert all(m.fused_attn for m in fused)

    def grad_at(sign, eps=1e-6):  # central differences: error ~ eps^2 times the third derivative
        with torch.no_grad():
            for p, d in zip(params, v):
                p.add_(d, alpha=sign * eps)
        g = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            for p, d in zip(params, v):
                p.sub_(d, alpha=sign * eps)
        return g

    plus, minus = grad_at(1), grad_at(-1)
    fd = torch.cat([((a - b) / 2e-6).flatten() for a, b in zip(plus, minus)])
    hv = torch.cat([h.flatten() for h in hv])
    torch.testing.assert_close(hv, fd, rtol=1e-5, atol=1e-6 * float(hv.abs().max()))
    assert math.isfinite(hessian_lambda_max(model, F.cross_entropy, (x, y), max_iter=5))
    assert all(m.fused_attn for m in fused) and not model.training


def test_noisy_loss_restores_the_weights_and_is_the_loss_without_noise():
    model, (x, y) = tiny_mlp(), data()
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        clean = float(F.cross_entropy(model(x), y))
    zero = noisy_loss(model, F.cross_entropy, (x, y), sigma=0.0, samples=2)
    assert zero['noisy_loss'] == clean and zero['loss'] == clean and zero['std'] == 0.0
    noisy = noisy_loss(model, F.cross_entropy, (x, y), sigma=0.5, samples=5, seed=1)
    assert noisy['noisy_loss'] != clean and noisy['std'] > 0
    assert noisy == noisy_loss(model, F.cross_entropy, (x, y), sigma=0.5, samples=5, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize('call, message', [
    (lambda m, b: hessian_top_eigenvalues(m, F.cross_entropy, b, k=0), 'k must be a positive integer, got 0'),
    (lambda m, b: hessian_top_eigenvalues(m, F.cross_entropy, b, weight_decay=-1.0),
     'weight_decay must be a float >= 0, got -1.0'),
    (lambda m, b: noisy_loss(m, F.cross_entropy, b, sigma=-0.1), 'sigma must be a float >= 0, got -0.1'),
    (lambda m, b: hessian_trace(m, F.cross_entropy, b, samples=0), 'samples must be a positive integer, got 0'),
    (lambda m, b: hessian_top_eigenvalues(m, F.cross_entropy, []), 'batches is empty'),
])
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny_mlp(), data())
