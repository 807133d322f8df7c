""" GSAM: Surrogate Gap Guided Sharpness-Aware Minimization, as a SAM wrapper around any timm/torch optimizer

Paper: 'Surrogate Gap Minimization Improves Sharpness-Aware Training' (Zhuang et al., ICLR 2022),
https://arxiv.org/abs/2203.08065; official JAX code in google-research/big_vision
(``big_vision/trainers/proj/gsam/gsam.py``, config ``configs/proj/gsam/vit_i1k_gsam_no_aug.py``).

A GSAM step is a SAM step (gradient g at w, gradient h at w + e, e = rho_t g / ||g||) whose applied
gradient is

    d = h - alpha * (g - (g.h / ||h||^2) h)

the perturbed gradient minus ``alpha`` times the part of the clean gradient orthogonal to it (the
direction that lowers the surrogate gap without raising the perturbed loss). The radius follows the
learning rate: ``rho_t = rho_min + (rho_max - rho_min) * (lr_t - lr_min) / (lr_max - lr_min)``
(``rho_max`` when ``lr_max == lr_min``). The clean gradient is the first pass's, so GSAM costs what
SAM costs (plus one copy of the gradient and two dot products). ``rho_max == rho_min`` and
``alpha == 0`` give SAM exactly.

What is ours: everything SAM has (train.py replay, closures, explicit steps, fp16 GradScaler,
accumulation, DDP, m-sharpness, interval, resume), with ``lr_t`` read from the first param group
without a layer-decay ``lr_scale`` (timm's schedulers write ``value * lr_scale``), and rho_t kept >= 0
(the paper's formula dips below ``rho_min`` when the warmup starts under ``lr_min``; at
``rho_min = 0`` that would be a negative radius).
"""
import math
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import GSAM_ALPHA, GSAM_RHO_MAX, GSAM_RHO_MIN, GSAMSettings
from timm_ext.optim.sharded import global_dot, global_norm, local

__all__ = ['GSAM', 'GSAM_ALPHA', 'GSAM_RHO_MAX', 'GSAM_RHO_MIN']


class GSAM(SAM):
    """ GSAM around any torch/timm optimizer (a :class:`SAM` with a surrogate-gap step and a scheduled rho).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class.
        rho_max: radius at ``lr_max`` (the peak of the schedule).
        rho_min: radius at ``lr_min``.
        alpha: weight of the clean gradient's component orthogonal to the perturbed one, in [0, 1).
        lr_max: the schedule's peak learning rate; None = the first param group's lr when GSAM is
            built (timm's factory builds it before the scheduler touches the lr).
        lr_min: the schedule's lowest learning rate (train.py's ``min_lr``).
        adaptive, eta, clip_grad, clip_mode, model, interval, m_sharpness, use_gc: as for :class:`SAM`.
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """
    Settings = GSAMSettings
    needs_clean_gradient = True

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho_max: float = GSAM_RHO_MAX,
            rho_min: float = GSAM_RHO_MIN,
            alpha: float = GSAM_ALPHA,
            lr_max: Optional[float] = None,
            lr_min: float = 0.0,
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
        if 'rho' in base_kwargs:
            raise TypeError(f'GSAM got rho={base_kwargs["rho"]!r}: its radius is scheduled between rho_min and '
                            f'rho_max, give those instead')
        super().__init__(params, base_optimizer, adaptive=adaptive, eta=eta, clip_grad=clip_grad,
                         clip_mode=clip_mode, model=model, interval=interval, m_sharpness=m_sharpness, use_gc=use_gc,
                         rho_max=rho_max, rho_min=rho_min, alpha=alpha, lr_max=lr_max, lr_min=lr_min, **base_kwargs)
        if self.settings.lr_max is None:
            self.settings = self.settings.replace(' (lr_max = the initial lr)', lr_max=self._schedule_lr())

    def _schedule_lr(self) -> float:
        """The schedule's value now: the lr of the first group without a layer-decay ``lr_scale`` (timm's
        schedulers write ``value * lr_scale``; the top layers' groups have scale 1), else group 0's."""
        for group in self.param_groups:
            if group.get('lr_scale', 1.0) == 1.0:
                return float(group['lr'])
        return float(self.param_groups[0]['lr'])

    def current_rho(self) -> float:
        """rho_t = rho_min + (rho_max - rho_min) (lr_t - lr_min) / (lr_max - lr_min), kept >= 0."""
        s = self.settings
        if s.lr_max == s.lr_min:
            return float(s.rho_max)
        ratio = (self._schedule_lr() - s.lr_min) / (s.lr_max - s.lr_min)
        return max(0.0, s.rho_min + (s.rho_max - s.rho_min) * ratio)

    def prepare_sam_step(self) -> None:
        rho = self.current_rho()
        for group in self.param_groups:
            group['rho'] = rho

    @torch.no_grad()
    def adjust_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """h <- h - alpha (g - (g.h / ||h||^2) h) over all parameters (one global projection)."""
        params = [p for p in params if p in clean]
        alpha = self.settings.alpha
        if alpha == 0 or not params:
            return
        grads = [local(p.grad) for p in params]  # this rank's shards (sums span all ranks)
        cleans = [clean[p] for p in params]
        hh = global_norm(grads, params) ** 2
        if not math.isfinite(hh) or hh == 0:
            return
        gh = global_dot(grads, cleans, params)
        torch._foreach_mul_(grads, 1.0 + alpha * gh / hh)
        torch._foreach_add_(grads, cleans, alpha=-alpha)
