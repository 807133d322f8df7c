""" ESAM: Efficient Sharpness-Aware Minimization, as a SAM variant

Paper: Du et al., *Efficient Sharpness-aware Minimization for Improved Training of Neural Networks*, ICLR 2022,
https://arxiv.org/abs/2110.03141 (official code: dydjw9/Efficient_SAM). Written from the paper; no library has it.

ESAM cuts SAM's second pass two ways:

* Stochastic Weight Perturbation (SWP): each SAM step perturbs a random subset of the parameter tensors, each kept
  with probability ``weight_fraction`` (beta), with the radius divided by beta: ``e = (rho / beta) m g / ||m g||``;
* Sharpness-sensitive Data Selection (SDS): the second pass runs on the ``data_fraction`` (gamma) of the batch whose
  loss the perturbation raised most, ``L_i(w + e) - L_i(w)`` (one forward without gradient at w + e ranks them).

``weight_fraction = data_fraction = 1`` is SAM (tested). Where ours differs from the official code: the subset is
drawn from a generator seeded by ``seed`` and the update count, the same on every process and on resume (official:
Python's ``random``, per process); the first pass computes every gradient (official: the frozen tensors'
``requires_grad`` is off, which also saves their weight gradients); SDS keeps exactly ``max(1, int(gamma * B))``
samples (official: those above the k-th largest, k - 1 of them without ties).

Routes: SWP everywhere SAM runs. SDS needs each sample's loss: in timm's train.py (the task's logits at w are kept,
one forward at w + e ranks them, the second pass replays the chosen rows) and in your loop with ``first_step()``,
``select_samples(before, after)`` and ``second_step()``; ``step(closure)`` and ``m_sharpness`` take
``data_fraction=1`` only (one line otherwise), so 1 is the default (timm's own optimizer tests, Lightning and torch
drive closures); the paper's 0.5 is set in ``recipes/examples/esam.yaml``.
"""
from typing import Any, Callable, FrozenSet, Optional

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import ESAM_FRACTION, SAM_RHO, ESAMSettings

__all__ = ['ESAM']


class ESAM(SAM):
    """ ESAM around any torch/timm optimizer (a :class:`SAM` over a random subset of weights and of samples).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class.
        rho: SAM's radius (divided by ``weight_fraction`` for the subset perturbed).
        weight_fraction: the probability that a parameter tensor is perturbed at a SAM step, in (0, 1].
        data_fraction: the fraction of each batch the second pass runs on, in (0, 1] (the paper's runs: 0.5; 1 by
            default, the one value every route takes, ``step(closure)`` included).
        seed: seeds the draw of the perturbed tensors (with the update count: the same on every process).
        adaptive, eta, clip_grad, clip_mode, model, interval, m_sharpness, use_gc: as for :class:`SAM`.
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """
    Settings = ESAMSettings

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = SAM_RHO,
            weight_fraction: float = ESAM_FRACTION,
            data_fraction: float = 1.0,
            seed: int = 0,
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
                         use_gc=use_gc, weight_fraction=weight_fraction, data_fraction=data_fraction, seed=seed,
                         **base_kwargs)

    @property
    def sample_selector(self) -> Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        """``select_samples`` when the second pass runs on part of the batch (timm's task replay reads it)."""
        return self.select_samples if self.settings.data_fraction < 1 else None

    def select_samples(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """The indices of the ``max(1, int(data_fraction * B))`` samples whose loss rose most from w (``before``,
        per sample) to w + e (``after``), in batch order: the rows of the second pass."""
        if before.shape != after.shape or before.dim() != 1:
            raise ValueError(f'ESAM select_samples takes two per-sample loss vectors of one shape, got '
                             f'{tuple(before.shape)} and {tuple(after.shape)}')
        keep = max(1, int(self.settings.data_fraction * before.numel()))
        return torch.topk((after - before).float(), keep).indices.sort().values

    def sam_parameters(self) -> Optional[FrozenSet[torch.Tensor]]:
        """This SAM step's perturbed tensors: each kept with probability ``weight_fraction`` (None: all of them)."""
        fraction = self.settings.weight_fraction
        if fraction >= 1:
            return None
        params = [p for group in self.base_optimizer.param_groups for p in group['params']]
        draw = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + self._updates)
        kept = torch.rand(len(params), generator=draw) < fraction
        return frozenset(p for p, keep in zip(params, kept.tolist()) if keep)

    @torch.no_grad()
    def perturb(self) -> float:
        """SAM's perturbation of the drawn tensors, at radius ``rho / weight_fraction``."""
        fraction = self.settings.weight_fraction
        radii = [group['rho'] for group in self.base_optimizer.param_groups]
        try:
            for group in self.base_optimizer.param_groups:
                group['rho'] = group['rho'] / fraction
            return super().perturb()
        finally:
            for group, rho in zip(self.base_optimizer.param_groups, radii):
                group['rho'] = rho

    @torch.no_grad()
    def step(self, closure: Optional[Callable[..., Any]] = None, grad_scaler: Optional[Any] = None,
             no_sync: Optional[Callable[[], Any]] = None) -> Optional[Any]:
        if closure is not None and self._perturbed is None and self.settings.data_fraction < 1:
            raise ValueError(f'ESAM data_fraction={self.settings.data_fraction} needs each sample\'s loss, which a '
                             f'closure does not give: use first_step(), select_samples(before, after) and '
                             f'second_step(), or timm\'s train.py; step(closure) takes data_fraction=1')
        return super().step(closure, grad_scaler, no_sync)
