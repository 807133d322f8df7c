""" SAM-ON: SAM with only the normalization layers' parameters perturbed, as a SAM variant

Paper: Mueller et al., *Normalization Layers Are All That Sharpness-Aware Minimization Needs*, NeurIPS 2023,
https://arxiv.org/abs/2306.04226 (official code: mueller-mp/SAM-ON). Written from the paper; no library has it.

SAM-ON is SAM whose ascent moves only the affine parameters of the normalization layers (BatchNorm, LayerNorm,
GroupNorm, ... and timm's norm layers): with g_N the first-pass gradient of those parameters,

    e_N = rho * g_N / ||g_N||           # the other parameters stay at w
    h = grad L(w + e_N)                 # every parameter's gradient there
    w = base_optimizer.step(w, h)       # every parameter descends

The paper finds this as good as or better than SAM on CIFAR and ImageNet, for the same two passes (the backward
still computes every gradient); what it saves is the copy of the other weights and their move. ``only_norm=False``
is SAM (tested). ASAM's scale-invariant neighbourhood (``adaptive=True``) applies to the normalization parameters.

What is ours: everything SAM has (train.py replay, closures, explicit steps, fp16, accumulation, DDP, FSDP2,
m-sharpness, interval, resume). SAM-ON needs the model to find its normalization layers: timm's factory hands it the
one ``create_optimizer_v2`` was given; built by hand, pass ``model=``. Without one (timm's factory over bare
parameters, as timm's own optimizer tests build it) it warns once and perturbs every parameter, as SAM; a model
without normalization parameters among the optimized ones is refused in one line.
"""
import warnings
from typing import Any, FrozenSet, Optional

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import SAM_RHO, SAMONSettings

__all__ = ['NO_MODEL', 'SAMON', 'is_normalization']

NO_MODEL = ('SAM-ON was not given the model, so it cannot find the normalization layers: it perturbs every parameter, '
            'as SAM does, until it is: pass model=<the nn.Module> (timm\'s create_optimizer_v2 passes the one it is '
            'given) or call set_model(model)')

# where torch and timm define their normalization layers (timm's subclass torch's or live in timm.layers.norm*)
_NORM_MODULES = ('torch.nn.modules.batchnorm', 'torch.nn.modules.instancenorm', 'torch.nn.modules.normalization',
                 'timm.layers.norm', 'timm.layers.norm_act')
_NORM_BASES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


def is_normalization(module: nn.Module) -> bool:
    """A normalization layer of torch's or timm's (BatchNorm, LayerNorm, GroupNorm, RmsNorm, ..., their Act forms)."""
    return isinstance(module, _NORM_BASES) or type(module).__module__.startswith(_NORM_MODULES)


class SAMON(SAM):
    """ SAM-ON around any torch/timm optimizer (a :class:`SAM` whose ascent moves only the normalization layers).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class.
        rho: SAM's radius, over the normalization parameters.
        only_norm: perturb only the normalization layers' parameters (False: every parameter, SAM).
        model: the module whose normalization layers are perturbed (required; timm's factory gives it).
        adaptive, eta, clip_grad, clip_mode, interval, m_sharpness, use_gc: as for :class:`SAM`.
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """
    Settings = SAMONSettings

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = SAM_RHO,
            only_norm: bool = True,
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
                         use_gc=use_gc, only_norm=only_norm, **base_kwargs)

    def set_model(self, model: Optional[nn.Module]) -> None:
        """The model whose normalization layers are perturbed (one line if there is none, or none of its
        normalization parameters is among those this optimizer steps)."""
        super().set_model(model)
        self._norm_params = self._find_norm_params()
        if self.settings.only_norm and model is None:  # timm's factory over bare parameters (its own tests) too
            warnings.warn(NO_MODEL, stacklevel=3)
        elif self.settings.only_norm and not self._norm_params:
            raise ValueError(f'SAM-ON found no normalization layer parameters of {type(model).__name__} among the '
                             f'parameters it optimizes: use sam (every parameter perturbed) for this model')

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._norm_params = self._find_norm_params()  # a copy's or a pickle's: found again in its own model

    def _find_norm_params(self) -> FrozenSet[torch.Tensor]:
        model = getattr(self, 'model', None)
        if model is None:
            return frozenset()
        ours = {p for group in self.param_groups for p in group['params']}
        return frozenset(ours.intersection(p for m in model.modules() if is_normalization(m)
                                           for p in m.parameters(recurse=False)))

    def sam_parameters(self) -> Optional[FrozenSet[torch.Tensor]]:
        """The parameters the ascent moves: the normalization layers' (None: every one, ``only_norm=False`` or no
        model to find them in)."""
        return self._norm_params if self.settings.only_norm and self.model is not None else None
