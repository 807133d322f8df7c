"""Mini-batch linear CKA between the layers of one or two models (Nguyen et al. 2021; how-do-vits-work Fig. 10a).

For each mini-batch of n >= 4 examples, the linear kernels ``K = X X^T`` and ``L = Y Y^T`` of two
layers' flattened features give the unbiased HSIC estimator of Song et al. (2012)::

    HSIC_1(K, L) = [tr(K~ L~) + 1^T K~ 1 1^T L~ 1 / ((n-1)(n-2)) - 2 / (n-2) 1^T K~ L~ 1] / (n (n-3))

with ``K~``, ``L~`` the kernels with zeroed diagonals. CKA is
``mean_b HSIC_1(K_b, L_b) / sqrt(mean_b HSIC_1(K_b, K_b) mean_b HSIC_1(L_b, L_b))``, accumulated over
batches as Nguyen et al. do; it is invariant to orthogonal transforms and isotropic scaling of the features.
"""
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn as nn

from timm_ext.analysis._hooks import capture, eval_mode, hooks, model_device, select_points

__all__ = ['MinibatchCKA', 'cka', 'cka_matrix', 'hsic_unbiased', 'linear_kernel']


def linear_kernel(x: torch.Tensor) -> torch.Tensor:
    """``X X^T`` of the (n, ...) features flattened per example, in float64."""
    x = x.flatten(1).double()
    return x @ x.T


def hsic_unbiased(k: torch.Tensor, l: torch.Tensor) -> torch.Tensor:  # noqa: E741 (the paper's name)
    """Song et al.'s unbiased HSIC of two (n, n) kernels, n >= 4."""
    n = k.shape[0]
    if n < 4:
        raise ValueError(f'the unbiased HSIC needs mini-batches of at least 4 examples, got {n}')
    k = k.clone().fill_diagonal_(0)
    l = l.clone().fill_diagonal_(0)  # noqa: E741
    ones = torch.ones(n, 1, dtype=k.dtype, device=k.device)
    trace = (k * l).sum()
    middle = k.sum() * l.sum() / ((n - 1) * (n - 2))
    last = 2.0 / (n - 2) * (ones.T @ k @ l @ ones).squeeze()
    return (trace + middle - last) / (n * (n - 3))


def cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two (n, ...) feature batches from one mini-batch (unbiased HSIC)."""
    k, l = linear_kernel(x), linear_kernel(y)  # noqa: E741
    return float(hsic_unbiased(k, l) / torch.sqrt(hsic_unbiased(k, k) * hsic_unbiased(l, l)))


class MinibatchCKA:
    """Accumulates HSIC_1 over mini-batches for every pair of ``a`` layers x ``b`` layers."""

    def __init__(self, num_a: int, num_b: int) -> None:
        self.xy = torch.zeros(num_a, num_b, dtype=torch.float64)
        self.xx = torch.zeros(num_a, dtype=torch.float64)
        self.yy = torch.zeros(num_b, dtype=torch.float64)

    def update(self, feats_a: Sequence[torch.Tensor], feats_b: Sequence[torch.Tensor]) -> None:
        ka = [linear_kernel(f) for f in feats_a]
        kb = [linear_kernel(f) for f in feats_b]
        for i, k in enumerate(ka):
            self.xx[i] += hsic_unbiased(k, k).cpu()
            for j, l in enumerate(kb):  # noqa: E741
                self.xy[i, j] += hsic_unbiased(k, l).cpu()
        for j, l in enumerate(kb):  # noqa: E741
            self.yy[j] += hsic_unbiased(l, l).cpu()

    def compute(self) -> torch.Tensor:
        """The [a layers, b layers] CKA matrix (the number of batches cancels in the ratio)."""
        return self.xy / torch.sqrt(self.xx[:, None] * self.yy[None, :])


def _features(model: nn.Module, modules: Optional[Sequence[str]]):
    points = select_points(model, modules)
    store: Dict[str, torch.Tensor] = {}
    return points, store, lambda name, x: store.__setitem__(name, x.detach())


def cka_matrix(
        model: nn.Module,
        images: Any,
        other: Optional[nn.Module] = None,
        modules: Optional[Sequence[str]] = None,
        other_modules: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """Mini-batch CKA between the reading points of ``model`` and those of ``other`` (default: ``model`` itself).

    ``images`` is an iterable of image batches (or of (images, targets) pairs) of at least 4 images each.
    Returns ``{'cka': Tensor[a, b], 'layers': names of model's points, 'other_layers': names of other's}``.
    """
    same = other is None
    other = model if same else other
    points_a, store_a, record_a = _features(model, modules)
    points_b, store_b, record_b = (points_a, store_a, record_a) if same and other_modules is None else \
        _features(other, other_modules if other_modules is not None else (None if same else modules))
    acc = MinibatchCKA(len(points_a), len(points_b))
    batches = [images] if torch.is_tensor(images) else images
    seen = 0
    with eval_mode(model), eval_mode(other), hooks() as handles, torch.no_grad():
        capture(points_a, record_a, handles)
        if points_b is not points_a:
            capture(points_b, record_b, handles)
        for chunk in batches:
            x = chunk[0] if isinstance(chunk, (tuple, list)) else chunk
            store_a.clear()
            store_b.clear()
            model(x.to(model_device(model)))
            if not same:
                other(x.to(model_device(other)))
            acc.update([store_a[n] for n in points_a], [store_b[n] for n in points_b])
            seen += 1
    if not seen:
        raise ValueError('images is empty: pass at least one batch of 4 or more images')
    return dict(cka=acc.compute(), layers=list(points_a), other_layers=list(points_b))

