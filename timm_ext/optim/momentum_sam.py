""" Momentum-SAM: SAM's perturbation taken along the base optimizer's momentum, with no second pass

Paper: Becker et al., *Momentum-SAM: Sharpness Aware Minimization without Computational Overhead*,
https://arxiv.org/abs/2401.12033 (official code: MarlonBecker/MSAM). Written from the paper; no library has it.

With v the base optimizer's momentum (SGD's ``momentum_buffer``, Adam's and its kin's ``exp_avg``), one update is

    h = grad L(w - rho * v / ||v||)    # the one forward-backward, at the displaced weights
    w = base_optimizer.step(w, h)      # from w; v moves with it, and so does the next displacement

``rho = 0`` (or a zero momentum, as before the first step) is the base optimizer. The official code keeps the weights
displaced between steps; here, given the model, a forward pre-hook displaces them at the first training forward after
a step and ``step()`` puts them back (the same displacement subtracted, as the official code does: no copy of the
weights), so evaluation, checkpoints and timm's model EMA see w, and a resumed run displaces from the loaded momentum.
Without a model it warns once: ``step(closure)`` displaces the weights around its closure; ``step()`` after your own
backward leaves them displaced for the next one, as the official code (``restore()`` puts them back; copies, pickles
and state dicts say whether they are). A base optimizer with no momentum is refused in one line; so are the settings
that concern a second pass, which it has not (``adaptive``, ``interval``, ``m_sharpness``, ``use_gc``), and sharded
(FSDP2) parameters.
"""
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import MSAM_RHO, MomentumSAMSettings
from timm_ext.optim.training_forward import displace_on_training_forward

__all__ = ['MOMENTUM_KEYS', 'MomentumSAM', 'NO_MODEL']

MOMENTUM_KEYS = ('momentum_buffer', 'exp_avg')  # torch's and timm's SGD/LARS, and Adam's kin (Lamb, Lion, Adan, ...)
MOMENTUM_BASES = 'sgd (momentum > 0), momentum, nesterov, sgdw, lars, adam, adamw, nadam, nadamw, radam, lamb, lion, ' \
                 'adan, adopt'
NO_MODEL = ('Momentum-SAM was not given the model: after step() without a closure the weights stay at '
            'w - rho v / ||v||, as in the paper\'s code (call restore() before evaluating or saving them); pass '
            'model=<the nn.Module> (timm\'s create_optimizer_v2 passes the one it is given) so that only training '
            'forwards see them displaced')


class MomentumSAM(SAM):
    """ Momentum-SAM around any torch/timm optimizer with momentum (one forward-backward per step).

    Args:
        params: the optimizer to wrap, or (davda54/sam style) the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class (it must keep a momentum).
        rho: the displacement's length, ``rho * v / ||v||`` (the paper's runs: 3, its SAM runs 0.2).
        clip_grad, clip_mode: as for :class:`SAM` (the one gradient is clipped).
        model: the module whose training forwards see the displaced weights (timm's factory gives it).
        **base_kwargs: davda54/sam style: the base optimizer's arguments.
    """
    Settings = MomentumSAMSettings
    _step_supports_amp_scaling = False  # one pass: torch's GradScaler unscales, and skips an overflowed step, itself

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = MSAM_RHO,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
            **base_kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, clip_grad=clip_grad, clip_mode=clip_mode, model=model,
                         **base_kwargs)
        self._check_momentum()
        if self._sharded:
            raise ValueError('Momentum-SAM does not support sharded (FSDP2) parameters yet: use samadamw there')

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._due = False  # a step was taken: the next training forward displaces the weights
        self._displaced: Optional[List[torch.Tensor]] = None  # the parameters displace() moved

    def _check_momentum(self) -> None:
        """One line if the base optimizer keeps no momentum (SGD with momentum 0, Adagrad, ...)."""
        for group in self.base_optimizer.param_groups:
            no_momentum = 'momentum' in group and not group['momentum'] > 0
            if no_momentum or not ('momentum' in group or 'betas' in group):
                detail = f' (momentum={group["momentum"]!r})' if no_momentum else ''
                raise ValueError(f'Momentum-SAM needs a base optimizer with momentum, got '
                                 f'{type(self.base_optimizer).__name__}{detail}: bases it can wrap: {MOMENTUM_BASES}')

    def set_model(self, model: Optional[nn.Module]) -> None:
        """The model whose training forwards displace the weights (a forward pre-hook, removed with the model)."""
        super().set_model(model)
        old = getattr(self, '_hook', None)
        if old is not None:
            old.remove()
        self._hook = None if model is None else model.register_forward_pre_hook(displace_on_training_forward(self))
        if model is None:
            warnings.warn(NO_MODEL, stacklevel=3)

    def first_step(self, zero_grad: bool = True, grad_scaler: Optional[Any] = None) -> None:
        raise RuntimeError('Momentum-SAM has one pass: call step() after your backward (no first_step/second_step)')

    second_step = first_step

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Optional[Any]:
        """The base optimizer's step from w with the gradient taken at the displaced weights (``closure``, if
        given, runs the forward-backward first); then the next displacement is due."""
        loss = None
        if closure is not None:
            if self.model is None:
                self.displace()  # around the closure (with a model, its forward pre-hook does it)
            with torch.enable_grad():
                loss = closure()
        if self.replay is not None:
            self.replay.close()  # one pass: train.py's task is never replayed
        if not self.params_with_grad():
            return loss  # nothing to step: the weights stay where they are
        self.restore()
        if self.settings.clip_grad is not None:
            self._clip()
        self.base_optimizer.step()
        self._updates += 1
        self._due = True
        if self.model is None and closure is None:
            self.displace()  # your next backward, with no model to hook, is at the displaced weights
        return loss

    @torch.no_grad()
    def displace(self) -> None:
        """Move to ``w - rho v / ||v||`` (each group's rho, one norm over every momentum); a zero or non-finite
        norm (no step yet) leaves w where it is. ``restore()`` undoes it."""
        self._due = False
        if self._displaced is None:
            self._displaced = self._move(-1.0) or None

    @torch.no_grad()
    def restore(self) -> None:
        """Back to w: the same displacement subtracted (v has not moved since), as the paper's code does; no copy
        of the weights is kept (one rounding per step in the weights' dtype)."""
        if self._displaced is not None:
            self._displaced = None
            self._move(1.0)

    @torch.compiler.disable  # eager under a compiled step: traced, ||v|| became a constant, a graph per momentum state
    def _move(self, sign: float) -> List[torch.Tensor]:
        """w += sign * rho * v / ||v|| over the parameters with a momentum; the parameters moved."""
        groups = self._momenta()
        norm = float(self._norm([m for _, _, ms in groups for m in ms])) if groups else 0.0
        if not (math.isfinite(norm) and norm > 0):
            return []
        for group, params, momenta in groups:
            if group['rho'] > 0:
                torch._foreach_add_(params, momenta, alpha=sign * group['rho'] / norm)
        return [p for _, ps, _ in groups for p in ps]

    def _momenta(self) -> List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor]]]:
        """(group, its parameters with a momentum, their momenta) for every group that has some."""
        groups = []
        for group in self.base_optimizer.param_groups:
            pairs = [(p, momentum) for p in group['params'] if (momentum := self._momentum(p)) is not None]
            if pairs:
                groups.append((group, [p for p, _ in pairs], [m for _, m in pairs]))
        return groups

    def _momentum(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        state = self.base_optimizer.state.get(p)
        if not state:
            return None  # no step yet for this parameter: v = 0
        for key in MOMENTUM_KEYS:
            if isinstance(state.get(key), torch.Tensor):
                return state[key]
        raise RuntimeError(f'Momentum-SAM found no momentum ({" or ".join(MOMENTUM_KEYS)}) in '
                           f'{type(self.base_optimizer).__name__}\'s state: bases it can wrap: {MOMENTUM_BASES}')

    def state_dict(self) -> Dict[str, Any]:
        """SAM's, with ``"displaced"`` in the ``"sam"`` entry: whether the weights are displaced now (as saved)."""
        state_dict = super().state_dict()
        state_dict['sam'] = dict(state_dict['sam'], displaced=self._displaced is not None)
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load at w (this optimizer's weights put back first); weights saved displaced are taken as displaced."""
        self.restore()
        entry = dict(state_dict.get('sam') or {})
        displaced = entry.pop('displaced', False)
        super().load_state_dict(dict(state_dict, sam=entry) if 'sam' in state_dict else state_dict)
        self._due = True
        self._mark_displaced(displaced)

    def __getstate__(self) -> Dict[str, Any]:
        return dict(super().__getstate__(), _was_displaced=self._displaced is not None)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        displaced = state.pop('_was_displaced', False)
        super().__setstate__(state)
        self._mark_displaced(displaced)

    def _mark_displaced(self, displaced: bool) -> None:
        """Take the weights as displaced by the current momentum (a copy's, a pickle's, a loaded state's)."""
        self._displaced = [p for _, ps, _ in self._momenta() for p in ps] or None if displaced else None
