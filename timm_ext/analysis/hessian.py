"""Hessian of the training loss: top-k eigenvalues, trace, spectrum density, NEP/APE, and weight-noise flatness.

* Top-k eigenvalues by power iteration with deflation, mini-batch by mini-batch: the "Hessian max
  eigenvalue spectrum" of how-do-vits-work (Park & Kim 2022, App. A.1/A.2, Fig. 1c and 4: top-5 per
  batch of 16, on the l2-regularised NLL), and its NEP (share of negative eigenvalues) and APE (mean of
  the positive ones); the dominant eigenvalue ``lambda_max`` of the SAM paper (Chen et al. 2022, Table 1).
* The trace by Hutchinson's estimator, and the eigenvalue density by stochastic Lanczos quadrature
  (Ghorbani et al. 2019), with ``torch.linalg.eigh`` on the tridiagonal matrix.
* ``L_train^N``: the training loss under Gaussian weight noise, ``E_eps L(w + eps)`` (SAM paper Table 1).

``weight_decay`` adds ``weight_decay / 2 * ||w||^2`` over the parameters analysed to the loss, the l2
penalty whose gradient is SGD's weight decay, so every eigenvalue shifts by ``weight_decay``.

Hessian-vector products use double backward (``torch.autograd.grad(..., create_graph=True)``). timm's
fused attention and SDPA's fused kernels have none, so these functions run inside
:func:`timm_ext.analysis._hooks.math_attention` (restored on exit). The model is in eval mode unless
``train=True`` (dropout and batch statistics then take part). Inside it, GELU, LayerNorm, Conv2d and
eval-mode BatchNorm get a double backward that keeps its vector-independent factors with the graph
(:mod:`timm_ext.analysis._second_order`): one product costs 2.2-2.4x a forward+backward instead of
2.6-3.0x (``benchmarks/bench_hessian.py``). Vectors are lists of tensors shaped like the parameters and
all vector algebra uses ``torch._foreach_*`` ops.
"""
import contextlib
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from timm_ext.analysis._hooks import LossFn, as_batches, eval_mode, math_attention, mean_loss, model_device
from timm_ext.analysis._second_order import second_order_activations
from timm_ext.arg_types import positive_int, positive_number

__all__ = [
    'HessianOperator', 'hessian_lambda_max', 'hessian_max_eigenvalue_spectrum', 'hessian_spectrum_density',
    'hessian_top_eigenvalues', 'hessian_trace', 'lanczos', 'nep_ape', 'noisy_loss', 'power_iteration',
    'spectrum_density_on_grid',
]

Vector = List[torch.Tensor]


def _dot(a: Vector, b: Vector) -> torch.Tensor:
    return torch.stack([t.sum() for t in torch._foreach_mul(a, b)]).sum()


def _norm(a: Vector) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(a)))


def _normalize_(a: Vector) -> Vector:
    torch._foreach_div_(a, _norm(a).clamp_min(torch.finfo(a[0].dtype).tiny))
    return a


def _orthogonalize_(v: Vector, basis: Sequence[Vector]) -> Vector:
    """Remove from ``v`` its components along the orthonormal vectors of ``basis`` (Gram-Schmidt)."""
    for u in basis:
        torch._foreach_add_(v, u, alpha=-float(_dot(v, u)))
    return v


def _randn_like(params: Vector, generator: torch.Generator) -> Vector:
    return [torch.randn(p.shape, generator=generator, dtype=p.dtype, device='cpu').to(p.device) for p in params]


def _rademacher_like(params: Vector, generator: torch.Generator) -> Vector:
    return [torch.randint(0, 2, p.shape, generator=generator, device='cpu').to(p) * 2 - 1 for p in params]


class HessianOperator:
    """``v -> (H + weight_decay I) v`` for the size-weighted mean loss over ``batches``.

    With one batch the gradient graph is built once and every product is one double backward; with
    several, each product recomputes the forward and backward of every batch (memory stays one batch).
    Use it inside :func:`hessian_context`.
    """

    def __init__(
            self,
            model: nn.Module,
            loss_fn: LossFn,
            batches: Any,
            weight_decay: float = 0.0,
            params: Optional[Sequence[torch.Tensor]] = None,
    ) -> None:
        if not isinstance(weight_decay, (int, float)) or isinstance(weight_decay, bool) or weight_decay < 0:
            raise ValueError(f'weight_decay must be a float >= 0, got {weight_decay!r}')
        self.model = model
        self.loss_fn = loss_fn
        self.batches = as_batches(batches)
        self.weight_decay = float(weight_decay)
        self.params = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError(f'{type(model).__name__} has no parameter that requires grad')
        self.device = model_device(model)
        self.total = sum(x.shape[0] for x, _ in self.batches)
        self._grads: Optional[Vector] = None
        self.num_products = 0

    def _grad(self, x: torch.Tensor, y: torch.Tensor) -> Vector:
        loss = self.loss_fn(self.model(x.to(self.device)), y.to(self.device)) * (x.shape[0] / self.total)
        grads = torch.autograd.grad(loss, self.params, create_graph=True, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, self.params)]

    def _hvp(self, grads: Vector, v: Vector, retain: bool) -> Vector:
        live = [i for i, g in enumerate(grads) if g.requires_grad]  # a gradient constant in w has no Hessian part
        hv = [torch.zeros_like(p) for p in self.params]
        if live:
            parts = torch.autograd.grad(
                [grads[i] for i in live], self.params, grad_outputs=[v[i] for i in live], retain_graph=retain,
                allow_unused=True)
            hv = [h if h is not None else z for h, z in zip(parts, hv)]
        return hv

    def __call__(self, v: Vector) -> Vector:
        self.num_products += 1
        if len(self.batches) == 1:
            if self._grads is None:
                self._grads = self._grad(*self.batches[0])
            hv = self._hvp(self._grads, v, retain=True)
        else:
            hv = None
            for x, y in self.batches:
                part = self._hvp(self._grad(x, y), v, retain=False)
                if hv is None:
                    hv = part
                else:
                    torch._foreach_add_(hv, part)
        hv = [h.detach() for h in hv]
        if self.weight_decay:
            torch._foreach_add_(hv, v, alpha=self.weight_decay)
        return hv

    def release(self) -> None:
        """Drop the cached gradient graph."""
        self._grads = None


@contextlib.contextmanager
def hessian_context(model: nn.Module, train: bool = False) -> Iterator[nn.Module]:
    """Eval (or train) mode, the math attention path, and GELU / LayerNorm / Conv2d / BatchNorm with a cheap
    double backward (:mod:`timm_ext.analysis._second_order`), all restored on exit."""
    with eval_mode(model, train=train), math_attention(model), second_order_activations(model):
        yield model


def power_iteration(
        op: HessianOperator,
        k: int = 1,
        max_iter: int = 100,
        tol: float = 1e-3,
        seed: int = 0,
) -> Tuple[List[float], List[Vector]]:
    """The ``k`` eigenpairs of largest magnitude by power iteration, deflating the ones already found.

    Each iteration stops when the Rayleigh quotient changes by less than ``tol`` relative to itself
    (PyHessian's rule; the how-do-vits-work spectra were made with it) or after ``max_iter`` products.
    """
    positive_int('k', k)
    positive_int('max_iter', max_iter)
    generator = torch.Generator().manual_seed(seed)
    values: List[float] = []
    vectors: List[Vector] = []
    for _ in range(k):
        v = _normalize_(_orthogonalize_(_randn_like(op.params, generator), vectors))
        value: Optional[float] = None
        for _ in range(max_iter):
            hv = op(v)
            new = float(_dot(hv, v))
            v = _normalize_(_orthogonalize_(hv, vectors))
            converged = value is not None and abs(new - value) <= tol * (abs(value) + 1e-12)
            value = new
            if converged:
                break
        values.append(value)
        vectors.append(v)
    return values, vectors


def hessian_top_eigenvalues(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        k: int = 5,
        weight_decay: float = 0.0,
        max_iter: int = 100,
        tol: float = 1e-3,
        seed: int = 0,
        train: bool = False,
) -> List[float]:
    """The ``k`` Hessian eigenvalues of largest magnitude of the loss on all ``batches`` together, largest first."""
    with hessian_context(model, train):
        op = HessianOperator(model, loss_fn, batches, weight_decay)
        values, _ = power_iteration(op, k, max_iter, tol, seed)
        op.release()
    return values


def hessian_lambda_max(model: nn.Module, loss_fn: LossFn, batches: Any, **kwargs: Any) -> float:
    """The dominant Hessian eigenvalue (SAM paper's ``lambda_max``; 100 iterations in its App. F)."""
    return hessian_top_eigenvalues(model, loss_fn, batches, k=1, **kwargs)[0]


def hessian_max_eigenvalue_spectrum(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        k: int = 5,
        weight_decay: float = 0.0,
        max_iter: int = 100,
        tol: float = 1e-3,
        seed: int = 0,
        train: bool = False,
        progress: Optional[Any] = None,
) -> List[List[float]]:
    """Top-``k`` eigenvalues of every mini-batch on its own (how-do-vits-work Fig. 4; pool them for a histogram).

    ``progress`` is called after each batch (e.g. a tqdm bar's ``update``).
    """
    out = []
    for i, batch in enumerate(as_batches(batches)):
        out.append(hessian_top_eigenvalues(model, loss_fn, [batch], k, weight_decay, max_iter, tol, seed + i, train))
        if progress is not None:
            progress(1)
    return out


def nep_ape(eigenvalues: Sequence[float]) -> Tuple[float, float]:
    """NEP (share of negative eigenvalues) and APE (mean of the positive ones, NaN if none), App. A.2."""
    values = torch.as_tensor(list(eigenvalues), dtype=torch.float64).flatten()
    if values.numel() == 0:
        raise ValueError('nep_ape needs at least one eigenvalue')
    positive = values[values > 0]
    return float((values < 0).double().mean()), float(positive.mean()) if positive.numel() else math.nan


def hessian_trace(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        samples: int = 100,
        weight_decay: float = 0.0,
        seed: int = 0,
        train: bool = False,
) -> Dict[str, float]:
    """Hutchinson's estimate ``E_v[v^T H v]`` (Rademacher ``v``): ``{'trace', 'std_error', 'samples'}``."""
    positive_int('samples', samples)
    generator = torch.Generator().manual_seed(seed)
    with hessian_context(model, train):
        op = HessianOperator(model, loss_fn, batches, weight_decay)
        estimates = torch.tensor([float(_dot(op(v), v)) for v in (
            _rademacher_like(op.params, generator) for _ in range(samples))], dtype=torch.float64)
        op.release()
    std_error = float(estimates.std() / math.sqrt(samples)) if samples > 1 else math.nan
    return dict(trace=float(estimates.mean()), std_error=std_error, samples=samples)


def lanczos(op: HessianOperator, iterations: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """Lanczos with full reorthogonalisation from a Rademacher start: the Ritz values and their weights.

    The weights are the squared first components of the tridiagonal matrix's eigenvectors (they sum to 1).
    """
    v = _normalize_(_rademacher_like(op.params, generator))
    basis: List[Vector] = [v]
    alphas: List[float] = []
    betas: List[float] = []
    for j in range(iterations):
        w = op(basis[-1])
        alphas.append(float(_dot(w, basis[-1])))
        _orthogonalize_(w, basis)
        _orthogonalize_(w, basis)  # twice is enough (Parlett)
        beta = float(_norm(w))
        if j == iterations - 1 or beta < 1e-10 * max(1.0, abs(alphas[-1])):
            break
        betas.append(beta)
        basis.append(_normalize_(w))
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        t += torch.diag(off, 1) + torch.diag(off, -1)
    ritz, vecs = torch.linalg.eigh(t)
    return ritz, vecs[0] ** 2


def hessian_spectrum_density(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        iterations: int = 30,
        runs: int = 1,
        weight_decay: float = 0.0,
        seed: int = 0,
        train: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Stochastic Lanczos quadrature: Ritz values and weights of ``runs`` Lanczos runs (weights sum to 1).

    Smooth them with :func:`spectrum_density_on_grid` to plot the density.
    """
    positive_int('iterations', iterations)
    positive_int('runs', runs)
    generator = torch.Generator().manual_seed(seed)
    nodes, weights = [], []
    with hessian_context(model, train):
        op = HessianOperator(model, loss_fn, batches, weight_decay)
        for _ in range(runs):
            ritz, w = lanczos(op, iterations, generator)
            nodes.append(ritz)
            weights.append(w / runs)
        op.release()
    return torch.cat(nodes), torch.cat(weights)


def spectrum_density_on_grid(
        nodes: torch.Tensor,
        weights: torch.Tensor,
        grid: torch.Tensor,
        sigma: float,
) -> torch.Tensor:
    """Gaussian-smoothed density ``sum_i w_i N(grid; node_i, sigma^2)`` (integrates to sum(w))."""
    positive_number('sigma', sigma)
    z = (grid.double()[:, None] - nodes.double()[None, :]) / sigma
    return (torch.exp(-0.5 * z * z) * weights.double()[None, :]).sum(-1) / (sigma * math.sqrt(2 * math.pi))


def noisy_loss(
        model: nn.Module,
        loss_fn: LossFn,
        batches: Any,
        sigma: float = 0.01,
        samples: int = 10,
        seed: int = 0,
        train: bool = False,
) -> Dict[str, float]:
    """``L_train^N = E_eps L(w + eps)``, ``eps ~ N(0, sigma^2 I)`` on every parameter (SAM paper Table 1).

    The paper averages 1,000 draws and does not state sigma. The weights are restored bit for bit.
    Returns ``{'noisy_loss', 'std', 'loss', 'sigma', 'samples'}`` (``loss``: without noise).
    """
    if not isinstance(sigma, (int, float)) or isinstance(sigma, bool) or sigma < 0:
        raise ValueError(f'sigma must be a float >= 0, got {sigma!r}')
    positive_int('samples', samples)
    batches = as_batches(batches)
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(seed)
    losses = []
    with eval_mode(model, train=train):
        clean = mean_loss(model, loss_fn, batches)
        try:
            with torch.no_grad():
                for _ in range(samples):
                    noise = _randn_like(saved, generator)
                    for p, w, n in zip(params, saved, noise):
                        p.copy_(w + sigma * n)
                    losses.append(mean_loss(model, loss_fn, batches))
        finally:
            with torch.no_grad():
                for p, w in zip(params, saved):
                    p.copy_(w)
    values = torch.tensor(losses, dtype=torch.float64)
    return dict(noisy_loss=float(values.mean()), std=float(values.std()) if samples > 1 else 0.0,
                loss=clean, sigma=float(sigma), samples=samples)
