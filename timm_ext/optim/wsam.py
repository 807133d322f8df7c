""" WSAM: Sharpness-Aware Minimization Revisited: Weighted Sharpness as a Regularization Term, as a SAM variant

Paper: Yue et al., KDD 2023, https://arxiv.org/abs/2305.15817. Reference implementation for the tests:
``pytorch_optimizer.WSAM``.

WSAM minimizes ``L(w) + gamma / (1 - gamma) * (L(w + e) - L(w))``: the loss plus its sharpness, weighted. With
``alpha = gamma / (1 - gamma)``, g the gradient at w and h the one at w + e (SAM's two passes), the gradient of that
objective is ``g + alpha (h - g)``. WSAM gives it two ways:

* ``decouple=True`` (the paper's Algorithm 1, the default): the base optimizer steps with g, then the sharpness
  part moves the weights on its own, ``w <- w - lr * alpha * (h - g)`` (lr: each parameter group's);
* ``decouple=False``: the base optimizer steps with ``g + alpha (h - g)``.

``gamma = 0.5`` (alpha 1) with ``decouple=False`` is SAM. The two passes cost what SAM's cost, plus a copy of g.

What is ours: everything SAM has (train.py replay, closures, explicit steps, fp16 GradScaler, accumulation, DDP,
m-sharpness, interval, resume). The gradients are mixed once per update, after the second pass and before the
clip and the base step (with m-sharpness, the chunks' mean h and mean g), so ``clip_grad`` clips the gradient the
base optimizer applies, as everywhere in the family; pytorch_optimizer clips h before the mix.
"""
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import SAM_RHO, WSAM_GAMMA, WSAMSettings
from timm_ext.optim.sharded import local

__all__ = ['WSAM', 'WSAM_GAMMA']


class WSAM(SAM):
    """ WSAM around any torch/timm optimizer (a :class:`SAM` whose sharpness is a weighted regulariser).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class.
        rho: SAM's radius.
        gamma: the sharpness weighs ``gamma / (1 - gamma)`` against the loss, in [0, 1).
        decouple: the sharpness as its own weight update after the base step (Algorithm 1); False: in the
            gradient the base optimizer applies.
        adaptive, eta, clip_grad, clip_mode, model, interval, m_sharpness, use_gc: as for :class:`SAM`.
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """
    Settings = WSAMSettings
    needs_clean_gradient = True

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = SAM_RHO,
            gamma: float = WSAM_GAMMA,
            decouple: bool = True,
            adaptive: bool = False,
            eta: float = 0.01,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
            interval: int = 1,
            m_sharpness: Optional[int] = None,
            use_gc: bool = False,
            **base_kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, adaptive=adaptive, eta=eta, clip_grad=clip_grad,
                         clip_mode=clip_mode, model=model, interval=interval, m_sharpness=m_sharpness,
                         use_gc=use_gc, gamma=gamma,
                         decouple=decouple, **base_kwargs)

    @property
    def alpha(self) -> float:
        """The sharpness's weight, ``gamma / (1 - gamma)``."""
        return self.settings.gamma / (1.0 - self.settings.gamma)

    @torch.no_grad()
    def observe_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """h (the gradient at w + e) and g (at w) into the gradient the base applies: g + alpha (h - g), or g with
        h - g kept for ``after_sam_step`` (decouple)."""
        params = [p for p in params if p in clean]
        if not params:
            return
        grads = [local(p.grad) for p in params]
        cleans = [clean[p] for p in params]
        if self.settings.decouple:
            self._sharpness = dict(zip(params, torch._foreach_sub(grads, cleans)))
            torch._foreach_copy_(grads, cleans)
        else:
            torch._foreach_lerp_(grads, cleans, 1.0 - self.alpha)

    @torch.no_grad()
    def after_sam_step(self) -> None:
        """Decoupled: w <- w - lr * alpha * (h - g), each parameter group at its own lr."""
        sharpness, self._sharpness = self._sharpness, {}
        if not sharpness:
            return
        for group in self.param_groups:
            params = [p for p in group['params'] if p in sharpness]
            if params:
                torch._foreach_add_([local(p) for p in params], [sharpness[p] for p in params],
                                    alpha=-group['lr'] * self.alpha)

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._sharpness: Dict[torch.Tensor, torch.Tensor] = {}  # h - g of this update, for after_sam_step
