""" SAM: Sharpness-Aware Minimization (and ASAM) as a wrapper around any timm/torch optimizer

Papers: 'Sharpness-Aware Minimization for Efficiently Improving Generalization' (Foret et al., 2021)
and 'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., 2022); ASAM: 'Adaptive Sharpness-Aware Minimization' (Kwon et al., 2021).

Each update evaluates the gradient twice: g at w, then the gradient at w + e, with
``e = rho * g / ||g||`` (one global L2 norm over all parameters; ASAM: ``T = |w| + eta``,
``e = rho * T^2 g / ||T g||``). The base optimizer then steps from w with the second gradient.

What is ours (beyond the papers): the wrapper shares ``param_groups`` and ``state`` with its base
optimizer (timm schedulers, layer decay and EMA work unchanged), saves the base state, restores w
bit-exactly from a copy, keeps buffers (BatchNorm statistics) from the first pass, clips the
gradient it applies, handles ``GradScaler`` (fp16) inside ``step``, and, inside timm's train.py,
re-runs the training task itself (see ``timm_ext.optim.task_capture``).
"""
import math
import warnings
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Dict, List, Optional

import torch
import torch.nn as nn
from timm.utils import dispatch_clip_grad
from torch.optim import Optimizer

from timm_ext.optim import task_capture
from timm_ext.optim.module_buffers import BufferSnapshot

__all__ = ['SAM']

_CLIP_MODES = ('norm', 'value', 'agc')

_HOW_TO_USE = (
    'pass a closure (optimizer.step(closure)), call first_step() and second_step() around your second '
    'forward-backward, or train with timm\'s train.py (task API, timm >= 1.0.23), where SAM replays the task')


def _check_rho(rho: Any, where: str = '') -> None:
    if not isinstance(rho, (int, float)) or isinstance(rho, bool) or not rho >= 0 or math.isinf(rho):
        raise ValueError(f'SAM rho must be a finite number >= 0, got rho={rho!r}{where}')


def _unscale_once(grad_scaler: Any, optimizer: Optimizer) -> None:
    """``grad_scaler.unscale_(optimizer)`` unless train.py already did it (it does before clipping)."""
    try:
        grad_scaler.unscale_(optimizer)
    except RuntimeError as e:
        if 'already been called' not in str(e):
            raise


class SAM(Optimizer):
    """ Sharpness-Aware Minimization around an existing optimizer instance.

    Args:
        base_optimizer: the optimizer that applies the update (any torch/timm optimizer).
        rho: neighbourhood radius; a param group may carry its own ``rho``.
        adaptive: ASAM (scale-invariant neighbourhood ``T = |w| + eta``); per group allowed.
        eta: ASAM's offset in ``T``.
        clip_grad: clip the gradient SAM applies (the second-pass gradient), None for no clipping.
        clip_mode: 'norm', 'value' or 'agc' (timm's ``dispatch_clip_grad`` modes).
        model: module whose buffers keep their first-pass values (BatchNorm running statistics);
            found automatically inside timm's train.py, needed for ``step(closure)`` / explicit use.

    Three ways to drive it:
        * ``first_step()`` after backward at w, then backward at w + e, then ``second_step()``;
        * ``step(closure)``: the closure zeroes grads, computes and back-propagates the loss, and
          returns it; ``step`` evaluates it at w and at w + e and returns the loss at w;
        * ``step()`` inside timm's train.py: the training task's calls since the last step are
          replayed at w + e under the same autocast state (and ``GradScaler``, if any).
    """
    _step_supports_amp_scaling = True  # GradScaler.step(sam) hands itself to step(grad_scaler=...)

    def __init__(
            self,
            base_optimizer: Optimizer,
            rho: float = 0.05,
            adaptive: bool = False,
            eta: float = 0.01,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
    ) -> None:
        # NOTE super().__init__() not called on purpose: param_groups/state/defaults are the base's.
        if not isinstance(base_optimizer, Optimizer):
            raise ValueError(
                f'SAM needs an optimizer instance to wrap, got {type(base_optimizer).__name__}; '
                f'build one first (e.g. torch.optim.SGD(params, lr=0.1)) or use timm.optim.create_optimizer_v2')
        if isinstance(base_optimizer, SAM):
            raise ValueError('SAM cannot wrap another SAM optimizer')
        _check_rho(rho)
        if not isinstance(eta, (int, float)) or not eta >= 0:
            raise ValueError(f'SAM eta must be >= 0, got eta={eta!r}')
        if clip_grad is not None and not clip_grad > 0:
            raise ValueError(f'SAM clip_grad must be > 0 or None, got clip_grad={clip_grad!r}')
        if clip_mode not in _CLIP_MODES:
            raise ValueError(f'SAM clip_mode must be one of {_CLIP_MODES}, got clip_mode={clip_mode!r}')
        self._optimizer_step_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_step_post_hooks: Dict[int, Callable] = OrderedDict()
        self.base_optimizer = base_optimizer
        self.sam_defaults = dict(rho=rho, adaptive=bool(adaptive), eta=eta)
        self.defaults.update(self.sam_defaults)
        self._add_group_defaults()
        self.clip_grad = clip_grad
        self.clip_mode = clip_mode
        self.model = model

        self._backup: Dict[torch.Tensor, torch.Tensor] = {}
        self._perturbed: Optional[List[torch.Tensor]] = None
        self._skip = False
        self._buffers = BufferSnapshot()
        self.recorder = task_capture.TaskRecorder(self._params)
        task_capture.watch(self.recorder)
        warnings.filterwarnings(  # the grad_scaler= contract used by GradScaler.step(sam) is intended
            'ignore', message='GradScaler is going to stop passing itself', category=FutureWarning)

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

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self.base_optimizer.add_param_group(param_group)
        self._add_group_defaults()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def set_model(self, model: Optional[nn.Module]) -> None:
        """Module whose buffers (BatchNorm statistics) are kept from the first pass."""
        self.model = model

    def state_dict(self) -> Dict[str, Any]:
        """The base optimizer's state dict (its state and the groups, which carry rho/adaptive/eta)
        plus SAM's clip settings, so a resumed run continues exactly."""
        state_dict = self.base_optimizer.state_dict()
        state_dict['sam'] = dict(clip_grad=self.clip_grad, clip_mode=self.clip_mode)
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a SAM state dict, or a plain state dict of the base optimizer (groups get SAM's defaults)."""
        state_dict = dict(state_dict)
        sam_state = state_dict.pop('sam', None)
        self.base_optimizer.load_state_dict(state_dict)
        self._add_group_defaults()
        if sam_state is not None:
            self.clip_grad = sam_state['clip_grad']
            self.clip_mode = sam_state['clip_mode']

    # ---- the SAM update ----------------------------------------------------------------------------

    def _params(self):
        for group in self.param_groups:
            yield from group['params']

    def _grouped_params_with_grad(self):
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

    @torch.no_grad()
    def first_step(self, grad_scaler: Optional[Any] = None, zero_grad: bool = True) -> None:
        """Move to w + e using the current gradient (computed at w).

        Call after the first backward; then run the second forward-backward and ``second_step()``.
        The first-pass gradient is consumed (grads are set to None unless ``zero_grad=False``).
        With ``grad_scaler`` (fp16), the gradient is unscaled first; an inf/NaN gradient makes this
        update a skipped step (weights untouched, ``second_step`` restores and steps nothing).
        """
        task_capture.unwatch(self.recorder)  # an explicit loop never needs the task replay
        self._first_step(grad_scaler, zero_grad)

    def _first_step(self, grad_scaler: Optional[Any], zero_grad: bool = True) -> None:
        if self._perturbed is not None:
            raise RuntimeError('SAM.first_step() was called twice; call second_step() after the second backward')
        if grad_scaler is not None:
            _unscale_once(grad_scaler, self)
        grouped = self._grouped_params_with_grad()
        if not grouped:
            raise RuntimeError(
                f'SAM.first_step() found no gradients: run forward and backward at w first, or {_HOW_TO_USE}')

        adaptive = [g for g in grouped if g[0]['adaptive']]
        for group, params, grads in adaptive:  # grads <- T g, with T = |w| + eta kept in the backup buffers
            scale_t = self._backup_buffers(params)
            torch._foreach_copy_(scale_t, params)
            torch._foreach_abs_(scale_t)
            torch._foreach_add_(scale_t, float(group['eta']))
            torch._foreach_mul_(grads, scale_t)
        norm = torch.nn.utils.get_total_norm([g for _, _, grads in grouped for g in grads], foreach=True)
        norm = float(norm)  # one host sync; train.py syncs on loss.item() every step anyway
        valid = math.isfinite(norm) and norm > 0.

        self._skip = grad_scaler is not None and not math.isfinite(norm)
        self._perturbed = []
        if not self._skip:
            module = self.model if self.model is not None else self.recorder.trainable_module()
            self._buffers.capture(module)
            for group, params, grads in grouped:
                backup = self._backup_buffers(params)
                if group['adaptive']:
                    torch._foreach_mul_(grads, backup)  # T^2 g (backup still holds T)
                torch._foreach_copy_(backup, params)
                if valid and group['rho'] > 0:
                    torch._foreach_add_(params, grads, alpha=group['rho'] / norm)
                self._perturbed.extend(params)
        if zero_grad:
            self.base_optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def second_step(self, grad_scaler: Optional[Any] = None, zero_grad: bool = False) -> None:
        """Restore w bit-exactly, clip the second-pass gradient and step the base optimizer from w."""
        if self._perturbed is None:
            raise RuntimeError('SAM.second_step() was called before first_step()')
        perturbed, self._perturbed = self._perturbed, None
        if perturbed:
            torch._foreach_copy_(perturbed, [self._backup[p] for p in perturbed])
        self._buffers.restore()
        if self._skip:  # fp16 overflow in the first pass: a skipped step, the scaler backs off
            self._skip = False
            self.base_optimizer.zero_grad(set_to_none=True)
            return
        if grad_scaler is not None:
            _unscale_once(grad_scaler, self.base_optimizer)
        if self.clip_grad is not None:
            params = [p for p in self._params() if p.grad is not None]
            dispatch_clip_grad(params, self.clip_grad, mode=self.clip_mode)
        if grad_scaler is not None:
            grad_scaler.step(self.base_optimizer)  # skips the update if the second pass overflowed
        else:
            self.base_optimizer.step()
        if zero_grad:
            self.base_optimizer.zero_grad(set_to_none=True)

    @contextmanager
    def _restore_on_error(self):
        """If the second pass fails (e.g. out of memory), leave the weights at w, not at w + e."""
        try:
            yield
        except BaseException:
            perturbed, self._perturbed, self._skip = self._perturbed or [], None, False
            if perturbed:
                torch._foreach_copy_(perturbed, [self._backup[p] for p in perturbed])
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
                convention). Evaluated at w and at w + e; the loss at w is returned. Without a
                closure, the timm training task's calls since the last step are replayed.
            grad_scaler: a ``torch.amp.GradScaler`` whose scaled loss the closure back-propagates
                (``GradScaler.step(sam)`` passes itself here).
            no_sync: e.g. ``ddp_model.no_sync``: the first closure call runs inside it, so each
                worker perturbs with its own gradient (the paper's m-sharpness); the second pass
                is all-reduced as usual.
        """
        try:
            if closure is not None:
                task_capture.unwatch(self.recorder)
                with no_sync() if no_sync is not None else nullcontext(), torch.enable_grad():
                    loss = closure()
                self._first_step(grad_scaler)
                with self._restore_on_error():
                    if not self._skip:
                        with torch.enable_grad():
                            closure()
                self.second_step(grad_scaler)
                return loss

            calls = self.recorder.take()
            if not self._has_grads():
                if calls:
                    raise RuntimeError('SAM.step(): the training task ran but no gradients exist; '
                                       'call backward() on its loss before step()')
                raise RuntimeError(f'SAM.step() has no closure, no gradients and no captured training-task call: '
                                   f'{_HOW_TO_USE}')
            if not calls:
                raise RuntimeError(
                    'SAM.step() without a closure can only re-evaluate the loss inside timm\'s train.py task API, '
                    f'but no timm TrainingTask call was captured since the last step: {_HOW_TO_USE}')
            if no_sync is not None:
                raise ValueError('SAM.step(no_sync=...) needs a closure (the first pass is train.py\'s own)')
            self._first_step(grad_scaler)
            with self._restore_on_error():
                if not self._skip:
                    self.recorder.replay(calls, grad_scaler)
            self.second_step(grad_scaler)
            return None
        finally:
            self.recorder.calls = []
