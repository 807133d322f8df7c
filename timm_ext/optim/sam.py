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
               '_second_pass_scale')

_HOW_TO_USE = (
    'pass a closure (optimizer.step(closure)), call first_step() and second_step() around your second '
    'forward-backward, or train with timm\'s train.py (task API, timm >= 1.0.23), where SAM replays the task')


def _check_rho(rho: Any, where: str = '') -> None:
    if not isinstance(rho, (int, float)) or isinstance(rho, bool) or not rho >= 0 or math.isinf(rho):
        raise ValueError(f'SAM rho must be a finite number >= 0, got rho={rho!r}{where}')


def _check_eta(eta: Any, where: str = '') -> None:
    if not isinstance(eta, (int, float)) or isinstance(eta, bool) or not eta >= 0:
        raise ValueError(f'SAM eta must be >= 0, got eta={eta!r}{where}')


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
        **base_kwargs: davda54/sam style: the base optimizer's arguments (``lr``, ``momentum``, ...).

    Three ways to drive it:
        * ``first_step()`` after backward at w, then backward at w + e, then ``second_step()``;
        * ``step(closure)``: the closure zeroes grads, computes and back-propagates the loss, and
          returns it; ``step`` evaluates it at w and at w + e (same random masks) and returns the
          loss at w;
        * ``step()`` inside timm's train.py: the training task's calls since the last step are
          replayed at w + e under the same autocast and random state (and ``GradScaler``, if any).
    """
    _step_supports_amp_scaling = True  # GradScaler.step(sam) hands SAM the scale (see loss_scaling)

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
            **base_kwargs: Any,
    ) -> None:
        # NOTE Optimizer.__init__ is not called on purpose: param_groups/state/defaults are the base's
        # (as timm's Lookahead); what it would set up (hooks, the step wrapper) is done here.
        base = _build_base(params, base_optimizer, base_kwargs)
        _check_rho(rho)
        _check_eta(eta)
        _check_clip(clip_grad, clip_mode)
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f'SAM model must be an nn.Module or None, got {type(model).__name__}')
        self.base_optimizer = base
        self.sam_defaults = dict(rho=rho, adaptive=bool(adaptive), eta=eta)
        self.defaults.update(self.sam_defaults)
        self._add_group_defaults()
        self.clip_grad = clip_grad
        self.clip_mode = clip_mode
        self.model = model
        self._perturbed: Optional[List[torch.Tensor]] = None
        self._skip = False
        self._second_pass_scale = SecondPassScale()
        self._init_runtime()

    def _init_runtime(self) -> None:
        """What a copy or an unpickled SAM gets fresh: hooks, caches, and a recorder looking for its task."""
        for name in _HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._backup: Dict[torch.Tensor, torch.Tensor] = {}
        self._buffers = BufferSnapshot()
        self._warned: Set[str] = set()
        self.recorder = TaskRecorder(self)
        self.recorder.start()
        self._patch_step_function()  # torch's step wrapper: step pre/post hooks and the profiler label

    def __getstate__(self) -> Dict[str, Any]:
        if self._perturbed is not None:
            raise RuntimeError('SAM cannot be copied or pickled between first_step() and second_step()')
        return {k: self.__dict__[k] for k in _PERSISTENT}

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
        return f'SAM({self.base_optimizer!r}, clip_grad={self.clip_grad}, clip_mode={self.clip_mode!r})'

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
        plus SAM's clip settings, so a resumed run continues exactly. State-dict hooks apply."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state_dict = self.base_optimizer.state_dict()
        state_dict['sam'] = dict(clip_grad=self.clip_grad, clip_mode=self.clip_mode)
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
        sam_state = state_dict.pop('sam', None)
        clip_grad, clip_mode = self._checked_sam_state(sam_state)
        for idx, group in enumerate(state_dict.get('param_groups', [])):
            where = f' in param group {idx} of the loaded state dict'
            if 'rho' in group:
                _check_rho(group['rho'], where)
            if 'eta' in group:
                _check_eta(group['eta'], where)
        changes = self._setting_changes(state_dict.get('param_groups', []), clip_grad, clip_mode)
        self.base_optimizer.load_state_dict(state_dict)
        self._add_group_defaults()
        self.clip_grad, self.clip_mode = clip_grad, clip_mode
        if changes:
            _logger.warning('SAM settings from the loaded state dict replace this run\'s: %s', '; '.join(changes))
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _checked_sam_state(self, sam_state: Any) -> Tuple[Optional[float], str]:
        if sam_state is None:
            return self.clip_grad, self.clip_mode
        if not isinstance(sam_state, dict) or not {'clip_grad', 'clip_mode'} <= set(sam_state):
            raise ValueError(f'SAM state dict entry "sam" must be a dict with clip_grad and clip_mode, '
                             f'got {sam_state!r}')
        _check_clip(sam_state['clip_grad'], sam_state['clip_mode'], where=' in the loaded state dict')
        return sam_state['clip_grad'], sam_state['clip_mode']

    def _setting_changes(self, groups: List[Dict[str, Any]], clip_grad: Any, clip_mode: str) -> List[str]:
        """'rho: 0.1 -> 0.05 in param groups [0, 1]'-style lines for each loaded setting that differs."""
        where: Dict[Tuple[str, Any, Any], List[int]] = {}
        for idx, (new, old) in enumerate(zip(groups, self.param_groups)):
            for key in _GROUP_SETTINGS:
                if key in new and new[key] != old.get(key):
                    where.setdefault((key, old.get(key), new[key]), []).append(idx)
        changes = [f'{key}: {old!r} -> {new!r} in param groups {idxs}' for (key, old, new), idxs in where.items()]
        for key, old, new in (('clip_grad', self.clip_grad, clip_grad), ('clip_mode', self.clip_mode, clip_mode)):
            if old != new:
                changes.append(f'{key}: {old!r} -> {new!r}')
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
        grouped = self._grouped_params_with_grad()
        for group, params, grads in grouped:  # ASAM: grads <- T g, with T = |w| + eta in the backup buffers
            if group['adaptive']:
                scale_t = self._backup_buffers(params)
                foreach_copy_(scale_t, params)
                torch._foreach_abs_(scale_t)
                torch._foreach_add_(scale_t, float(group['eta']))
                torch._foreach_mul_(grads, scale_t)
        norm = float(total_norm([g for _, _, grads in grouped for g in grads]))  # one host sync per step
        valid = math.isfinite(norm) and norm > 0.

        self._skip = scaling.first_overflowed(norm)
        self._perturbed = []
        if not self._skip:
            self._buffers.capture(self._module('its buffers (BatchNorm statistics) are updated by both passes'))
            for group, params, grads in grouped:
                backup = self._backup_buffers(params)
                if group['adaptive']:
                    torch._foreach_mul_(grads, backup)  # T^2 g (backup still holds T)
                foreach_copy_(backup, params)
                if valid and group['rho'] > 0:
                    torch._foreach_add_(params, grads, alpha=group['rho'] / norm)
                self._perturbed.extend(params)
        if zero_grad:
            self.base_optimizer.zero_grad(set_to_none=True)

    def _second_step(self, scaling: LossScaling, zero_grad: bool = False) -> None:
        if self._perturbed is None:
            raise RuntimeError('SAM.second_step() was called before first_step()')
        perturbed, self._perturbed = self._perturbed, None
        foreach_copy_(perturbed, [self._backup[p] for p in perturbed])
        self._buffers.restore()
        if self._skip or not scaling.unscale_second(self.base_optimizer):  # fp16 overflow: a skipped step
            self._skip = False
            self.base_optimizer.zero_grad(set_to_none=True)
            return
        if self.clip_grad is not None:
            dispatch_clip_grad(self._clip_parameters(), self.clip_grad, mode=self.clip_mode)
        scaling.step(self.base_optimizer)  # scaler.step skips the update if the second pass overflowed
        if zero_grad:
            self.base_optimizer.zero_grad(set_to_none=True)

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
            perturbed, self._perturbed, self._skip = self._perturbed or [], None, False
            foreach_copy_(perturbed, [self._backup[p] for p in perturbed])
            self._buffers.restore()
            raise

    @torch.no_grad()
    def step(
            self,
            closure: Optional[Callable[[], Any]] = None,
            grad_scaler: Optional[Any] = None,
            no_sync: Optional[Callable[[], ContextManager]] = None,
    ) -> Optional[Any]:
        """One SAM update.

        Args:
            closure: zeroes grads, computes and back-propagates the loss, returns it (torch's
                convention). Evaluated at w and at w + e with the same random state; the loss at w is
                returned. Without a closure, the timm training task's calls since the last step are
                replayed.
            grad_scaler: a ``torch.amp.GradScaler`` whose scaled loss the closure back-propagates.
                ``GradScaler.step(sam)`` passes itself here, or, under torch's newer contract, sets
                ``grad_scale``/``found_inf`` on SAM instead; both work.
            no_sync: e.g. ``ddp_model.no_sync``: the first closure call runs inside it, so each
                worker perturbs with its own gradient (the paper's m-sharpness); the second pass
                is all-reduced as usual.
        """
        return self._update(closure, grad_scaler, no_sync)

    @torch.no_grad()
    def _update(
            self,
            closure: Optional[Callable[[], Any]] = None,
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
            closure: Callable[[], Any],
            scaling: LossScaling,
            no_sync: Optional[Callable[[], ContextManager]],
    ) -> Any:
        self.recorder.close()  # a closure loop never needs the task replay
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
        if not calls:
            closed = (' (task capture was turned off because this optimizer was driven by a closure or by '
                      'first_step())' if self.recorder.state is RecorderState.CLOSED else '')
            raise RuntimeError(
                'SAM.step() without a closure can only re-evaluate the loss inside timm\'s train.py task API, '
                f'but no timm TrainingTask call was captured since the last step{closed}: {_HOW_TO_USE}')
        self._first_step(scaling)
        with self._restore_on_error():
            if not self._skip:
                self.recorder.replay(calls, scaling.scale)
        self._second_step(scaling)
