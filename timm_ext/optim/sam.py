""" SAM: Sharpness-Aware Minimization (and ASAM) around any timm/torch optimizer

Papers: 'Sharpness-Aware Minimization for Efficiently Improving Generalization' (Foret et al., 2021),
'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., 2022); ASAM: 'Adaptive Sharpness-Aware Minimization' (Kwon et al., 2021).

One update, as the paper writes it:

    g = grad L(w)                      # first pass, at w
    e = rho * g / ||g||                # one global L2 norm; ASAM: T = |w| + eta, e = rho T^2 g / ||T g||
    h = grad L(w + e)                  # second pass, same dropout / drop-path masks as the first
    w = base_optimizer.step(w, h)      # from w, with the gradient taken at w + e

This file is that update (its arithmetic in ``sam_functional``), the hooks GSAM and LookSAM override, and the
state dict. ``step()`` hands its passes to its ``sam_step.StepDriver``, which calls the public methods below.
"""
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn as nn

from timm_ext.optim.base_optimizer import WrappedOptimizer, check_model
from timm_ext.optim.loss_scaling import NO_SCALING, LossScaling, explicit_scaling
from timm_ext.optim.sam_checkpoint import load_sam_state, sam_state_dict
from timm_ext.optim.sam_functional import clip_gradient_, hold_buffers_, restore_buffers_, sam_perturb_, sam_restore_
from timm_ext.optim.sam_settings import SAM_RHO, SAMSettings
from timm_ext.optim.sam_step import StepDriver

__all__ = ['SAM']


class SAM(WrappedOptimizer):
    """ Sharpness-Aware Minimization around any torch/timm optimizer.

    Args:
        params: the optimizer to wrap (an instance), or, as in davda54/sam, the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class, built as ``base_optimizer(params, **base_kwargs)``.
        rho: neighbourhood radius; a param group may carry its own ``rho``.
        adaptive: ASAM (scale-invariant neighbourhood ``T = |w| + eta``); per group allowed.
        eta: ASAM's offset in ``T``; per group allowed.
        clip_grad: clip the gradient SAM applies (the second-pass one); None for no clipping.
        clip_mode: 'norm', 'value' or 'agc' (timm's ``dispatch_clip_grad``); 'agc' leaves the head out.
        model: module whose buffers (BatchNorm statistics) keep their first-pass values and whose head AGC
            leaves out (timm's factory passes the one ``create_optimizer_v2`` got; train.py's task gives its own).
        interval: a SAM step every ``interval``-th update, a plain base-optimizer step in between.
        m_sharpness: images per perturbation: each worker's batch is cut into chunks of this many images,
            each ascends with its own gradient, and the descent gradient is the chunks' mean (``m_sharpness``).
        **base_kwargs: davda54/sam style: the base optimizer's arguments (``lr``, ``momentum``, ...).

    Three ways to drive it: ``step(closure)`` (torch's or davda54/sam's closure convention); ``first_step()`` and
    ``second_step()`` around your second forward-backward; ``step()`` over timm's training task (``replay_timm_task``).
    """
    _step_supports_amp_scaling = True  # GradScaler.step(sam) hands SAM the scale (see loss_scaling)
    Settings = SAMSettings  # a family's settings: its checks, its state-dict entry, its repr
    needs_clean_gradient = False  # hook: keep the first-pass gradient g for the hooks (GSAM, LookSAM)
    _copied = ('base_optimizer', 'settings', 'model', '_updates', '_perturbed', '_skip')

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = SAM_RHO,
            adaptive: bool = False,
            eta: float = 0.01,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
            interval: int = 1,
            m_sharpness: Optional[int] = None,
            **base_kwargs: Any,
    ) -> None:
        given = dict(rho=rho, adaptive=adaptive, eta=eta, clip_grad=clip_grad, clip_mode=clip_mode,
                     interval=interval, m_sharpness=m_sharpness)
        names = self.Settings.init_names()  # a family's own settings arrive through **base_kwargs
        given.update({name: base_kwargs.pop(name) for name in names if name in base_kwargs})
        self.settings = self.Settings(**{name: value for name, value in given.items() if name in names})
        self._wrap(params, base_optimizer, base_kwargs, (*names, 'model'), self.Settings.family)
        self.set_model(model)
        self.defaults.update(self.settings.group_defaults())
        self._add_group_defaults()
        self._updates = 0  # updates done, SAM or plain: decides which one is due
        self._perturbed: Optional[List[torch.Tensor]] = None
        self._skip = False  # this update overflowed in fp16: restore, step nothing
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._backup: Dict[torch.Tensor, torch.Tensor] = {}  # w during the second pass (allocated once)
        self._clean: Dict[torch.Tensor, torch.Tensor] = {}  # g, for the hooks that need it
        self._buffer_copies: Dict[torch.Tensor, torch.Tensor] = {}  # the model's buffers during the second pass
        self._held: Optional[List[torch.Tensor]] = None  # the buffers held this update
        self._warned: set = set()
        self.driver = StepDriver([p for group in self.param_groups for p in group['params']])  # runs step()
        self._init_wrapper()

    def _add_group_defaults(self) -> None:
        for idx, group in enumerate(self.param_groups):
            group.update({k: v for k, v in self.settings.group_defaults().items() if k not in group})
            self.settings.check_group(group, where=f' in param group {idx}')

    def set_model(self, model: Optional[nn.Module]) -> None:  # whose buffers SAM holds, whose head AGC leaves out
        check_model(model, self.Settings.family)
        self.model = model

    sam_step_due = property(lambda self: self._updates % self.settings.interval == 0,
                            doc='Whether the next update is a SAM step (every interval-th, the first one included).')

    perturbed = property(lambda self: self._perturbed is not None, doc='Between first_step() and second_step().')
    update_skipped = property(lambda self: self._skip, doc='This update\'s first pass overflowed (fp16).')

    def clean_gradients(self) -> Dict[torch.Tensor, torch.Tensor]:
        return self._clean  # g of the last ascent per parameter, when needs_clean_gradient (GSAM, LookSAM)

    def extra_memory_bytes(self) -> int:  # beside the base optimizer: the copy of w (GSAM/LookSAM: of g) and buffers
        kept = list(self._backup.values()) + list(self._clean.values()) + list(self._buffer_copies.values())
        return sum(t.numel() * t.element_size() for t in kept)

    def params_with_grad(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group['params'] if p.grad is not None]

    @torch.no_grad()
    def perturb(self) -> float:
        """Back w up and move to w + e with the gradient at hand (at its true scale). Returns ||g||
        (ASAM: ||T g||); a zero or non-finite norm leaves w where it is. ``restore()`` undoes it."""
        if self._perturbed is not None:
            raise RuntimeError('SAM.perturb() was called twice; call restore() (or second_step()) first')
        groups = [(g, ps) for g in self.param_groups if (ps := [p for p in g['params'] if p.grad is not None])]
        norm = sam_perturb_(groups, self._backup, self._clean if self.needs_clean_gradient else None)
        self._perturbed = [p for _, ps in groups for p in ps]
        return norm

    @torch.no_grad()
    def restore(self) -> None:
        """Put back, bit-exactly, the weights ``perturb()`` moved."""
        perturbed, self._perturbed = self._perturbed or [], None
        sam_restore_(perturbed, self._backup)

    @torch.no_grad()
    def cancel_step(self) -> None:
        """Abandon a step begun by ``first_step()``: weights and buffers back as they were at w, nothing stepped."""
        self._skip = False
        self.restore()
        self.release_buffers()

    @torch.no_grad()
    def first_step(self, zero_grad: bool = True, grad_scaler: Optional[Any] = None) -> None:
        """After the backward at w: move to w + e, consuming the gradient (set to None unless not ``zero_grad``).
        ``grad_scaler`` (fp16) unscales it first; an inf/NaN makes this update a skipped one."""
        if self.settings.m_sharpness:
            raise RuntimeError(f'SAM m_sharpness={self.settings.m_sharpness} needs SAM to run the passes per '
                               f'chunk: use step(closure) or train.py\'s task route, not first_step()/second_step()')
        if self._perturbed is not None:
            raise RuntimeError('SAM.first_step() was called twice; call second_step() after the second backward')
        if not self.params_with_grad():
            raise RuntimeError('SAM.first_step() found no gradients: run forward and backward at w first')
        self.driver.close_replay()  # an explicit loop never needs the training task's replay
        self.warn_unknown_model()
        self.ascend(explicit_scaling(grad_scaler))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False, grad_scaler: Optional[Any] = None) -> None:
        """After the backward at w + e: back to w bit-exactly, then the base optimizer's step with that gradient."""
        scaling = explicit_scaling(grad_scaler)
        descend = self.descend(scaling)
        self.release_buffers()
        self.apply_descent(descend, scaling, self._clean, zero_grad)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[..., Any]] = None, grad_scaler: Optional[Any] = None,
             no_sync: Optional[Callable[[], Any]] = None) -> Optional[Any]:
        """One update (a plain one when ``interval`` says so); after ``first_step()``, the rest of it. ``closure``:
        torch's convention (it zeroes, back-propagates and returns the loss; run at w and w + e; the loss at w is
        returned) or davda54/sam's (your backward at w came first; run at w + e only; None returned); none: timm's
        training task replayed. ``grad_scaler``: the closure's fp16 scaler; ``no_sync``: the first pass runs in it."""
        return self.driver.step(self, closure, grad_scaler, no_sync)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)
        self.driver.left.zeroed([p for group in self.param_groups for p in group['params']], set_to_none)

    def ascend(self, scaling: LossScaling = NO_SCALING) -> None:
        """Unscale g, perturb (GSAM sets rho first; buffers held); an overflowed first pass skips the update."""
        scaling.unscale_first(self)
        self.prepare_sam_step()
        self.hold_buffers()
        self._skip = scaling.first_overflowed(self.perturb())

    def descend(self, scaling: LossScaling = NO_SCALING) -> bool:
        """Back to w; the second-pass gradient unscaled and adjusted. False: this update is skipped."""
        if self._perturbed is None:
            raise RuntimeError('SAM.second_step() was called before first_step()')
        self.restore()
        skip, self._skip = self._skip, False
        if skip or not scaling.unscale_second(self.base_optimizer):
            return False
        self.adjust_sam_gradient(self.params_with_grad(), self._clean)
        return True

    def apply_descent(self, descend: bool, scaling: LossScaling, clean: Dict[torch.Tensor, torch.Tensor],
                      zero_grad: bool = False) -> None:
        """The base optimizer's step with the (adjusted) second-pass gradient; a skipped update when not ``descend``."""
        if not descend:  # fp16 overflow: a skipped step (the scaler backs off)
            self.zero_grad()
            self._updates += 1
            return
        self.observe_sam_gradient(self.params_with_grad(), clean)
        self._clip()
        scaler = scaling.step_scaler()  # fp16: GradScaler.step skips the step if the second pass overflowed
        if scaler is None:
            self.base_optimizer.step()
        else:
            scaler.step(self.base_optimizer)
        scaling.after_step()
        self._updates += 1
        self.after_sam_step()
        if zero_grad:
            self.zero_grad()

    def plain_step(self, scaling: LossScaling = NO_SCALING) -> None:
        """The base optimizer's step with the gradient at hand (``interval``): unscaled, overflow-checked, clipped."""
        scaling.unscale_first(self)
        params = self.params_with_grad()
        if scaling is not NO_SCALING and params and scaling.gradient_overflowed(params):
            self.apply_descent(False, scaling, {})
            return
        self.adjust_plain_gradient(params)
        self._clip()
        self.base_optimizer.step()
        self._updates += 1

    def _clip(self) -> None:
        if self.settings.clip_grad is not None:
            mode = self.settings.clip_mode
            module = self._module('AGC cannot leave the classifier head out') if mode == 'agc' else None
            clip_gradient_(self.params_with_grad(), self.settings.clip_grad, mode, module)

    def hold_buffers(self) -> None:
        """Copy the model's buffers (BatchNorm statistics), once per update, so the second pass cannot move them."""
        if self._held is None:
            self._held = hold_buffers_(self.model, self._buffer_copies)

    def release_buffers(self) -> None:  # the held buffers back to their first-pass values
        if self._held is not None:
            restore_buffers_(self._held, self._buffer_copies)
        self._held = None

    def warn_unknown_model(self) -> None:  # once, when SAM has no model
        self._module('its buffers (BatchNorm statistics) are updated by both passes')

    def _module(self, purpose: str) -> Optional[nn.Module]:  # warns once per purpose when SAM has no model
        if self.model is None and purpose not in self._warned:
            self._warned.add(purpose)
            warnings.warn(f'SAM does not know the model, so {purpose}: pass model= to SAM or to '
                          f'create_optimizer_v2 (or call optimizer.set_model(model)) when driving SAM with '
                          f'first_step()/second_step() or a closure', stacklevel=5)
        return self.model

    # ---- hooks for SAM variants (SAM: nothing) ----------------------------------------------------------

    def prepare_sam_step(self) -> None:
        """Before each perturbation (GSAM sets this step's rho in the groups)."""

    def adjust_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """Turn the unscaled second-pass ``p.grad`` into the one applied; ``clean[p]`` is g (GSAM's decomposition)."""

    def observe_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """See the gradient a SAM step is about to apply, and g (LookSAM keeps its new direction)."""

    def after_sam_step(self) -> None:
        """After a SAM step's base step: its per-parameter state exists now (LookSAM stores g_v there)."""

    def adjust_plain_gradient(self, params: List[torch.Tensor]) -> None:
        """Change the gradient of a plain (non-SAM) step before it is applied (LookSAM's reuse)."""

    # ---- checkpoints, copies, repr ----------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The base optimizer's (groups carry rho/adaptive/eta) + ``"sam"``: settings and update count, for resume."""
        return self._with_state_dict_hooks(lambda: sam_state_dict(
            self.base_optimizer, self.settings, self._updates, self.driver.state_dict()))

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """A SAM state dict, or the base optimizer's: all checked first; its settings win, each change logged."""
        def load(state_dict: Dict[str, Any]) -> None:
            self.settings, self._updates, entry = load_sam_state(
                self.base_optimizer, self.settings, self._updates, self.driver.state_dict(), state_dict)
            self.driver.load_state_dict(entry)
            self._add_group_defaults()
        self._with_load_state_dict_hooks(state_dict, load)

    def __getstate__(self) -> Dict[str, Any]:
        if self._perturbed is not None:
            raise RuntimeError('SAM cannot be copied or pickled between first_step() and second_step()')
        return super().__getstate__()

    def __repr__(self) -> str:
        values = ', '.join(f'{k}={v!r}' for k, v in self.settings.optimizer_values().items())
        return f'{self.Settings.family}({self.base_optimizer!r}, {values})'
