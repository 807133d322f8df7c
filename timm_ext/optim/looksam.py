""" LookSAM: SAM every k steps, and the SAM gradient's new direction reused in between

Paper: 'Towards Efficient and Scalable Sharpness-Aware Minimization' (Liu et al., CVPR 2022),
https://arxiv.org/abs/2203.02714 (Algorithm 1). No official code was published.

Every ``interval``-th step (k in the paper) is a full SAM step: clean gradient g at w, perturbed
gradient g_s at w + e, and LookSAM keeps the part of g_s orthogonal to g,

    g_v = g_s - (g.g_s / ||g||^2) g

(the component that only the perturbation adds). The k - 1 steps in between take one
forward-backward: their gradient g is moved along the kept direction,

    g_s = g + alpha * (||g|| / ||g_v||) * g_v

and the base optimizer steps with g_s. Norms and projections are global (one vector of all
parameters), as in Algorithm 1; ``pytorch_optimizer.LookSAM`` computes them per tensor instead.
Cost: 2 forward-backward passes every k steps, 1 otherwise, i.e. (k + 1) / k passes per step on
average, plus one kept copy of the gradient (g_v).

What is ours: everything SAM has (train.py replay, which LookSAM skips on reuse steps; closures;
fp16 GradScaler; accumulation; DDP; m-sharpness; resume with g_v in the state dict).
"""
import math
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import LOOKSAM_ALPHA, LOOKSAM_INTERVAL, SAM_RHO, LookSAMSettings
from timm_ext.optim.torch_compat import total_norm

__all__ = ['LookSAM', 'LOOKSAM_ALPHA', 'LOOKSAM_INTERVAL']


class LookSAM(SAM):
    """ LookSAM around any torch/timm optimizer (a :class:`SAM` whose non-SAM steps reuse g_v).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class.
        rho: SAM's radius on the full SAM steps.
        alpha: weight of the reused direction, in [0, 1).
        interval: k, a full SAM step every k-th step (the first one included).
        adaptive, eta, clip_grad, clip_mode, model, m_sharpness: as for :class:`SAM`.
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """
    Settings = LookSAMSettings
    needs_clean_gradient = True

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = SAM_RHO,
            alpha: float = LOOKSAM_ALPHA,
            interval: int = LOOKSAM_INTERVAL,
            adaptive: bool = False,
            eta: float = 0.01,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
            m_sharpness: Optional[int] = None,
            **base_kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, adaptive=adaptive, eta=eta, clip_grad=clip_grad,
                         clip_mode=clip_mode, model=model, interval=interval, m_sharpness=m_sharpness, alpha=alpha,
                         **base_kwargs)
        self._gv: Dict[torch.Tensor, torch.Tensor] = {}  # g_v of the last SAM step, per parameter

    @torch.no_grad()
    def observe_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """g_v = g_s - (g.g_s / ||g||^2) g, kept until the next SAM step."""
        pairs = [(p, p.grad, clean[p]) for p in params if p in clean and p.grad is not None]
        if not pairs or not math.isfinite(float(total_norm([s for _, s, _ in pairs]))):
            return  # an fp16 overflow (the step is skipped): keep the previous g_v
        self._gv = {}
        gg = float(total_norm([g for _, _, g in pairs])) ** 2
        device = pairs[0][1].device
        gs_g = float(torch.stack([torch.vdot(s.reshape(-1), g.reshape(-1)).to(device) for _, s, g in pairs]).sum())
        coef = gs_g / gg if gg > 0 else 0.0
        for p, s, g in pairs:
            self._gv[p] = torch.add(s, g, alpha=-coef)

    @torch.no_grad()
    def adjust_plain_gradient(self, params: List[torch.Tensor]) -> None:
        """g <- g + alpha (||g|| / ||g_v||) g_v (nothing before the first SAM step)."""
        pairs = [(p.grad, self._gv[p]) for p in params if p in self._gv]
        alpha = self.settings.alpha
        if not pairs or alpha == 0:
            return
        gv_norm = float(total_norm([v for _, v in pairs]))
        if not gv_norm > 0:
            return
        g_norm = float(total_norm([p.grad for p in params]))
        torch._foreach_add_([g for g, _ in pairs], [v for _, v in pairs], alpha=alpha * g_norm / gv_norm)

    # ---- state dict: g_v travels in the "sam" entry, in parameter order --------------------------

    def _params(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group['params']]

    def extra_state(self) -> Dict[str, Any]:
        gv = [self._gv.get(p) for p in self._params()] if self._gv else None
        return {'looksam_gv': gv}

    def check_extra_state(self, entry: Dict[str, Any]) -> None:
        gv = entry['looksam_gv']
        params = self._params()
        if gv is not None and (not isinstance(gv, (list, tuple)) or len(gv) != len(params) or any(
                v is not None and (not isinstance(v, torch.Tensor) or v.shape != p.shape) for v, p in zip(gv, params))):
            raise ValueError(f'LookSAM looksam_gv in the loaded state dict must be a list of {len(params)} '
                             f'tensors shaped like the parameters (or None)')

    def load_extra_state(self, entry: Dict[str, Any]) -> None:
        self._gv = {p: v.detach().to(device=p.device, dtype=p.dtype, copy=True)
                    for p, v in zip(self._params(), entry['looksam_gv'] or []) if v is not None}
