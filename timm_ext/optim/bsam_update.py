"""bSAM's descent on the mean weights, as torch's ``adam()`` is to ``Adam``: a function over lists of tensors, and the
optimizer :class:`~timm_ext.optim.bsam.BSAM` wraps as its base.

With h the gradient at the ascended point, ``c = sqrt(s) |g|`` from the first (noisy) pass, weight decay d and
damping k (Möllenhoff & Khan, ICLR 2023, and the official code's ``build_bsam_optimizer``)::

    m <- beta1 m + (1 - beta1) (h + d w)
    w <- w - lr m / s                              # s before this step's update
    s <- beta2 s + (1 - beta2) (c + k + d)

``BSAMUpdate`` keeps m (``momentum``) and s (``precision``, started at ``s_init``) per parameter. It steps only with the
first pass's ``c`` handed over by ``set_curvature`` (bSAM does that before each step), so it is not a general-purpose
optimizer: the gradient it applies and the one that moves s come from different passes.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.optim import Optimizer

from timm_ext.optim.sam_settings import BSAM_DAMPING, BSAM_S_INIT

__all__ = ['BSAMUpdate', 'BSAM_BETAS', 'BSAM_DAMPING', 'BSAM_LR', 'BSAM_S_INIT', 'bsam_update_']

# team-approx-bayes/bayesian-sam README, bSAM on CIFAR-10 and CIFAR-100: --alpha 0.5 --beta1 0.9 --beta2 0.999
BSAM_LR = 0.5
BSAM_BETAS = (0.9, 0.999)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_betas(betas: Any) -> Tuple[float, float]:
    """Two numbers in [0, 1), or a one-line ValueError naming the value."""
    ok = isinstance(betas, (tuple, list)) and len(betas) == 2 and all(_is_number(b) and 0 <= b < 1 for b in betas)
    if not ok:
        raise ValueError(f'bSAM betas must be two numbers in [0, 1) (momentum, precision), got betas={betas!r}')
    return float(betas[0]), float(betas[1])


def _check_at_least_zero(name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:  # a tensor lr (timm's tests, torch.compile users)
        value = value.item()
    if not _is_number(value) or not 0 <= value < float('inf'):
        raise ValueError(f'bSAM {name} must be a finite number >= 0, got {name}={value!r}')


@torch.no_grad()
def bsam_update_(params: List[torch.Tensor], grads: List[torch.Tensor], curvatures: List[torch.Tensor],
                 momenta: List[torch.Tensor], precisions: List[torch.Tensor], *, lr: Union[float, torch.Tensor],
                 beta1: float, beta2: float, weight_decay: float, damping: float) -> None:
    """One bSAM descent in place (the module docstring's three lines). ``curvatures`` (``sqrt(s) |g|``) is used as
    scratch space."""
    decayed = torch._foreach_add(grads, params, alpha=weight_decay) if weight_decay else grads
    torch._foreach_lerp_(momenta, decayed, 1.0 - beta1)
    if isinstance(lr, torch.Tensor):  # foreach's value= takes a number only
        steps = torch._foreach_div(momenta, precisions)
        torch._foreach_mul_(steps, -lr)
        torch._foreach_add_(params, steps)
    else:
        torch._foreach_addcdiv_(params, momenta, precisions, value=-lr)
    torch._foreach_add_(curvatures, damping + weight_decay)
    torch._foreach_lerp_(precisions, curvatures, 1.0 - beta2)


class BSAMUpdate(Optimizer):
    """bSAM's descent on the mean weights (the module docstring); its gradient is the ascended point's h.

    Args:
        params: parameters or param groups.
        lr: step size (the official code's alpha).
        betas: decays of the momentum m and of the precision s.
        weight_decay: d, in the momentum (``h + d w``) and in the precision (the official code's prior precision over
            the data size, ``priorprec / N``).
        s_init: the precision before the first step.
        damping: k, added to the precision's update.
        foreach: one multi-tensor update per group (default), or False: tensor by tensor.
    """

    def __init__(self, params: Any, lr: float = BSAM_LR, betas: Sequence[float] = BSAM_BETAS,
                 weight_decay: float = 0.0, s_init: float = BSAM_S_INIT, damping: float = BSAM_DAMPING,
                 foreach: Optional[bool] = None) -> None:
        _check_at_least_zero('lr', lr)
        _check_at_least_zero('weight_decay', weight_decay)
        _check_at_least_zero('damping', damping)
        if not _is_number(s_init) or not 0 < s_init < float('inf'):
            raise ValueError(f'bSAM s_init must be a finite number > 0 (the initial precision), got s_init={s_init!r}')
        defaults = dict(lr=lr, betas=check_betas(betas), weight_decay=weight_decay, s_init=s_init, damping=damping,
                        foreach=foreach)
        super().__init__(params, defaults)
        self._curvature: Dict[torch.Tensor, torch.Tensor] = {}

    def precision(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """s of ``p``; None before its first step (s is then its group's ``s_init``)."""
        state = self.state.get(p)
        return state.get('precision') if state else None

    def set_curvature(self, curvature: Dict[torch.Tensor, torch.Tensor]) -> None:
        """``sqrt(s) |g|`` of the first pass for the next ``step()`` (which consumes it)."""
        self._curvature = curvature

    @torch.no_grad()
    def step(self, closure: Optional[Any] = None) -> Optional[Any]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        curvature, self._curvature = self._curvature, {}
        for group in self.param_groups:
            params = [p for p in group['params'] if p.grad is not None]
            if not params:
                continue
            missing = [p for p in params if p not in curvature]
            if missing:
                raise RuntimeError(f'bSAM\'s update got no first-pass curvature sqrt(s)|g| for {len(missing)} '
                                   f'parameter(s): step it through BSAM, which runs both passes')
            momenta, precisions = [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state['momentum'] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state['precision'] = torch.full_like(p, group['s_init'], memory_format=torch.preserve_format)
                momenta.append(state['momentum'])
                precisions.append(state['precision'])
            beta1, beta2 = group['betas']
            kwargs = dict(lr=group['lr'], beta1=beta1, beta2=beta2, weight_decay=group['weight_decay'],
                          damping=group['damping'])
            lists = (params, [p.grad for p in params], [curvature[p] for p in params], momenta, precisions)
            if group['foreach'] is False:
                for one in zip(*lists):
                    bsam_update_(*[[t] for t in one], **kwargs)
            else:
                bsam_update_(*lists, **kwargs)
        return loss
