""" FriendlySAM (F-SAM): Friendly Sharpness-Aware Minimization, as a SAM variant

Paper: Li et al., CVPR 2024, https://arxiv.org/abs/2403.12350 (official code: nblt/F-SAM). Reference implementation
for the tests: ``pytorch_optimizer.FriendlySAM``.

SAM's ascent direction, the batch gradient g, is mostly the full-data gradient, which the paper finds does little for
generalization; F-SAM perturbs along the batch-specific part instead, estimating the full gradient by an exponential
moving average m of the batch gradients:

    d = g - sigma * m                  # m before this step's update (the first step, without m: d = g)
    m <- lmbda * m + (1 - lmbda) * g
    e = rho * d / ||d||                # then SAM's second pass at w + e and the base step with its gradient

``sigma = 0`` is SAM. The cost is SAM's, plus the momentum m (one copy of the parameters, in the optimizer's state,
saved and resumed with it) and a transient copy of g.

What is ours: everything SAM has (train.py replay, closures, explicit steps, fp16 GradScaler, accumulation, DDP,
FSDP2, interval, resume). m moves only after a SAM step that was applied (an fp16 overflow leaves it as it was); with
m-sharpness each chunk perturbs along its own g - sigma m, and m takes the chunks' mean g.
"""
from typing import Any, Dict, Optional

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import FRIENDLYSAM_LMBDA, FRIENDLYSAM_SIGMA, SAM_RHO, FriendlySAMSettings
from timm_ext.optim.sharded import like_param, local

__all__ = ['FriendlySAM', 'MOMENTUM_KEY']

MOMENTUM_KEY = 'friendlysam_momentum'  # m in the optimizer's per-parameter state


class FriendlySAM(SAM):
    """ FriendlySAM around any torch/timm optimizer (a :class:`SAM` that perturbs along g - sigma * m).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class.
        rho: SAM's radius.
        sigma: how much of the gradients' moving average the perturbation leaves out (0: SAM), >= 0.
        lmbda: that moving average's decay, in [0, 1].
        adaptive, eta, clip_grad, clip_mode, model, interval, m_sharpness, use_gc: as for :class:`SAM`.
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """
    Settings = FriendlySAMSettings

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = SAM_RHO,
            sigma: float = FRIENDLYSAM_SIGMA,
            lmbda: float = FRIENDLYSAM_LMBDA,
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
                         use_gc=use_gc, sigma=sigma,
                         lmbda=lmbda, **base_kwargs)

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._batch_grads: Dict[torch.Tensor, torch.Tensor] = {}  # this update's g (summed over its chunks)
        self._chunks = 0
        self._for_update = -1  # the update _batch_grads belongs to (a cancelled one's are dropped)

    @torch.no_grad()
    def prepare_sam_step(self) -> None:
        """g kept for the momentum, then g <- g - sigma * m: the direction SAM perturbs along."""
        if self._for_update != self._updates:
            self._batch_grads, self._chunks, self._for_update = {}, 0, self._updates
        self._chunks += 1
        sigma = self.settings.sigma
        for p in self.params_with_grad():
            g = local(p.grad)
            kept = self._batch_grads.get(p)
            if kept is None:
                self._batch_grads[p] = g.clone()
            else:
                kept.add_(g)
            m = self.state.get(p, {}).get(MOMENTUM_KEY)
            if m is not None and sigma != 0:
                g.sub_(local(m), alpha=sigma)

    @torch.no_grad()
    def after_sam_step(self) -> None:
        """m <- lmbda * m + (1 - lmbda) * g (the first time: m = g), after the base optimizer made its own state."""
        grads, chunks = self._batch_grads, self._chunks
        self._batch_grads, self._chunks, self._for_update = {}, 0, -1
        weight = 1.0 - self.settings.lmbda
        for p, g in grads.items():
            if chunks > 1:
                g.div_(chunks)
            m = self.state.get(p, {}).get(MOMENTUM_KEY)
            if m is None:
                self.state[p][MOMENTUM_KEY] = like_param(g, p)
            else:
                local(m).lerp_(g, weight)
