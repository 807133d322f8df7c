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
fp16 GradScaler; accumulation; DDP; FSDP2; m-sharpness; resume with g_v in the per-parameter state).
"""
import math
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import LOOKSAM_ALPHA, LOOKSAM_INTERVAL, SAM_RHO, LookSAMSettings
from timm_ext.optim.sharded import global_dot, global_norm, like_param, local

__all__ = ['GV_KEY', 'LookSAM', 'LOOKSAM_ALPHA', 'LOOKSAM_INTERVAL']

GV_KEY = 'looksam_gv'  # g_v in the optimizer's per-parameter state
PARALLEL = 1e-3  # ||g_v|| / ||g_s|| below which g_s is g's direction (an angle under 0.06 degrees): nothing to reuse


class LookSAM(SAM):
    """ LookSAM around any torch/timm optimizer (a :class:`SAM` whose non-SAM steps reuse g_v).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class.
        rho: SAM's radius on the full SAM steps.
        alpha: weight of the reused direction, in [0, 1).
        interval: k, a full SAM step every k-th step (the first one included).
        adaptive, eta, clip_grad, clip_mode, model, m_sharpness, use_gc: as for :class:`SAM`.
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
            use_gc: bool = False,
            **base_kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, adaptive=adaptive, eta=eta, clip_grad=clip_grad,
                         clip_mode=clip_mode, model=model, interval=interval, m_sharpness=m_sharpness,
                         use_gc=use_gc, alpha=alpha,
                         **base_kwargs)

    @torch.no_grad()
    def observe_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """g_v = g_s - (g.g_s / ||g||^2) g, kept until the next SAM step."""
        params = [p for p in params if p in clean and p.grad is not None]
        sam_grads = [local(p.grad) for p in params]  # this rank's shards (sums span all ranks)
        cleans = [clean[p] for p in params]
        if not params or not math.isfinite(global_norm(sam_grads, params)):
            return  # an fp16 overflow (the step is skipped): keep the previous g_v
        gg = global_norm(cleans, params) ** 2
        coef = global_dot(sam_grads, cleans, params) / gg if gg > 0 else 0.0
        self._pending = {p: torch.add(s, g, alpha=-coef) for p, s, g in zip(params, sam_grads, cleans)}
        # g_s (nearly) parallel to g: g_v is then rounding, not a direction, and the reuse steps would scale it up to
        # alpha ||g||, differently in float32 and float64; below PARALLEL ||g_s|| it is kept as zero (no reuse)
        if global_norm(list(self._pending.values()), params) <= PARALLEL * global_norm(sam_grads, params):
            self._pending = {p: torch.zeros_like(gv) for p, gv in self._pending.items()}

    def after_sam_step(self) -> None:
        """g_v into the per-parameter state, after the base optimizer made its own (Adam starts from an empty one):
        saved, copied and sharded as a momentum buffer is."""
        pending, self._pending = getattr(self, '_pending', {}), {}
        for p, gv in pending.items():
            self.state[p][GV_KEY] = like_param(gv, p)

    @torch.no_grad()
    def adjust_plain_gradient(self, params: List[torch.Tensor]) -> None:
        """g <- g + alpha (||g|| / ||g_v||) g_v (nothing before the first SAM step)."""
        kept = [p for p in params if GV_KEY in self.state.get(p, {})]
        alpha = self.settings.alpha
        if not kept or alpha == 0:
            return
        gv = [local(self.state[p][GV_KEY]) for p in kept]
        gv_norm = global_norm(gv, kept)
        if not gv_norm > 0:
            return
        g_norm = global_norm([p.grad for p in params], params)
        torch._foreach_add_([local(p.grad) for p in kept], gv, alpha=alpha * g_norm / gv_norm)

