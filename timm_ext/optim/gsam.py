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
from typing import Any, Dict, List, Optional, Tuple, Type, Union

import torch
import torch.nn as nn
from torch.optim import Optimizer

from timm_ext.optim._compat import total_norm
from timm_ext.optim.sam import SAM, _check_rho

__all__ = ['GSAM', 'GSAM_ALPHA', 'GSAM_RHO_MAX', 'GSAM_RHO_MIN']

# GSAM paper, Table 4, ResNet-50/101 on ImageNet (the ViT/Mixer values are per model: see docs/sam.md)
GSAM_RHO_MAX = 0.04
GSAM_RHO_MIN = 0.02
GSAM_ALPHA = 0.01


def _check_alpha(alpha: Any, name: str = 'alpha', where: str = '') -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < 1:
        raise ValueError(f'{name} must be in [0, 1), got alpha={alpha!r}{where}')


def _check_gsam(rho_max: Any, rho_min: Any, alpha: Any, lr_max: Any, lr_min: Any, where: str = '') -> None:
    _check_rho(rho_max, where)
    _check_rho(rho_min, where)
    if rho_min > rho_max:
        raise ValueError(f'GSAM rho_min must be <= rho_max, got rho_min={rho_min!r} > rho_max={rho_max!r}{where}')
    _check_alpha(alpha, 'GSAM alpha', where)
    if isinstance(lr_min, bool) or not isinstance(lr_min, (int, float)) or not lr_min >= 0:
        raise ValueError(f'GSAM lr_min must be a number >= 0, got lr_min={lr_min!r}{where}')
    if lr_max is not None and (isinstance(lr_max, bool) or not isinstance(lr_max, (int, float))
                               or not lr_max >= lr_min):
        raise ValueError(f'GSAM lr_max must be >= lr_min={lr_min!r} or None (the initial lr), '
                         f'got lr_max={lr_max!r}{where}')


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
        adaptive, eta, clip_grad, clip_mode, model, interval, m_sharpness: as for :class:`SAM`.
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """

    _keeps_clean_grad = True
    _logged_settings = SAM._logged_settings + ('rho_max', 'rho_min', 'alpha', 'lr_max', 'lr_min')
    _group_settings = ('adaptive', 'eta')  # a group's rho is GSAM's rho_t of the last step

    def __init__(
            self,
            params: Union[Optimizer, Any, None] = None,
            base_optimizer: Optional[Type[Optimizer]] = None,
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
            **base_kwargs: Any,
    ) -> None:
        _check_gsam(rho_max, rho_min, alpha, lr_max, lr_min)
        super().__init__(
            params, base_optimizer, rho=rho_max, adaptive=adaptive, eta=eta, clip_grad=clip_grad,
            clip_mode=clip_mode, model=model, interval=interval, m_sharpness=m_sharpness, **base_kwargs)
        if lr_max is None:
            lr_max = self._schedule_lr()
            _check_gsam(rho_max, rho_min, alpha, lr_max, lr_min, where=' (lr_max = the initial lr)')
        self.rho_max, self.rho_min, self.alpha = rho_max, rho_min, alpha
        self.lr_max, self.lr_min = float(lr_max), float(lr_min)

    def _extra_persistent(self) -> Tuple[str, ...]:
        return ('rho_max', 'rho_min', 'alpha', 'lr_max', 'lr_min')

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] + f', rho_max={self.rho_max}, rho_min={self.rho_min}, alpha={self.alpha}, '
                f'lr_max={self.lr_max}, lr_min={self.lr_min})')

    def _schedule_lr(self) -> float:
        """The schedule's value now: the lr of the first group without a layer-decay ``lr_scale`` (timm's
        schedulers write ``value * lr_scale``; the top layers' groups have scale 1), else group 0's."""
        for group in self.param_groups:
            if group.get('lr_scale', 1.0) == 1.0:
                return float(group['lr'])
        return float(self.param_groups[0]['lr'])

    def current_rho(self) -> float:
        """rho_t = rho_min + (rho_max - rho_min) (lr_t - lr_min) / (lr_max - lr_min), kept >= 0."""
        if self.lr_max == self.lr_min:
            return float(self.rho_max)
        ratio = (self._schedule_lr() - self.lr_min) / (self.lr_max - self.lr_min)
        return max(0.0, self.rho_min + (self.rho_max - self.rho_min) * ratio)

    def _prepare_sam_step(self) -> None:
        rho = self.current_rho()
        for group in self.param_groups:
            group['rho'] = rho

    @torch.no_grad()
    def _transform_second_grad(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """h <- h - alpha (g - (g.h / ||h||^2) h) over all parameters (one global projection)."""
        pairs = [(p.grad, clean[p]) for p in params if p in clean]
        if self.alpha == 0 or not pairs:
            return
        grads = [h for h, _ in pairs]
        cleans = [g for _, g in pairs]
        hh = float(total_norm(grads)) ** 2
        if not math.isfinite(hh) or hh == 0:
            return
        device = grads[0].device
        gh = float(torch.stack([torch.vdot(h.reshape(-1), g.reshape(-1)).to(device) for h, g in pairs]).sum())
        torch._foreach_mul_(grads, 1.0 + self.alpha * gh / hh)
        torch._foreach_add_(grads, cleans, alpha=-self.alpha)

    # ---- state dict: the GSAM settings travel with SAM's ------------------------------------------

    def _sam_state(self) -> Dict[str, Any]:
        return dict(super()._sam_state(), rho_max=self.rho_max, rho_min=self.rho_min, alpha=self.alpha,
                    lr_max=self.lr_max, lr_min=self.lr_min)

    def _checked_sam_state(self, sam_state: Any) -> Dict[str, Any]:
        merged = super()._checked_sam_state(sam_state)
        _check_gsam(merged['rho_max'], merged['rho_min'], merged['alpha'], merged['lr_max'], merged['lr_min'],
                    where=' in the loaded state dict')
        return merged

    def _apply_sam_state(self, settings: Dict[str, Any]) -> None:
        super()._apply_sam_state(settings)
        self.rho_max, self.rho_min, self.alpha = settings['rho_max'], settings['rho_min'], settings['alpha']
        self.lr_max, self.lr_min = float(settings['lr_max']), float(settings['lr_min'])
