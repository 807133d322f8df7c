""" SAM: Sharpness-Aware Minimization (and ASAM) around any timm/torch optimizer

Papers: 'Sharpness-Aware Minimization for Efficiently Improving Generalization' (Foret et al., 2021),
'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., 2022); ASAM: 'Adaptive Sharpness-Aware Minimization' (Kwon et al., 2021).

One update, as the paper writes it:

    g = grad L(w)                      # first pass, at w
    e = rho * g / ||g||                # one global L2 norm; ASAM: T = |w| + eta, e = rho T^2 g / ||T g||
    h = grad L(w + e)                  # second pass, same dropout / drop-path masks as the first
    w = base_optimizer.step(w, h)      # from w, with the gradient taken at w + e

This file is that update and nothing else. Who runs the two passes is a driver's business, each in its
own module: a closure (``closure_passes``), timm's train.py (``replay_passes``, over ``task_recorder``),
m-sharpness chunks (``m_sharpness``); beside them fp16 loss scaling (``loss_scaling``), BatchNorm buffers
(``module_buffers``) and the checkpoint entry (``sam_checkpoint``). GSAM and LookSAM override the hooks
at the end of the class.
"""
import logging
import math
import warnings
from collections import OrderedDict
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from timm.utils import dispatch_clip_grad

from timm_ext.optim.base_optimizer import build_base_optimizer, check_model
from timm_ext.optim.closure_passes import ClosurePasses
from timm_ext.optim.ddp import all_reduce_mean, world_size
from timm_ext.optim.framework_checks import framework_problem, stepless_problem
from timm_ext.optim.loss_scaling import NO_SCALING, LossScaling, SecondPassScale, explicit_scaling, scaling_for
from timm_ext.optim.m_sharpness import GradientSum, refuse_loss_scaling
from timm_ext.optim.module_buffers import BufferSnapshot
from timm_ext.optim.replay_passes import HOW_TO_USE, replay_passes
from timm_ext.optim.rng import cuda_devices_of
from timm_ext.optim.sam_checkpoint import GROUP_KEY, checked_entry, sam_entry, setting_changes, split_entry
from timm_ext.optim.sam_clip import clip_parameters
from timm_ext.optim.sam_settings import SAM_RHO, SAMSettings
from timm_ext.optim.sharded import global_norm, local, refuse_flat_parameters, refuse_sharded_chunks
from timm_ext.optim.task_recorder import TaskRecorder
from timm_ext.optim.torch_compat import foreach_copy_

__all__ = ['SAM']

_logger = logging.getLogger(__name__)
Grouped = List[Tuple[Dict[str, Any], List[torch.Tensor], List[torch.Tensor]]]
# torch.optim.Optimizer's hook tables (Optimizer.__init__ is not called: the groups are the base optimizer's)
_HOOK_TABLES = ('_optimizer_step_pre_hooks', '_optimizer_step_post_hooks', '_optimizer_state_dict_pre_hooks',
                '_optimizer_state_dict_post_hooks', '_optimizer_load_state_dict_pre_hooks',
                '_optimizer_load_state_dict_post_hooks')
# what a copy or a pickle keeps (per-parameter state, LookSAM's too, is the base optimizer's); hooks, caches and
# the recorder are rebuilt, and what else was set on the instance (an lr scheduler's step wrapper) is not copied
_COPIED = ('base_optimizer', 'settings', 'model', '_updates', '_perturbed', '_skip', '_second_pass_scale',
           'zero_grad_calls')


class SAM(torch.optim.Optimizer):
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
            leaves out; found by itself inside timm's train.py and in ``create_optimizer_v2(model, ...)``.
        interval: a SAM step every ``interval``-th update, a plain base-optimizer step in between.
        m_sharpness: images per perturbation: each worker's batch is cut into chunks of this many images,
            each ascends with its own gradient, and the descent gradient is the chunks' mean (``m_sharpness``).
        **base_kwargs: davda54/sam style: the base optimizer's arguments (``lr``, ``momentum``, ...).

    Three ways to drive it: ``step(closure)``; ``first_step()`` / ``second_step()`` around your second
    forward-backward; ``step()`` inside timm's train.py, which replays the training task's calls at w + e.
    """
    _step_supports_amp_scaling = True  # GradScaler.step(sam) hands SAM the scale (see loss_scaling)
    Settings = SAMSettings  # a family's settings: its checks, its state-dict entry, its repr
    needs_clean_gradient = False  # hook: keep the first-pass gradient g for the hooks (GSAM, LookSAM)

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
        self.base_optimizer = build_base_optimizer(params, base_optimizer, base_kwargs)
        refuse_flat_parameters(self._params())
        check_model(model, self.Settings.family)
        self.model = model
        self.defaults.update(self.settings.group_defaults())
        self._add_group_defaults()
        self._updates = 0  # updates done, SAM or plain: decides which one is due
        self._perturbed: Optional[List[torch.Tensor]] = None
        self._skip = False  # this update overflowed in fp16: restore, step nothing
        self._second_pass_scale = SecondPassScale()
        self.zero_grad_calls = 0
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._backup: Dict[torch.Tensor, torch.Tensor] = {}  # w during the second pass (allocated once)
        self._clean: Dict[torch.Tensor, torch.Tensor] = {}  # g, for the hooks that need it
        self._buffers = BufferSnapshot()
        self._warned: set = set()
        self.recorder = TaskRecorder(self)  # finds the train.py task that owns these parameters
        self.recorder.start()
        for name in _HOOK_TABLES:
            setattr(self, name, OrderedDict())
        self._patch_step_function()  # torch's step wrapper: step hooks and the profiler label

    # ---- an optimizer whose groups, state and defaults are the base optimizer's (as timm's Lookahead) ----

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.base_optimizer.param_groups

    @property
    def state(self) -> Dict[Any, Any]:
        return self.base_optimizer.state

    @property
    def defaults(self) -> Dict[str, Any]:
        return self.base_optimizer.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zero_grad_calls += 1  # a closure that zeroes is not adding to an accumulation window
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self.base_optimizer.add_param_group(param_group)
        self._add_group_defaults()

    def _add_group_defaults(self) -> None:
        for idx, group in enumerate(self.param_groups):
            for key, value in self.settings.group_defaults().items():
                group.setdefault(key, value)
            self.settings.check_group(group, where=f' in param group {idx}')

    def set_model(self, model: Optional[nn.Module]) -> None:
        """The module whose buffers keep their first-pass values, and whose head AGC leaves out."""
        check_model(model, self.Settings.family)
        self.model = model

    @property
    def sam_step_due(self) -> bool:
        """Whether the next update is a SAM step (every ``interval``-th, the first one included)."""
        return self._updates % self.settings.interval == 0

    def _zero_gradient(self) -> bool:
        """Every parameter has a gradient and all of them are zero."""
        params = self._params()
        return all(p.grad is not None for p in params) and bool(params) and global_norm(
            [p.grad for p in params], params) == 0

    def extra_memory_bytes(self) -> int:
        """What SAM holds beside the base optimizer: the copy of w (GSAM, LookSAM: and of g) and of the buffers."""
        kept = list(self._backup.values()) + list(self._clean.values())
        return sum(t.numel() * t.element_size() for t in kept) + self._buffers.nbytes

    def _params(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group['params']]

    def _params_with_grad(self) -> List[torch.Tensor]:
        return [p for p in self._params() if p.grad is not None]

    # ---- the update --------------------------------------------------------------------------------------

    @torch.no_grad()
    def perturb(self) -> float:
        """Back w up and move to w + e with the gradient at hand (at its true scale). Returns ||g||
        (ASAM: ||T g||); a zero or non-finite norm leaves w where it is. ``restore()`` undoes it."""
        if self._perturbed is not None:
            raise RuntimeError('SAM.perturb() was called twice; call restore() (or second_step()) first')
        grouped = [(g, ps, [local(p.grad) for p in ps]) for g in self.param_groups  # local: this rank's shards
                   if (ps := [p for p in g['params'] if p.grad is not None])]
        if self.needs_clean_gradient:
            self._keep(self._clean, [p for _, ps, _ in grouped for p in ps], [g for _, _, gs in grouped for g in gs])
        for group, params, grads in grouped:
            if group['adaptive']:  # ASAM: T = |w| + eta, in the backups (w goes there next); g <- T g for the norm
                scale_t = self._keep(self._backup, params, [local(p) for p in params])
                torch._foreach_abs_(scale_t)
                torch._foreach_add_(scale_t, float(group['eta']))
                torch._foreach_mul_(grads, scale_t)
        norm = global_norm([g for _, _, gs in grouped for g in gs], [p for _, ps, _ in grouped for p in ps])
        self._perturbed = []
        for group, params, grads in grouped:
            shards = [local(p) for p in params]
            if group['adaptive']:  # ... and T^2 g for the step: e = rho T^2 g / ||T g||
                torch._foreach_mul_(grads, self._keep(self._backup, params, None, shards))
            self._keep(self._backup, params, shards)
            if math.isfinite(norm) and norm > 0 and group['rho'] > 0:
                torch._foreach_add_(shards, grads, alpha=group['rho'] / norm)
            self._perturbed.extend(params)
        return norm

    @torch.no_grad()
    def restore(self) -> None:
        """Put back, bit-exactly, the weights ``perturb()`` moved."""
        perturbed, self._perturbed = self._perturbed or [], None
        foreach_copy_([local(p) for p in perturbed], [self._backup[p] for p in perturbed])

    @torch.no_grad()
    def cancel_step(self) -> None:
        """Abandon a SAM step begun by ``first_step()`` (e.g. the second pass failed): the weights and the module's
        buffers back as they were at w, nothing stepped."""
        self._skip = False
        self.restore()
        self._buffers.restore()

    @torch.no_grad()
    def first_step(self, zero_grad: bool = True, grad_scaler: Optional[Any] = None) -> None:
        """After the backward at w: move to w + e. The gradient is consumed (set to None unless ``zero_grad``
        is False). With ``grad_scaler`` (fp16) it is unscaled first; an inf/NaN makes this update a skipped one."""
        if self.settings.m_sharpness:
            raise RuntimeError(f'SAM m_sharpness={self.settings.m_sharpness} needs SAM to run the passes per '
                               f'chunk: use step(closure) or train.py\'s task route, not first_step()/second_step()')
        self.recorder.close()  # an explicit loop never needs the train.py replay
        if self._perturbed is not None:
            raise RuntimeError('SAM.first_step() was called twice; call second_step() after the second backward')
        if not self._params_with_grad():
            raise RuntimeError(f'SAM.first_step() found no gradients: run forward and backward at w first, or '
                               f'{HOW_TO_USE}')
        self._ascend(explicit_scaling(grad_scaler))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False, grad_scaler: Optional[Any] = None) -> None:
        """After the backward at w + e: back to w bit-exactly, then the base optimizer's step with that gradient."""
        scaling = explicit_scaling(grad_scaler)
        descend = self._descend(scaling)
        self._buffers.restore()
        self._finish(descend, scaling, self._clean, zero_grad)

    @torch.no_grad()
    def step(
            self,
            closure: Optional[Callable[..., Any]] = None,
            grad_scaler: Optional[Any] = None,
            no_sync: Optional[Callable[[], ContextManager]] = None,
    ) -> Optional[Any]:
        """One update: a SAM step, or a plain base-optimizer step when ``interval`` says so; after
        ``first_step()`` (a framework that calls ``step()`` itself), the rest of the update, as ``second_step()``.

        Args:
            closure: zeroes grads (``optimizer.zero_grad()``), computes and back-propagates the loss, returns it.
                Evaluated at w and at w + e with the same random state; returns the loss at w. A closure that adds
                to gradients already there (an accumulation window) is refused: SAM cannot re-evaluate the window.
                Under ``m_sharpness`` it takes a ``chunk`` and cuts its batch with it: ``xs, ys = chunk(x, y)``.
                Without one, timm's train.py training-task calls since the last step are replayed at w + e.
            grad_scaler: a ``torch.amp.GradScaler`` whose scaled loss the closure back-propagates
                (``GradScaler.step(sam)`` passes itself, or sets ``grad_scale``/``found_inf``: both work).
            no_sync: e.g. ``ddp_model.no_sync``: the first pass runs in it, so each worker perturbs with its
                own gradient; the second pass is all-reduced as usual.
        """
        if self._perturbed is not None:  # after first_step() and your second backward (a framework's step())
            if closure is not None or getattr(self, 'found_inf', None) is not None:
                self.cancel_step()
                raise RuntimeError('SAM.step() after first_step() finishes the update as second_step() does: call it '
                                   'without a closure, and with an fp16 GradScaler call sam.second_step(grad_scaler='
                                   'scaler) yourself (a wrapper hiding step\'s grad_scaler argument, e.g. '
                                   'Accelerate\'s, cannot hand SAM the second pass\'s scale); the weights are back '
                                   'at w')
            self.second_step(grad_scaler=grad_scaler)
            return None
        scaling = scaling_for(self, grad_scaler, self._second_pass_scale)
        if closure is not None:
            problem = framework_problem(closure, self)
            if problem:
                raise ValueError(problem)
            self.recorder.close()  # a closure loop never needs the train.py replay
            passes = ClosurePasses(closure, self.settings.m_sharpness, no_sync, cuda_devices_of(self._params()),
                                   self._params(), lambda: self.zero_grad_calls)
        elif no_sync is not None:
            raise ValueError('SAM.step(no_sync=...) needs a closure (the first pass is train.py\'s own)')
        elif (problem := stepless_problem(self)) is not None:
            raise ValueError(problem)
        elif not self.recorder.calls and self._zero_gradient():
            # g = 0: e = 0, the pass at w + e is the one at w (torch.distributed.checkpoint steps on zero gradients
            # to create the optimizer's state)
            self._plain_step(scaling)
            return None
        else:
            passes = replay_passes(self.recorder, bool(self._params_with_grad()), self.sam_step_due,
                                   self.settings.m_sharpness)
        if not self.sam_step_due:
            loss = passes.plain_pass()
            self._plain_step(scaling)
            return loss
        if passes.chunked:
            refuse_sharded_chunks(self.settings.m_sharpness, self._params())
            refuse_loss_scaling(scaling is not NO_SCALING)
        return passes.result(self._sam_update(passes, scaling))

    def _sam_update(self, passes: Any, scaling: LossScaling) -> List[Any]:
        """The passes of one SAM update: per chunk (one without m-sharpness) the gradient at w, the gradient
        at w + e, back to w; then the (mean) second-pass gradient is applied. Weights and buffers are back at
        w whatever fails in between."""
        descent, clean = GradientSum(), GradientSum()
        losses = []
        with passes.context():
            try:
                if passes.first_pass_done or passes.chunked:  # buffers as before SAM's own passes
                    self._hold_buffers()
                index = 0
                while index == 0 or index < passes.count():
                    if passes.chunked:
                        self.zero_grad()  # each chunk's own gradient (train.py's whole-batch one is not used)
                    losses.append(passes.first(index))
                    self._ascend(scaling)
                    self.zero_grad()
                    if not self._skip:
                        passes.second(index, scaling.scale)
                    descend = self._descend(scaling)
                    if passes.chunked:
                        descent.add(self._params_with_grad())
                        clean.add_values(self._clean)
                    index += 1
            except BaseException:
                self.cancel_step()
                raise
        self._buffers.restore()
        clean_grads = self._clean
        if passes.chunked:  # the mean over the chunks, then over the workers (one all-reduce each)
            descent.write_mean_to_grads()
            clean_grads = clean.mean()
            if world_size() > 1:
                all_reduce_mean([p.grad for p in self._params_with_grad()])
                all_reduce_mean(list(clean_grads.values()))
        self._finish(descend, scaling, clean_grads)
        return losses

    def _ascend(self, scaling: LossScaling) -> None:
        """Unscale g, then perturb; an overflowed first pass marks the update as skipped."""
        scaling.unscale_first(self)
        self.prepare_sam_step()
        self._hold_buffers()
        self._skip = scaling.first_overflowed(self.perturb())

    def _descend(self, scaling: LossScaling) -> bool:
        """Back to w; the second-pass gradient unscaled and adjusted. False: this update is skipped."""
        if self._perturbed is None:
            raise RuntimeError('SAM.second_step() was called before first_step()')
        self.restore()
        skip, self._skip = self._skip, False
        if skip or not scaling.unscale_second(self.base_optimizer):
            return False
        self.adjust_sam_gradient(self._params_with_grad(), self._clean)
        return True

    def _finish(self, descend: bool, scaling: LossScaling, clean: Dict[torch.Tensor, torch.Tensor],
                zero_grad: bool = False) -> None:
        if not descend:  # fp16 overflow: a skipped step (the scaler backs off)
            self.zero_grad()
            self._updates += 1
            return
        self.observe_sam_gradient(self._params_with_grad(), clean)
        self._apply(scaling.step, zero_grad)
        self.after_sam_step()

    def _plain_step(self, scaling: LossScaling) -> None:
        """The base optimizer's step with the gradient at hand (``interval``): unscaled, overflow-checked, clipped."""
        scaling.unscale_first(self)
        params = self._params_with_grad()
        if scaling is not NO_SCALING and params:
            if scaling.first_overflowed(global_norm([p.grad for p in params], params)):
                self._finish(False, scaling, {})
                return
        self.adjust_plain_gradient(params)
        self._apply(lambda base: base.step())

    def _apply(self, step_fn: Callable[[torch.optim.Optimizer], Any], zero_grad: bool = False) -> None:
        """Clip the gradient about to be applied, step the base optimizer, count the update."""
        if self.settings.clip_grad is not None:
            mode = self.settings.clip_mode
            module = lambda: self._module('AGC cannot leave the classifier head out')  # noqa: E731
            params = clip_parameters(self._params_with_grad(), mode, self.recorder.task, module)
            dispatch_clip_grad(params, self.settings.clip_grad, mode=mode)
        step_fn(self.base_optimizer)  # scaler.step skips the update if the second pass overflowed
        self._updates += 1
        if zero_grad:
            self.zero_grad()

    def _hold_buffers(self) -> None:
        if not self._buffers.held:
            self._buffers.capture(self._module('its buffers (BatchNorm statistics) are updated by both passes'))

    def _keep(self, store: Dict[torch.Tensor, torch.Tensor], params: List[torch.Tensor],
              values: Optional[List[torch.Tensor]] = None,
              shapes: Optional[List[torch.Tensor]] = None) -> List[torch.Tensor]:
        """One persistent buffer per parameter in ``store`` (allocated once, shaped like ``values`` or ``shapes``:
        the rank's shard), filled with ``values`` if given."""
        out = []
        for i, p in enumerate(params):
            like = values[i] if values is not None else shapes[i]
            buf = store.get(p)
            if buf is None or buf.shape != like.shape or buf.dtype != like.dtype or buf.device != like.device:
                store[p] = buf = torch.empty_like(like, memory_format=torch.preserve_format)
            out.append(buf)
        if values is not None:
            foreach_copy_(out, values)
        return out

    def _module(self, purpose: str) -> Optional[nn.Module]:
        """The model given to SAM, else train.py's task's; warns once when there is neither."""
        module = self.model if self.model is not None else self.recorder.trainable_module()
        if module is None and purpose not in self._warned:
            self._warned.add(purpose)
            warnings.warn(f'SAM does not know the model, so {purpose}: pass model= to SAM or to '
                          f'create_optimizer_v2 (or call optimizer.set_model(model)) when driving SAM with '
                          f'first_step()/second_step() or a closure', stacklevel=5)
        return module

    # ---- hooks for SAM variants (SAM: nothing) ----------------------------------------------------------

    def prepare_sam_step(self) -> None:
        """Before each perturbation (GSAM sets this step's rho in the groups)."""

    def adjust_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """Turn the unscaled second-pass gradient ``p.grad`` into the one applied; ``clean[p]`` is g when
        ``needs_clean_gradient`` (GSAM's decomposition)."""

    def observe_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """See the gradient a SAM step is about to apply, and g (LookSAM keeps its new direction)."""

    def after_sam_step(self) -> None:
        """After the base optimizer's step of a SAM step: its per-parameter state exists now (LookSAM stores g_v
        there, beside the base optimizer's buffers)."""

    def adjust_plain_gradient(self, params: List[torch.Tensor]) -> None:
        """Change the gradient of a plain (non-SAM) step before it is applied (LookSAM's reuse)."""

    # ---- checkpoints, copies, repr ----------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The base optimizer's state dict (its groups carry rho/adaptive/eta) plus a ``"sam"`` entry: the
        optimizer-wide settings and the update count, so a resumed run continues exactly."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state_dict = self.base_optimizer.state_dict()
        state_dict['sam'] = sam_entry(self.settings, self._updates)
        for group in state_dict['param_groups']:  # where torch.distributed.checkpoint keeps it (it drops 'sam')
            group[GROUP_KEY] = dict(state_dict['sam'])
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            state_dict = post_hook(self, state_dict) or state_dict
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a SAM state dict, or a plain one of the base optimizer. Everything is checked before anything
        is loaded; the checkpoint's settings win, and each one that differs from this run's is logged."""
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            state_dict = pre_hook(self, state_dict) or state_dict
        state_dict, loaded = split_entry(state_dict)
        current = sam_entry(self.settings, self._updates)
        entry, settings = checked_entry(loaded, current, self.settings)
        groups = state_dict.get('param_groups', [])
        for idx, group in enumerate(groups):
            self.settings.check_group(group, f' in param group {idx} of the loaded state dict')
        changes = setting_changes(self.settings, self.param_groups, groups, current, entry)
        self.base_optimizer.load_state_dict(state_dict)
        self._add_group_defaults()
        self.settings, self._updates = settings, entry['step']
        if changes:
            _logger.warning('SAM settings from the loaded state dict replace this run\'s: %s', '; '.join(changes))
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def __getstate__(self) -> Dict[str, Any]:
        if self._perturbed is not None:
            raise RuntimeError('SAM cannot be copied or pickled between first_step() and second_step()')
        return {k: self.__dict__[k] for k in _COPIED}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        values = ', '.join(f'{k}={v!r}' for k, v in self.settings.optimizer_values().items())
        return f'{type(self).__name__}({self.base_optimizer!r}, {values})'
