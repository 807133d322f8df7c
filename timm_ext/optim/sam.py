""" SAM: Sharpness-Aware Minimization (and ASAM) as a wrapper around any timm/torch optimizer

Papers: 'Sharpness-Aware Minimization for Efficiently Improving Generalization' (Foret et al., 2021)
and 'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., 2022); ASAM: 'Adaptive Sharpness-Aware Minimization' (Kwon et al., 2021).

Each update evaluates the gradient twice: g at w, then the gradient at w + e, with
``e = rho * g / ||g||`` (one global L2 norm over all parameters; ASAM: ``T = |w| + eta``,
``e = rho * T^2 g / ||T g||``). The base optimizer then steps from w with the second gradient.
Both passes draw the same dropout / drop-path masks, as the paper's JAX code (one PRNG key per step).

This file is the algorithm (perturb, restore, base step) and its three entry points. Beside it, each in
its own module: the settings (``sam_settings``), the shared groups/state of the wrapped optimizer
(``sam_wrapper``), checkpoints, copies and pickles (``sam_state``), train.py's replay (``sam_capture``,
``task_capture``), m-sharpness (``m_sharpness``), which parameters are clipped (``sam_clip``), fp16
loss scaling (``loss_scaling``) and BatchNorm statistics (``module_buffers``).
"""
import functools
import inspect
import math
import warnings
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Set, Tuple, Type

import torch
import torch.nn as nn
from timm.utils import dispatch_clip_grad
from torch.optim import Optimizer

from timm_ext.optim._compat import foreach_copy_, total_norm
from timm_ext.optim.ddp import sync_context
from timm_ext.optim.loss_scaling import (
    NO_SCALING,
    GradScalerArgument,
    GradScalerAttributes,
    LossScaling,
    SecondPassScale,
)
from timm_ext.optim.m_sharpness import ChunkedSAMStep, ClosureChunks, mean_loss
from timm_ext.optim.module_buffers import BufferSnapshot
from timm_ext.optim.rng import RngState, cuda_devices_of
from timm_ext.optim.sam_capture import HOW_TO_USE, TaskReplayStep
from timm_ext.optim.sam_clip import clip_parameters
from timm_ext.optim.sam_settings import SAMSettings, check_group
from timm_ext.optim.sam_state import SAMCheckpoint
from timm_ext.optim.sam_wrapper import WrappedOptimizer, build_base_optimizer
from timm_ext.optim.task_capture import TaskRecorder

__all__ = ['SAM']

Grouped = List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor]]]
_LEADING = (
    inspect.Parameter('params', inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
    inspect.Parameter('base_optimizer', inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
)


def _check_model(model: Any, family: str = 'SAM') -> None:
    if model is not None and not isinstance(model, nn.Module):
        raise ValueError(f'{family} model must be an nn.Module or None, got {type(model).__name__}')


class SAM(SAMCheckpoint, TaskReplayStep, ChunkedSAMStep, WrappedOptimizer):
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
    Settings: Type[SAMSettings] = SAMSettings  # the family's settings: signature, checks, state dict, repr

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if '__init__' not in cls.__dict__:
            cls.__init__ = _with_signature(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = _init_signature(self.Settings).bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        params, base_optimizer, model = values.pop('params'), values.pop('base_optimizer'), values.pop('model')
        base_kwargs = values.pop('base_kwargs')
        settings = self.Settings(**values)
        base = build_base_optimizer(params, base_optimizer, base_kwargs)
        _check_model(model)
        self.base_optimizer = base
        self.settings = settings
        self.defaults.update(settings.group_defaults())
        self._add_group_defaults()
        self.model = model
        self._step_count = 0  # updates done (SAM or plain): decides which one is due
        self._perturbed: Optional[List[torch.Tensor]] = None
        self._skip = False
        self._second_pass_scale = SecondPassScale()
        self._init_runtime()
        self._post_init()

    def _post_init(self) -> None:
        """A family's own setup once the base optimizer exists (GSAM reads the initial lr)."""

    def _init_runtime(self) -> None:
        """What a copy or an unpickled SAM gets fresh: hooks, caches, and a recorder looking for its task."""
        self._backup: Dict[torch.Tensor, torch.Tensor] = {}
        self._clean: Dict[torch.Tensor, torch.Tensor] = {}  # the first-pass gradient (GSAM, LookSAM)
        self._buffers = BufferSnapshot()
        self._warned: Set[str] = set()
        self.recorder = TaskRecorder(self)
        self.recorder.start()
        self._init_torch_machinery()  # hooks, and torch's step wrapper (step hooks and the profiler label)

    @property
    def sam_step_due(self) -> bool:
        """Whether the next update is a SAM step (every ``interval``-th, the first one included)."""
        return self._step_count % self.settings.interval == 0

    def _add_group_defaults(self) -> None:
        for idx, group in enumerate(self.param_groups):
            for key, value in self.settings.group_defaults().items():
                group.setdefault(key, value)
            check_group(group, where=f' in param group {idx}')

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self.base_optimizer.add_param_group(param_group)
        self._add_group_defaults()

    def set_model(self, model: Optional[nn.Module]) -> None:
        """Module whose buffers (BatchNorm statistics) are kept from the first pass, and whose head AGC skips."""
        _check_model(model)
        self.model = model

    # ---- the SAM update ----------------------------------------------------------------------------

    def _grouped_params_with_grad(self) -> Grouped:
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
        m_sharpness = self.settings.m_sharpness
        if m_sharpness:
            raise RuntimeError(f'SAM m_sharpness={m_sharpness} needs SAM to run the passes per chunk: use '
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
                f'SAM.first_step() found no gradients: run forward and backward at w first, or {HOW_TO_USE}')
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

    def _keep_clean(self, grouped: Grouped) -> None:
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

    def _perturbation_norm(self, grouped: Grouped) -> float:
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
            grouped: Grouped,
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
        clip_grad, clip_mode = self.settings.clip_grad, self.settings.clip_mode
        if clip_grad is not None:
            params = [p for p in self._params() if p.grad is not None]
            task = self.recorder.task
            module = lambda: self._module('AGC cannot leave the classifier head out')  # noqa: E731
            dispatch_clip_grad(clip_parameters(params, clip_mode, task, module), clip_grad, mode=clip_mode)
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
                loss = closure(ClosureChunks(closure, None).chunk) if self.settings.m_sharpness else closure()
            self._plain_step(scaling)
            return loss
        m_sharpness = self.settings.m_sharpness
        if m_sharpness:
            self._check_chunk_sync(no_sync)
            losses = self._chunked_step(ClosureChunks(closure, m_sharpness), scaling, no_sync, fork_rng=False)
            return mean_loss(losses)
        rng = RngState.capture(cuda_devices_of(self._params()))
        with sync_context(no_sync), torch.enable_grad():
            loss = closure()
        self._first_step(scaling)
        with self._restore_on_error():
            if not self._skip:
                with torch.enable_grad(), rng.restored():
                    closure()
        self._second_step(scaling)
        return loss


@functools.lru_cache(maxsize=None)
def _init_signature(settings: Type[SAMSettings], with_self: bool = False) -> inspect.Signature:
    """A family's constructor: ``(params, base_optimizer, <its settings, model after clip_mode>, **base_kwargs)``."""
    leading = ((inspect.Parameter('self', inspect.Parameter.POSITIONAL_ONLY),) if with_self else ()) + _LEADING
    return settings.signature(leading)


def _with_signature(cls: Type[SAM]) -> Callable[..., None]:
    """``SAM.__init__`` under the family's signature (``inspect.signature(GSAM)`` shows GSAM's settings)."""
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        SAM.__init__(self, *args, **kwargs)
    __init__.__signature__ = _init_signature(cls.Settings, with_self=True)
    return __init__


SAM.__init__.__signature__ = _init_signature(SAMSettings, with_self=True)
