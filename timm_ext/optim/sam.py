""" SAM: Sharpness-Aware Minimization (and ASAM) as a wrapper around any timm/torch optimizer

Papers: 'Sharpness-Aware Minimization for Efficiently Improving Generalization' (Foret et al., 2021)
and 'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., 2022); ASAM: 'Adaptive Sharpness-Aware Minimization' (Kwon et al., 2021).

Each update evaluates the gradient twice: g at w, then the gradient at w + e, with
``e = rho * g / ||g||`` (one global L2 norm over all parameters; ASAM: ``T = |w| + eta``,
``e = rho * T^2 g / ||T g||``). The base optimizer then steps from w with the second gradient.
Both passes draw the same dropout / drop-path masks, as the paper's JAX code (one PRNG key per step).

What is ours (beyond the papers): the wrapper shares ``param_groups`` and ``state`` with its base
optimizer (timm schedulers, layer decay and EMA work unchanged), saves the base state, restores w
bit-exactly from a copy, keeps buffers (BatchNorm statistics) from the first pass, clips the
gradient it applies, handles ``GradScaler`` (fp16) inside ``step``, and, inside timm's train.py,
re-runs the training task itself (see ``timm_ext.optim.task_capture``).
"""
import logging
import math
import warnings
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Set, Tuple, Type, Union

import torch
import torch.nn as nn
from timm.models import model_parameters
from timm.utils import dispatch_clip_grad
from torch.optim import Optimizer

from timm_ext.optim._compat import foreach_copy_, total_norm
from timm_ext.optim.loss_scaling import (
    NO_SCALING,
    GradScalerArgument,
    GradScalerAttributes,
    LossScaling,
    SecondPassScale,
)
from timm_ext.optim.m_sharpness import (
    ClosureChunks,
    ReplayChunks,
    all_reduce_mean,
    check_m_sharpness,
    no_sync_of,
    sync_context,
    world_size,
)
from timm_ext.optim.module_buffers import BufferSnapshot
from timm_ext.optim.rng import RngState, cuda_devices_of
from timm_ext.optim.task_capture import RecorderState, TaskRecorder

__all__ = ['SAM']

_logger = logging.getLogger(__name__)

_CLIP_MODES = ('norm', 'value', 'agc')
_GROUP_SETTINGS = ('rho', 'adaptive', 'eta')
_HOOK_DICTS = (
    '_optimizer_step_pre_hooks', '_optimizer_step_post_hooks',
    '_optimizer_state_dict_pre_hooks', '_optimizer_state_dict_post_hooks',
    '_optimizer_load_state_dict_pre_hooks', '_optimizer_load_state_dict_post_hooks',
)
# what a copy or a pickle keeps; hooks, caches and the recorder are rebuilt (torch's optimizers drop hooks too)
_PERSISTENT = ('base_optimizer', 'sam_defaults', 'clip_grad', 'clip_mode', 'model', '_perturbed', '_skip',
               '_second_pass_scale', 'interval', 'm_sharpness', '_step_count')

_HOW_TO_USE = (
    'pass a closure (optimizer.step(closure)), call first_step() and second_step() around your second '
    'forward-backward, or train with timm\'s train.py (task API, timm >= 1.0.23), where SAM replays the task')


def _check_rho(rho: Any, where: str = '') -> None:
    if not isinstance(rho, (int, float)) or isinstance(rho, bool) or not rho >= 0 or math.isinf(rho):
        raise ValueError(f'SAM rho must be a finite number >= 0, got rho={rho!r}{where}')


def _check_eta(eta: Any, where: str = '') -> None:
    if not isinstance(eta, (int, float)) or isinstance(eta, bool) or not eta >= 0:
        raise ValueError(f'SAM eta must be >= 0, got eta={eta!r}{where}')


def _check_interval(interval: Any, where: str = '') -> None:
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f'SAM interval must be an integer >= 1 (a SAM step every interval-th step), '
                         f'got interval={interval!r}{where}')


def _check_clip(clip_grad: Any, clip_mode: Any, where: str = '') -> None:
    if clip_grad is not None and (isinstance(clip_grad, bool) or not isinstance(clip_grad, (int, float))
                                  or not clip_grad > 0):
        raise ValueError(f'SAM clip_grad must be > 0 or None, got clip_grad={clip_grad!r}{where}')
    if clip_mode not in _CLIP_MODES:
        raise ValueError(f'SAM clip_mode must be one of {_CLIP_MODES}, got clip_mode={clip_mode!r}{where}')


def _build_base(
        params: Any,
        base_optimizer: Any,
        base_kwargs: Dict[str, Any],
) -> Optimizer:
    """The optimizer SAM wraps: an instance given as is, or davda54/sam's ``(params, OptimizerClass, **kwargs)``."""
    if isinstance(params, Optimizer) or (params is None and isinstance(base_optimizer, Optimizer)):
        instance = params if isinstance(params, Optimizer) else base_optimizer
        extra = base_optimizer if instance is params else None
        if extra is not None or base_kwargs:
            given = ', '.join(sorted(base_kwargs)) or f'base_optimizer={extra!r}'
            raise ValueError(f'SAM got an optimizer instance and also base-optimizer arguments ({given}); '
                             f'pass either an instance, or params plus an optimizer class and its arguments')
        base = instance
    elif isinstance(base_optimizer, type) and issubclass(base_optimizer, Optimizer) and params is not None:
        base = base_optimizer(params, **base_kwargs)
    else:
        raise ValueError(
            f'SAM needs an optimizer instance to wrap, or params and an optimizer class '
            f'(SAM(params, torch.optim.SGD, rho=0.05, lr=0.1)), got {type(params).__name__} and '
            f'base_optimizer={base_optimizer!r}; build one first (e.g. torch.optim.SGD(params, lr=0.1)) '
            f'or use timm.optim.create_optimizer_v2')
    if isinstance(base, SAM):
        raise ValueError('SAM cannot wrap another SAM optimizer')
    return base


class SAM(Optimizer):
    """ Sharpness-Aware Minimization around any torch/timm optimizer.

    Args:
        params: the optimizer to wrap (any torch/timm optimizer instance), or, as in davda54/sam,
            the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class, built as
            ``base_optimizer(params, **base_kwargs)``.
        rho: neighbourhood radius; a param group may carry its own ``rho``.
        adaptive: ASAM (scale-invariant neighbourhood ``T = |w| + eta``); per group allowed.
        eta: ASAM's offset in ``T``.
        clip_grad: clip the gradient SAM applies (the second-pass gradient), None for no clipping.
        clip_mode: 'norm', 'value' or 'agc' (timm's ``dispatch_clip_grad`` modes); 'agc' leaves the
            classifier head out, as train.py does for its own AGC.
        model: module whose buffers keep their first-pass values (BatchNorm running statistics) and
            whose head AGC leaves out; found automatically inside timm's train.py and when the
            optimizer comes from ``create_optimizer_v2(model, ...)``.
        interval: a SAM step every ``interval``-th update and a plain base-optimizer step (one
            forward-backward) in between (Composer's scheme); 1 = SAM at every step.
        m_sharpness: images per perturbation: each worker's batch is cut into chunks of this many
            images, each chunk ascends with its own gradient and the descent gradient is the mean of
            the chunks' gradients at their own perturbed weights (``timm_ext.optim.m_sharpness``);
            None = one perturbation from the whole (all-reduced) batch.
        **base_kwargs: davda54/sam style: the base optimizer's arguments (``lr``, ``momentum``, ...).

    Three ways to drive it:
        * ``first_step()`` after backward at w, then backward at w + e, then ``second_step()``
          (always a SAM step; ``sam_step_due`` says whether ``interval`` asks for one, else call ``step()``);
        * ``step(closure)``: the closure zeroes grads, computes and back-propagates the loss, and
          returns it; ``step`` evaluates it at w and at w + e (same random masks) and returns the
          loss at w;
        * ``step()`` inside timm's train.py: the training task's calls since the last step are
          replayed at w + e under the same autocast and random state (and ``GradScaler``, if any).
    """
    _step_supports_amp_scaling = True  # GradScaler.step(sam) hands SAM the scale (see loss_scaling)
    _keeps_clean_grad = False  # GSAM / LookSAM keep the first-pass gradient for the second step
    _logged_settings: Tuple[str, ...] = ('clip_grad', 'clip_mode', 'interval', 'm_sharpness')
    _group_settings: Tuple[str, ...] = _GROUP_SETTINGS  # per-group settings a loaded state dict may change

    def __init__(
            self,
            params: Union[Optimizer, Any, None] = None,
            base_optimizer: Optional[Type[Optimizer]] = None,
            rho: float = 0.05,
            adaptive: bool = False,
            eta: float = 0.01,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
            interval: int = 1,
            m_sharpness: Optional[int] = None,
            **base_kwargs: Any,
    ) -> None:
        # NOTE Optimizer.__init__ is not called on purpose: param_groups/state/defaults are the base's
        # (as timm's Lookahead); what it would set up (hooks, the step wrapper) is done here.
        _check_rho(rho)
        _check_eta(eta)
        _check_clip(clip_grad, clip_mode)
        _check_interval(interval)
        check_m_sharpness(m_sharpness)
        base = _build_base(params, base_optimizer, base_kwargs)
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f'SAM model must be an nn.Module or None, got {type(model).__name__}')
        self.base_optimizer = base
        self.sam_defaults = dict(rho=rho, adaptive=bool(adaptive), eta=eta)
        self.defaults.update(self.sam_defaults)
        self._add_group_defaults()
        self.clip_grad = clip_grad
        self.clip_mode = clip_mode
        self.model = model
        self.interval = interval
        self.m_sharpness = m_sharpness
        self._step_count = 0  # updates done (SAM or plain): decides which one is due
        self._perturbed: Optional[List[torch.Tensor]] = None
        self._skip = False
        self._second_pass_scale = SecondPassScale()
        self._init_runtime()

    def _init_runtime(self) -> None:
        """What a copy or an unpickled SAM gets fresh: hooks, caches, and a recorder looking for its task."""
        for name in _HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._backup: Dict[torch.Tensor, torch.Tensor] = {}
        self._clean: Dict[torch.Tensor, torch.Tensor] = {}  # the first-pass gradient (GSAM, LookSAM)
        self._buffers = BufferSnapshot()
        self._warned: Set[str] = set()
        self.recorder = TaskRecorder(self)
        self.recorder.start()
        self._patch_step_function()  # torch's step wrapper: step pre/post hooks and the profiler label

    def __getstate__(self) -> Dict[str, Any]:
        if self._perturbed is not None:
            raise RuntimeError('SAM cannot be copied or pickled between first_step() and second_step()')
        return {k: self.__dict__[k] for k in _PERSISTENT + self._extra_persistent()}

    def _extra_persistent(self) -> Tuple[str, ...]:
        """Attributes a subclass adds to what a copy or a pickle keeps."""
        return ()

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # ---- the base optimizer's state is SAM's state -------------------------------------------------

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.base_optimizer.param_groups

    @property
    def state(self):
        return self.base_optimizer.state

    @property
    def defaults(self) -> Dict[str, Any]:
        return self.base_optimizer.defaults

    def __repr__(self) -> str:
        return (f'{type(self).__name__}({self.base_optimizer!r}, clip_grad={self.clip_grad}, '
                f'clip_mode={self.clip_mode!r}, interval={self.interval}, m_sharpness={self.m_sharpness})')

    @property
    def sam_step_due(self) -> bool:
        """Whether the next update is a SAM step (every ``interval``-th, the first one included)."""
        return self._step_count % self.interval == 0

    def _add_group_defaults(self) -> None:
        for idx, group in enumerate(self.param_groups):
            for key, value in self.sam_defaults.items():
                group.setdefault(key, value)
            _check_rho(group['rho'], where=f' in param group {idx}')
            _check_eta(group['eta'], where=f' in param group {idx}')

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self.base_optimizer.add_param_group(param_group)
        self._add_group_defaults()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def set_model(self, model: Optional[nn.Module]) -> None:
        """Module whose buffers (BatchNorm statistics) are kept from the first pass, and whose head AGC skips."""
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f'SAM model must be an nn.Module or None, got {type(model).__name__}')
        self.model = model

    # ---- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The base optimizer's state dict (its state and the groups, which carry rho/adaptive/eta)
        plus SAM's own settings and step count, so a resumed run continues exactly. State-dict hooks apply."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state_dict = self.base_optimizer.state_dict()
        state_dict['sam'] = self._sam_state()
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a SAM state dict, or a plain state dict of the base optimizer (groups get SAM's defaults).

        Everything SAM reads is validated before anything is loaded; the checkpoint's SAM settings
        win (a resumed run continues exactly), and where they differ from this run's, that is logged.
        """
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        state_dict = dict(state_dict)
        settings = self._checked_sam_state(state_dict.pop('sam', None))
        for idx, group in enumerate(state_dict.get('param_groups', [])):
            where = f' in param group {idx} of the loaded state dict'
            if 'rho' in group:
                _check_rho(group['rho'], where)
            if 'eta' in group:
                _check_eta(group['eta'], where)
        changes = self._setting_changes(state_dict.get('param_groups', []), settings)
        self.base_optimizer.load_state_dict(state_dict)
        self._add_group_defaults()
        self._apply_sam_state(settings)
        if changes:
            _logger.warning('SAM settings from the loaded state dict replace this run\'s: %s', '; '.join(changes))
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _sam_state(self) -> Dict[str, Any]:
        """SAM's own entry of the state dict: its settings and how many updates it has made."""
        return dict(clip_grad=self.clip_grad, clip_mode=self.clip_mode, interval=self.interval,
                    m_sharpness=self.m_sharpness, step=self._step_count)

    def _checked_sam_state(self, sam_state: Any) -> Dict[str, Any]:
        """The loaded "sam" entry, validated; keys an older checkpoint lacks keep this run's values."""
        current = self._sam_state()
        if sam_state is None:
            return current
        if not isinstance(sam_state, dict) or not {'clip_grad', 'clip_mode'} <= set(sam_state):
            raise ValueError(f'SAM state dict entry "sam" must be a dict with clip_grad and clip_mode, '
                             f'got {sam_state!r}')
        merged = dict(current, **sam_state)
        where = ' in the loaded state dict'
        _check_clip(merged['clip_grad'], merged['clip_mode'], where=where)
        _check_interval(merged['interval'], where=where)
        check_m_sharpness(merged['m_sharpness'], where=where)
        step = merged['step']
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f'SAM step count must be an integer >= 0, got step={step!r}{where}')
        return merged

    def _apply_sam_state(self, settings: Dict[str, Any]) -> None:
        self.clip_grad, self.clip_mode = settings['clip_grad'], settings['clip_mode']
        self.interval, self.m_sharpness = settings['interval'], settings['m_sharpness']
        self._step_count = settings['step']

    def _setting_changes(self, groups: List[Dict[str, Any]], settings: Dict[str, Any]) -> List[str]:
        """'rho: 0.1 -> 0.05 in param groups [0, 1]'-style lines for each loaded setting that differs."""
        where: Dict[Tuple[str, Any, Any], List[int]] = {}
        for idx, (new, old) in enumerate(zip(groups, self.param_groups)):
            for key in self._group_settings:
                if key in new and new[key] != old.get(key):
                    where.setdefault((key, old.get(key), new[key]), []).append(idx)
        changes = [f'{key}: {old!r} -> {new!r} in param groups {idxs}' for (key, old, new), idxs in where.items()]
        current = self._sam_state()
        for key in self._logged_settings:
            if current[key] != settings[key]:
                changes.append(f'{key}: {current[key]!r} -> {settings[key]!r}')
        return changes

    # ---- the SAM update ----------------------------------------------------------------------------

    def _params(self) -> Iterator[torch.Tensor]:
        for group in self.param_groups:
            yield from group['params']

    def _grouped_params_with_grad(self) -> List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor]]]:
        out = []
        for group in self.param_groups:
            params = [p for p in group['params'] if p.grad is not None]
            if params:
                out.append((group, params, [p.grad for p in params]))
        return out

    def _has_grads(self) -> bool:
        return any(p.grad is not None for p in self._params())

    def _backup_buffers(self, params: List[torch.Tensor]) -> List[torch.Tensor]:
        """One persistent copy per parameter (allocated once, reused every step)."""
        out = []
        for p in params:
            buf = self._backup.get(p)
            if buf is None or buf.shape != p.shape or buf.dtype != p.dtype or buf.device != p.device:
                buf = torch.empty_like(p, memory_format=torch.preserve_format)
                self._backup[p] = buf
            out.append(buf)
        return out

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, stacklevel=4)

    def _module(self, purpose: str) -> Optional[nn.Module]:
        """The model given to SAM (``model=``, ``set_model()``, the factory's), else the task's."""
        module = self.model if self.model is not None else self.recorder.trainable_module()
        if module is None:
            self._warn_once(
                f'SAM does not know the model, so {purpose}: pass model= to SAM or to create_optimizer_v2 '
                f'(or call optimizer.set_model(model)) when driving SAM with first_step()/second_step() or a closure')
        return module

    def _scaling(self, grad_scaler: Optional[Any]) -> LossScaling:
        if grad_scaler is not None:
            return GradScalerArgument(grad_scaler)
        found_inf = getattr(self, 'found_inf', None)  # set by GradScaler.step under its attribute contract
        if found_inf is not None:
            return GradScalerAttributes(getattr(self, 'grad_scale', None), found_inf, self._second_pass_scale)
        return NO_SCALING

    @torch.no_grad()
    def first_step(self, zero_grad: bool = True, grad_scaler: Optional[Any] = None) -> None:
        """Move to w + e using the current gradient (computed at w).

        Call after the first backward; then run the second forward-backward and ``second_step()``.
        The first-pass gradient is consumed (grads are set to None unless ``zero_grad=False``).
        With ``grad_scaler`` (fp16), the gradient is unscaled first; an inf/NaN gradient makes this
        update a skipped step (weights untouched, ``second_step`` restores and steps nothing).
        The same dropout masks in both passes are then up to the caller (``step(closure)`` does it).
        """
        if self.m_sharpness:
            raise RuntimeError(f'SAM m_sharpness={self.m_sharpness} needs SAM to run the passes per chunk: use '
                               f'step(closure) or train.py\'s task route, not first_step()/second_step()')
        self.recorder.close()  # an explicit loop never needs the task replay
        self._first_step(self._explicit_scaling(grad_scaler), zero_grad)

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False, grad_scaler: Optional[Any] = None) -> None:
        """Restore w bit-exactly, clip the second-pass gradient and step the base optimizer from w."""
        self._second_step(self._explicit_scaling(grad_scaler), zero_grad)

    @staticmethod
    def _explicit_scaling(grad_scaler: Any) -> LossScaling:
        if isinstance(grad_scaler, bool):
            raise TypeError(f'SAM got grad_scaler={grad_scaler!r}: pass zero_grad= by keyword, '
                            f'grad_scaler= takes a torch.amp.GradScaler or None')
        return GradScalerArgument(grad_scaler) if grad_scaler is not None else NO_SCALING

    def _first_step(self, scaling: LossScaling, zero_grad: bool = True) -> None:
        if self._perturbed is not None:
            raise RuntimeError('SAM.first_step() was called twice; call second_step() after the second backward')
        if not self._has_grads():
            raise RuntimeError(
                f'SAM.first_step() found no gradients: run forward and backward at w first, or {_HOW_TO_USE}')
        scaling.unscale_first(self)
        self._prepare_sam_step()
        grouped = self._grouped_params_with_grad()
        if self._keeps_clean_grad:
            self._keep_clean(grouped)
        norm = self._perturbation_norm(grouped)
        self._skip = scaling.first_overflowed(norm)
        self._perturbed = []
        if not self._skip:
            self._buffers.capture(self._module('its buffers (BatchNorm statistics) are updated by both passes'))
            self._perturb(grouped, norm)
        if zero_grad:
            self.base_optimizer.zero_grad(set_to_none=True)

    def _keep_clean(self, grouped: List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor]]]) -> None:
        """Copy the first-pass gradient (before ASAM scales it) into persistent buffers."""
        for _, params, grads in grouped:
            buffers = []
            for p in params:
                buf = self._clean.get(p)
                if buf is None or buf.shape != p.shape or buf.dtype != p.grad.dtype or buf.device != p.device:
                    buf = torch.empty_like(p.grad, memory_format=torch.preserve_format)
                    self._clean[p] = buf
                buffers.append(buf)
            foreach_copy_(buffers, grads)

    def _perturbation_norm(self, grouped: List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor]]]) -> float:
        """||g|| over all parameters (ASAM: ||T g||, the grads are scaled by T in place). One host sync."""
        for group, params, grads in grouped:  # ASAM: grads <- T g, with T = |w| + eta in the backup buffers
            if group['adaptive']:
                scale_t = self._backup_buffers(params)
                foreach_copy_(scale_t, params)
                torch._foreach_abs_(scale_t)
                torch._foreach_add_(scale_t, float(group['eta']))
                torch._foreach_mul_(grads, scale_t)
        return float(total_norm([g for _, _, grads in grouped for g in grads]))

    def _perturb(
            self,
            grouped: List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor]]],
            norm: float,
    ) -> None:
        """Back w up and move to w + e (e = 0 for a zero or non-finite norm)."""
        valid = math.isfinite(norm) and norm > 0.
        self._perturbed = []
        for group, params, grads in grouped:
            backup = self._backup_buffers(params)
            if group['adaptive']:
                torch._foreach_mul_(grads, backup)  # T^2 g (backup still holds T)
            foreach_copy_(backup, params)
            if valid and group['rho'] > 0:
                torch._foreach_add_(params, grads, alpha=group['rho'] / norm)
            self._perturbed.extend(params)

    def _restore_weights(self) -> List[torch.Tensor]:
        perturbed, self._perturbed = self._perturbed or [], None
        foreach_copy_(perturbed, [self._backup[p] for p in perturbed])
        return perturbed

    def _second_step(self, scaling: LossScaling, zero_grad: bool = False) -> None:
        if self._perturbed is None:
            raise RuntimeError('SAM.second_step() was called before first_step()')
        perturbed = self._restore_weights()
        self._buffers.restore()
        if self._skip or not scaling.unscale_second(self.base_optimizer):  # fp16 overflow: a skipped step
            self._skip = False
            self.base_optimizer.zero_grad(set_to_none=True)
            self._step_count += 1
            return
        with_grad = [p for p in perturbed if p.grad is not None]
        self._transform_second_grad(with_grad, self._clean)
        self._after_sam_step(with_grad, self._clean)
        self._apply(scaling.step, zero_grad)

    def _apply(self, step_fn: Callable[[Optimizer], Any], zero_grad: bool = False) -> None:
        """Clip the gradient about to be applied, step the base optimizer, count the update."""
        if self.clip_grad is not None:
            dispatch_clip_grad(self._clip_parameters(), self.clip_grad, mode=self.clip_mode)
        step_fn(self.base_optimizer)  # scaler.step skips the update if the second pass overflowed
        self._step_count += 1
        if zero_grad:
            self.base_optimizer.zero_grad(set_to_none=True)

    # ---- what GSAM and LookSAM change (SAM: nothing) ----------------------------------------------------

    def _prepare_sam_step(self) -> None:
        """Called before each SAM step's perturbation (GSAM sets this step's rho)."""

    def _transform_second_grad(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """Turn the (unscaled) second-pass gradient into the one applied (GSAM's decomposition)."""

    def _after_sam_step(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """See a SAM step's clean and perturbed gradients before they are applied (LookSAM keeps g_v)."""

    def _adjust_plain_grad(self, params: List[torch.Tensor]) -> None:
        """Change the gradient of a plain (non-SAM) step before it is applied (LookSAM's reuse)."""

    # ---- a plain step (interval) -------------------------------------------------------------------

    def _plain_step(self, scaling: LossScaling) -> None:
        """The base optimizer's step with the gradient at hand (unscaled, checked for overflow, clipped)."""
        scaling.unscale_first(self)
        params = [p for p in self._params() if p.grad is not None]
        if scaling is not NO_SCALING and params:
            norm = float(total_norm([p.grad for p in params]))
            if scaling.first_overflowed(norm):  # fp16 overflow: skipped; the scaler backs off
                self.base_optimizer.zero_grad(set_to_none=True)
                self._step_count += 1
                return
        self._adjust_plain_grad(params)
        self._apply(lambda base: base.step())

    # ---- m-sharpness: per-chunk perturbation --------------------------------------------------------

    def _chunked_step(
            self,
            source: Any,
            scaling: LossScaling,
            no_sync: Optional[Callable[[], ContextManager]],
            fork_rng: bool,
    ) -> List[Any]:
        """One SAM update with a perturbation per chunk of ``m_sharpness`` images (see ``m_sharpness``).

        Both passes of every chunk run inside ``no_sync`` (each worker uses its own gradient); the
        mean of the chunks' second-pass gradients is all-reduced once at the end under DDP.
        Returns the chunks' losses at w.
        """
        if scaling is not NO_SCALING:
            raise RuntimeError('SAM m_sharpness does not support fp16 loss scaling (GradScaler): train with '
                               'bf16 autocast (--amp-dtype bfloat16) or fp32, or leave m_sharpness unset')
        self.base_optimizer.zero_grad(set_to_none=True)  # train.py's full-batch gradient is not used
        self._prepare_sam_step()
        self._buffers.capture(self._module('its buffers (BatchNorm statistics) are updated by every chunk pass'))
        devices = cuda_devices_of(self._params())
        descent: Dict[torch.Tensor, torch.Tensor] = {}
        clean_sum: Dict[torch.Tensor, torch.Tensor] = {}
        losses = []
        try:
            with torch.random.fork_rng(devices=devices) if fork_rng else nullcontext():
                index = 0
                while index == 0 or index < source.count():
                    source.prepare(index)
                    rng = RngState.capture(devices)
                    with sync_context(no_sync):
                        losses.append(source.run(index))
                    grouped = self._grouped_params_with_grad()
                    if self._keeps_clean_grad:
                        self._keep_clean(grouped)
                        _accumulate(clean_sum, [(p, self._clean[p]) for _, params, _ in grouped for p in params])
                    self._perturb(grouped, self._perturbation_norm(grouped))
                    self.base_optimizer.zero_grad(set_to_none=True)
                    with sync_context(no_sync), rng.restored():
                        source.run(index)
                    perturbed = [p for p in self._restore_weights() if p.grad is not None]
                    self._transform_second_grad(perturbed, self._clean)
                    _accumulate(descent, [(p, p.grad) for p in self._params() if p.grad is not None])
                    self.base_optimizer.zero_grad(set_to_none=True)
                    index += 1
        except BaseException:
            self._restore_weights()
            self._buffers.restore()
            raise
        self._buffers.restore()
        count = source.count()
        for p, grad in descent.items():
            p.grad = grad.div_(count)
        for grad in clean_sum.values():
            grad.div_(count)
        if world_size() > 1:
            all_reduce_mean([p.grad for p in descent])
            all_reduce_mean(list(clean_sum.values()))
        self._after_sam_step(list(descent), clean_sum)
        self._apply(lambda base: base.step())
        return losses

    def _check_chunk_sync(self, no_sync: Optional[Callable[[], ContextManager]]) -> None:
        if world_size() > 1 and no_sync is None:
            raise ValueError('SAM m_sharpness under torch.distributed needs each worker\'s own gradient: pass '
                             'no_sync=ddp_model.no_sync to step() (train.py\'s task provides it)')

    def _clip_parameters(self) -> List[torch.Tensor]:
        """The parameters SAM clips: all with a gradient, without the classifier head for AGC (as train.py)."""
        params = [p for p in self._params() if p.grad is not None]
        if self.clip_mode != 'agc':
            return params
        task = self.recorder.task
        if task is not None and hasattr(task, 'get_clip_parameters'):
            keep = task.get_clip_parameters(exclude_head=True)
        else:
            module = self._module('AGC cannot leave the classifier head out')
            if module is None:
                return params
            keep = model_parameters(module, exclude_head=True)
        keep_ids = {id(p) for p in keep}
        return [p for p in params if id(p) in keep_ids]

    @contextmanager
    def _restore_on_error(self) -> Iterator[None]:
        """If the second pass fails (e.g. out of memory), leave the weights at w, not at w + e."""
        try:
            yield
        except BaseException:
            self._skip = False
            self._restore_weights()
            self._buffers.restore()
            raise

    @torch.no_grad()
    def step(
            self,
            closure: Optional[Callable[..., Any]] = None,
            grad_scaler: Optional[Any] = None,
            no_sync: Optional[Callable[[], ContextManager]] = None,
    ) -> Optional[Any]:
        """One update: a SAM step, or a plain base-optimizer step when ``interval`` says so.

        Args:
            closure: zeroes grads, computes and back-propagates the loss, returns it (torch's
                convention). Evaluated at w and at w + e with the same random state; the loss at w is
                returned. With ``m_sharpness`` it takes one argument, ``chunk``, and evaluates its
                batch cut by it: ``xs, ys = chunk(x, y)``. Without a closure, the timm training
                task's calls since the last step are replayed (not on plain steps).
            grad_scaler: a ``torch.amp.GradScaler`` whose scaled loss the closure back-propagates.
                ``GradScaler.step(sam)`` passes itself here, or, under torch's newer contract, sets
                ``grad_scale``/``found_inf`` on SAM instead; both work.
            no_sync: e.g. ``ddp_model.no_sync``: the first closure call runs inside it, so each
                worker perturbs with its own gradient (the paper's m-sharpness); the second pass
                is all-reduced as usual. With ``m_sharpness`` both passes of each chunk run in it
                and the result is all-reduced once.
        """
        return self._update(closure, grad_scaler, no_sync)

    @torch.no_grad()
    def _update(
            self,
            closure: Optional[Callable[..., Any]] = None,
            grad_scaler: Optional[Any] = None,
            no_sync: Optional[Callable[[], ContextManager]] = None,
    ) -> Optional[Any]:
        scaling = self._scaling(grad_scaler)
        if closure is not None:
            return self._closure_step(closure, scaling, no_sync)
        if no_sync is not None:
            raise ValueError('SAM.step(no_sync=...) needs a closure (the first pass is train.py\'s own)')
        self._replay_step(scaling)
        return None

    def _closure_step(
            self,
            closure: Callable[..., Any],
            scaling: LossScaling,
            no_sync: Optional[Callable[[], ContextManager]],
    ) -> Any:
        self.recorder.close()  # a closure loop never needs the task replay
        if not self.sam_step_due:
            with torch.enable_grad():
                loss = closure(ClosureChunks(closure, None).chunk) if self.m_sharpness else closure()
            self._plain_step(scaling)
            return loss
        if self.m_sharpness:
            self._check_chunk_sync(no_sync)
            losses = self._chunked_step(ClosureChunks(closure, self.m_sharpness), scaling, no_sync, fork_rng=False)
            return _mean_loss(losses)
        rng = RngState.capture(cuda_devices_of(self._params()))
        with no_sync() if no_sync is not None else nullcontext(), torch.enable_grad():
            loss = closure()
        self._first_step(scaling)
        with self._restore_on_error():
            if not self._skip:
                with torch.enable_grad(), rng.restored():
                    closure()
        self._second_step(scaling)
        return loss

    def _replay_step(self, scaling: LossScaling) -> None:
        calls = self.recorder.take()
        if not self._has_grads():
            if calls:
                raise RuntimeError('SAM.step(): the training task ran but no gradients exist; '
                                   'call backward() on its loss before step()')
            raise RuntimeError(f'SAM.step() has no closure, no gradients and no captured training-task call: '
                               f'{_HOW_TO_USE}')
        if not self.sam_step_due:  # a plain step needs no replay
            self._plain_step(scaling)
            return
        if not calls:
            closed = (' (task capture was turned off because this optimizer was driven by a closure or by '
                      'first_step())' if self.recorder.state is RecorderState.CLOSED else '')
            raise RuntimeError(
                'SAM.step() without a closure can only re-evaluate the loss inside timm\'s train.py task API, '
                f'but no timm TrainingTask call was captured since the last step{closed}: {_HOW_TO_USE}')
        if self.m_sharpness and not self._one_local_chunk(calls):
            self._chunked_replay_step(calls, scaling)
            return
        self._first_step(scaling)
        with self._restore_on_error():
            if not self._skip:
                self.recorder.replay(calls, scaling.scale)
        self._second_step(scaling)

    def _one_local_chunk(self, calls: List[Any]) -> bool:
        """One process, one micro-batch of exactly m_sharpness images: train.py's gradient is the chunk's own."""
        first = calls[0].args[0] if len(calls) == 1 and calls[0].args else None
        return (world_size() == 1 and isinstance(first, torch.Tensor) and first.dim() > 0
                and first.shape[0] == self.m_sharpness)

    def _chunked_replay_step(self, calls: List[Any], scaling: LossScaling) -> None:
        task = self.recorder.task
        if task is None:
            raise RuntimeError('SAM.step(): the training task whose calls were recorded no longer exists')
        no_sync = no_sync_of(task)
        self._check_chunk_sync(no_sync)
        recorder = self.recorder

        def set_replaying(value: bool) -> None:
            recorder.replaying = value

        source = ReplayChunks(task, calls, self.m_sharpness, set_replaying)  # checks every batch first
        self._chunked_step(source, scaling, no_sync, fork_rng=True)


def _accumulate(total: Dict[torch.Tensor, torch.Tensor], items: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
    """total[p] += value (the first value of a key is copied)."""
    for p, value in items:
        if p in total:
            total[p].add_(value)
        else:
            total[p] = value.detach().clone()


def _mean_loss(losses: List[Any]) -> Any:
    values = [loss for loss in losses if loss is not None]
    if not values:
        return None
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack([v.detach().float() for v in values]).mean()
    return sum(float(v) for v in values) / len(values)
