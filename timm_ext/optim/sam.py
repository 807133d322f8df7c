""" SAM: Sharpness-Aware Minimization (and ASAM) around any timm/torch optimizer

Papers: 'Sharpness-Aware Minimization for Efficiently Improving Generalization' (Foret et al., 2021),
'When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations'
(Chen et al., 2022); ASAM: 'Adaptive Sharpness-Aware Minimization' (Kwon et al., 2021).

One update, as the paper writes it:

    g = grad L(w)                      # first pass, at w
    e = rho * g / ||g||                # one global L2 norm; ASAM: T = |w| + eta, e = rho T^2 g / ||T g||
    h = grad L(w + e)                  # second pass, same dropout / drop-path masks as the first
    w = base_optimizer.step(w, h)      # from w, with the gradient taken at w + e

``step(closure)`` is that update, top to bottom (``_closure_update``; the arithmetic in ``sam_functional``); its halves
``first_step()`` / ``second_step()`` go around your second pass; ``step()`` alone replays timm's training task. A plain
fp32 step enters only what it uses: fp16 scaling, m-sharpness, sharded parameters, the task replay, a framework's
refusals (once per kind of closure), a variant's hooks (None here) enter when configured or met.
"""
import warnings
import weakref
from contextlib import nullcontext
from functools import partial
from typing import Any, Callable, ClassVar, Dict, List, Optional

import torch
import torch.nn as nn
from torch.random import fork_rng

from timm_ext.optim import sam_functional
from timm_ext.optim.base_optimizer import WrappedOptimizer, check_model
from timm_ext.optim.batch_norm_watch import BatchNormWatch
from timm_ext.optim.framework_checks import closure_finishes, refuse_closure, stepless_problem, warn_if_uncounted
from timm_ext.optim.left_gradients import LeftGradients
from timm_ext.optim.loss_scaling import LossScaling, SecondPassScaler, explicit_scaling, scaling_for
from timm_ext.optim.m_sharpness import chunked_closure_step
from timm_ext.optim.sam_checkpoint import SAMCheckpointing
from timm_ext.optim.sam_errors import FINISH_ONLY, HOW_TO_USE, NO_MODEL, UNKNOWN_MODEL, NoSecondPassError
from timm_ext.optim.sam_functional import sam_perturb_, sam_restore_
from timm_ext.optim.sam_settings import ASAM_ETA, SAM_RHO, SAMSettings
from timm_ext.optim.sharded import global_norm, is_sharded, local, zero_gradient

__all__ = ['SAM']


class SAM(SAMCheckpointing, WrappedOptimizer):
    """ Sharpness-Aware Minimization around any torch/timm optimizer.

    Args:
        params: the optimizer to wrap (an instance), or, as in davda54/sam, the parameters for ``base_optimizer``.
        base_optimizer: davda54/sam style: the optimizer class, built as ``base_optimizer(params, **base_kwargs)``.
        rho: neighbourhood radius; a param group may carry its own ``rho``.
        adaptive: ASAM (scale-invariant neighbourhood ``T = |w| + eta``); per group allowed.
        eta: ASAM's offset in ``T``; per group allowed. None: 0.01 (the ASAM paper's), 0 in davda54/sam's constructor
            form (``SAM(params, SGD, adaptive=True)``), whose ASAM (and pytorch-optimizer's) has ``T = |w|``.
        clip_grad: clip the gradient SAM applies (the second-pass one); None for no clipping.
        clip_mode: 'norm', 'value' or 'agc' (timm's ``dispatch_clip_grad``); 'agc' leaves the head out.
        model: module whose buffers (BatchNorm statistics) keep their first-pass values and whose head AGC
            leaves out (timm's factory passes the one ``create_optimizer_v2`` got; train.py's task gives its own).
        interval: a SAM step every ``interval``-th update, a plain base-optimizer step in between.
        m_sharpness: images per perturbation: each worker's batch is cut into chunks of this many images,
            each ascends with its own gradient, and the descent gradient is the chunks' mean (``m_sharpness``).
        use_gc: GC-SAM: the first-pass gradient centralized (each weight's output channels to mean 0, tensors of 2
            or more dimensions) before anything reads it, so the perturbation is along it (``sam_functional``).
        **base_kwargs: davda54/sam style: the base optimizer's arguments (``lr``, ``momentum``, ...).

    Three ways to drive it: ``step(closure)`` (torch's or davda54/sam's closure convention); ``first_step()`` and
    ``second_step()`` around your second forward-backward; ``step()`` over timm's training task (``replay_timm_task``).
    """
    _step_supports_amp_scaling = True  # GradScaler.step(sam) hands SAM the scale (see loss_scaling)
    Settings = SAMSettings  # a family's settings: its checks, its state-dict entry, its repr
    needs_clean_gradient = False  # keep the first-pass gradient g for the hooks (GSAM, LookSAM)
    _copied = ('base_optimizer', 'settings', 'model', '_updates', '_perturbed', '_skip', '_sharded')

    # a variant's hooks, None in SAM (a step enters only those a variant defines; GSAM's and LookSAM's say what):
    prepare_sam_step: ClassVar[Optional[Callable[..., None]]] = None  # () before each perturbation
    adjust_sam_gradient: ClassVar[Optional[Callable[..., None]]] = None  # (params, clean): h -> the applied gradient
    observe_sam_gradient: ClassVar[Optional[Callable[..., None]]] = None  # (params, clean): before the base step
    after_sam_step: ClassVar[Optional[Callable[..., None]]] = None  # (): after a SAM step's base step
    adjust_plain_gradient: ClassVar[Optional[Callable[..., None]]] = None  # (params): a plain step's gradient
    sam_parameters: ClassVar[Optional[Callable[..., Any]]] = None  # (): the only parameters perturb() moves (SAM-ON)
    sample_selector: ClassVar[Optional[Callable[..., Any]]] = None  # (before, after): the second pass's rows (ESAM)

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            rho: float = SAM_RHO,
            adaptive: bool = False,
            eta: Optional[float] = None,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
            interval: int = 1,
            m_sharpness: Optional[int] = None,
            use_gc: bool = False,
            **base_kwargs: Any,
    ) -> None:
        if eta is None:  # code written for davda54/sam gets davda54/sam's ASAM
            eta = 0.0 if isinstance(base_optimizer, type) else ASAM_ETA
        given = dict(rho=rho, adaptive=adaptive, eta=eta, clip_grad=clip_grad, clip_mode=clip_mode,
                     interval=interval, m_sharpness=m_sharpness, use_gc=use_gc)
        names = self.Settings.init_names()  # a family's own settings arrive through **base_kwargs
        given.update({name: base_kwargs.pop(name) for name in names if name in base_kwargs})
        self.settings = self.Settings(**{name: value for name, value in given.items() if name in names})
        self._wrap(params, base_optimizer, base_kwargs, (*names, 'model'), self.Settings.family)
        self.set_model(model)
        self.defaults.update(self.settings.group_defaults())
        self._add_group_defaults()
        self._updates = 0  # updates done, SAM or plain: decides which one is due
        self._perturbed: Optional[List[torch.Tensor]] = None  # the parameters perturb() moved
        self._skip = False  # this update overflowed in fp16: restore, step nothing
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._backup: Dict[torch.Tensor, torch.Tensor] = {}  # w during the second pass (allocated once)
        self._clean: Dict[torch.Tensor, torch.Tensor] = {}  # g, for the hooks that need it
        self._buffer_copies: Dict[torch.Tensor, torch.Tensor] = {}  # the model's buffers during the second pass
        self._held: Optional[List[torch.Tensor]] = None  # the buffers held this update
        self._warned: set = set()
        self.replay: Optional[Any] = None  # timm's training task, replayed by step() (replay_timm_task attaches it)
        self.second_pass = SecondPassScaler()  # fp16 under torch's attribute contract: the second pass's scaler
        self.left = LeftGradients([p for group in self.param_groups for p in group['params']])  # closure conventions
        self._closure_checked: Any = None  # the kind of closure the framework checks found nothing wrong with
        self._uncounted_checked = False  # whether second_step() asked the frameworks if they count it
        self._home = weakref.ref(self)  # on a copy of this __dict__ (Lightning's wrapper) the halves step this SAM
        self._moves_buffers: Optional[bool] = None  # without a model: whether the pass at w + e moves BN statistics
        self._watch: Optional[BatchNormWatch] = None  # around the first pass at w + e, to tell that (no model)
        # ||g||: torch's own (>= 2.6) or the same sum on older torch; over every rank's shards under FSDP2 (perturb)
        self._norm = partial(torch.nn.utils.get_total_norm, foreach=True) if sam_functional.HAS_GET_TOTAL_NORM \
            else sam_functional.total_norm
        self._init_wrapper()

    def _add_group_defaults(self) -> None:
        for idx, group in enumerate(self.param_groups):
            group.update({k: v for k, v in self.settings.group_defaults().items() if k not in group})
            self.settings.check_group(group, where=f' in param group {idx}')
        self._sharded = any(is_sharded(p) for group in self.param_groups for p in group['params'])  # FSDP2

    def set_model(self, model: Optional[nn.Module]) -> None:  # whose buffers SAM holds, whose head AGC leaves out
        check_model(model, self.Settings.family)
        self.model = model

    def attach_replay(self, replay: Optional[Any]) -> None:
        """``step()`` without a closure replays ``replay`` (``replay_timm_task``); the one attached before closes."""
        if self.replay is not None:
            self.replay.close()
        self.replay = replay

    sam_step_due = property(lambda self: self._updates % self.settings.interval == 0,
                            doc='Whether the next update is a SAM step (every interval-th, the first one included).')
    perturbed = property(lambda self: self._perturbed is not None, doc='Between first_step() and second_step().')

    def clean_gradients(self) -> Dict[torch.Tensor, torch.Tensor]:  # g of the last ascent (GSAM, LookSAM)
        return self._clean

    def extra_memory_bytes(self) -> int:  # beside the base optimizer: the copy of w (GSAM/LookSAM: of g) and buffers
        return sum(t.numel() * t.element_size() for kept in (self._backup, self._clean, self._buffer_copies)
                   for t in kept.values())

    def params_with_grad(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group['params'] if p.grad is not None]

    # ---- the update --------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Optional[Callable[..., Any]] = None, grad_scaler: Optional[Any] = None,
             no_sync: Optional[Callable[[], Any]] = None) -> Optional[Any]:
        """One update (a plain one when ``interval`` says so); after ``first_step()``, the rest of it. ``closure``:
        torch's convention (it zeroes, back-propagates and returns the loss; run at w and w + e; the loss at w is
        returned) or davda54/sam's (your backward at w came first; run at w + e only; None returned); none: timm's
        training task replayed. ``grad_scaler``: the closure's fp16 scaler; ``no_sync``: the first pass runs in it."""
        if closure is None or self._perturbed is not None:
            return self._step_without_closure(grad_scaler, no_sync, closure)
        scaled = grad_scaler is not None or getattr(self, 'found_inf', None) is not None
        kind = (getattr(closure, 'func', type(closure)), scaled)  # a framework's wrapped closure names it in func
        if kind != self._closure_checked:  # the framework checks: once per kind of closure
            refuse_closure(closure, self)
            self._closure_checked = kind
        if self.replay is not None:
            self.replay.close()  # a closure drives this SAM: the training task's replay is never needed
        scaling = scaling_for(self, grad_scaler, self.second_pass) if scaled else None
        if self.settings.m_sharpness:
            return chunked_closure_step(self, closure, scaling, no_sync)
        return self._closure_update(closure, scaling, no_sync)

    def _closure_update(self, closure: Callable[[], Any], scaling: Optional[LossScaling],
                        no_sync: Optional[Callable[[], Any]]) -> Any:
        """``step(closure)``: the gradient at w (the closure, unless the caller's backward gave it), up to w + e, the
        gradient there (the closure, drawing the first pass's dropout and drop-path masks), back to w, base step."""
        params = [p for group in self.base_optimizer.param_groups for p in group['params']]
        first_pass_done = self.left.first_pass_done(params)  # davda54/sam's convention: the caller's backward
        loss = None
        if self._updates % self.settings.interval:  # a plain step: one pass
            if not first_pass_done:
                with torch.enable_grad():
                    loss = closure()
                self.left.check_closure_zeroed(params)
            self.plain_step(scaling)
            self.left.record(params)
            return loss
        if not first_pass_done:  # in a fork of the generators: the pass at w + e draws what this one drew
            sync = no_sync() if no_sync is not None else nullcontext()
            devices = sam_functional.cuda_devices_of(params) if torch.cuda.is_initialized() else []
            with fork_rng(devices=devices), sync, torch.enable_grad():
                loss = closure()
            self.left.check_closure_zeroed(params)
        self._update_from_here(closure, scaling)
        self.left.record(params)
        return loss

    def _update_from_here(self, second_pass: Callable[[], Any], scaling: Optional[LossScaling]) -> None:
        """The update once the gradient at w is there: up to w + e, ``second_pass()`` there (none after an fp16
        overflow), back to w, the base step. Weights and buffers are back at w whatever fails in between."""
        try:
            self.ascend(scaling)
            self.base_optimizer.zero_grad()
            if not self._skip:  # an fp16 overflow in the first pass: no second one
                with torch.enable_grad():
                    second_pass()
            descend = self.descend(scaling)
        except BaseException:
            self.cancel_step()
            raise
        if self._held is not None:
            self.release_buffers()
        self.apply_descent(descend, scaling, self._clean)

    def _step_without_closure(self, grad_scaler: Optional[Any], no_sync: Optional[Callable[[], Any]],
                              closure: Optional[Callable[..., Any]] = None) -> Any:
        """``step()``: the rest of an update begun by ``first_step()`` (also a framework's step whose closure runs no
        pass: Lightning's manual optimization); else the task replay; else, with no second pass needed (no gradient,
        a zero one, a plain ``interval`` step), the base step; else a refusal."""
        if self._perturbed is not None:  # after first_step() and your second backward
            if getattr(self, 'found_inf', None) is not None or not (closure is None or closure_finishes(closure)):
                self.cancel_step()
                raise RuntimeError(FINISH_ONLY)
            if closure is not None:
                closure()  # the framework's hooks around its step (Lightning's on_before_optimizer_step)
            self._uncounted_checked = True  # a framework's own step() finishes the update: it counts it
            self.second_step(grad_scaler=grad_scaler)
            return None
        if no_sync is not None:
            raise ValueError('SAM.step(no_sync=...) needs a closure (the first pass is train.py\'s own)')
        scaled = grad_scaler is not None or getattr(self, 'found_inf', None) is not None
        scaling = scaling_for(self, grad_scaler, self.second_pass) if scaled else None
        has_grads = any(p.grad is not None for group in self.base_optimizer.param_groups for p in group['params'])
        if self.replay is None or not self.replay.has_calls:
            if not has_grads:
                return None  # no gradient anywhere: nothing to step, as for any torch optimizer
            if self._updates % self.settings.interval or zero_gradient(self.params_with_grad()):
                # g = 0: e = 0, the pass at w + e is the one at w (torch.distributed.checkpoint steps on zero
                # gradients to create the optimizer's state); a plain step (interval) needs no second pass
                self.plain_step(scaling)
                return None
            if self.replay is None:
                problem = stepless_problem(self)  # a framework that stepped SAM without its closure, named
                if problem:
                    raise ValueError(problem)
                raise NoSecondPassError('SAM.step() without a closure can only re-evaluate the loss by replaying a '
                                        f'timm training task, and none was attached to this optimizer: {HOW_TO_USE}')
        due = self._updates % self.settings.interval == 0
        calls = self.replay.take_calls(has_grads, due)  # a one-line error where there is nothing to replay
        m_sharpness = self.settings.m_sharpness
        if not due:
            self.plain_step(scaling)  # train.py ran the one pass
        elif m_sharpness and not self.replay.is_one_chunk(calls, m_sharpness):
            self.replay.chunked_step(self, calls, scaling)
        else:  # train.py's backward was the first pass: the task's calls replayed at w + e (ESAM: rows it selects)
            replay = self.replay.replay if self.sample_selector is None else self.replay.replay_selected
            self._update_from_here(partial(replay, calls, scaling.scale if scaling else None), scaling)
        return None

    # ---- its two halves ----------------------------------------------------------------------------------

    @torch.no_grad()
    def first_step(self, zero_grad: bool = True, grad_scaler: Optional[Any] = None) -> None:
        """After the backward at w: move to w + e, consuming the gradient (set to None unless not ``zero_grad``).
        ``grad_scaler`` (fp16) unscales it first; an inf/NaN makes this update a skipped one."""
        if self._home() is not self:  # called on Lightning's wrapper, which copied this SAM's attributes
            return self._home().first_step(zero_grad, grad_scaler)
        if self.settings.m_sharpness:
            raise RuntimeError(f'SAM m_sharpness={self.settings.m_sharpness} needs SAM to run the passes per '
                               f'chunk: use step(closure) or train.py\'s task route, not first_step()/second_step()')
        if self._perturbed is not None:
            raise RuntimeError('SAM.first_step() was called twice; call second_step() after the second backward')
        if not any(p.grad is not None for group in self.base_optimizer.param_groups for p in group['params']):
            raise RuntimeError('SAM.first_step() found no gradients: run forward and backward at w first')
        if self.replay is not None:
            self.replay.close()  # an explicit loop never needs the training task's replay
        self.ascend(explicit_scaling(grad_scaler) if grad_scaler is not None else None)
        if zero_grad:
            self.base_optimizer.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False, grad_scaler: Optional[Any] = None) -> None:
        """After the backward at w + e: back to w bit-exactly, then the base optimizer's step with that gradient."""
        home = self._home()
        if not home._uncounted_checked:  # once: a framework that counts only its own step() warns (Lightning)
            home._uncounted_checked = warn_if_uncounted(self)
        if home is not self:
            return home.second_step(zero_grad, grad_scaler)
        scaling = explicit_scaling(grad_scaler) if grad_scaler is not None else None
        descend = self.descend(scaling)
        if self._held is not None:
            self.release_buffers()
        self.apply_descent(descend, scaling, self._clean, zero_grad)

    def ascend(self, scaling: Optional[LossScaling] = None) -> None:
        """Unscale g (fp16), a variant's preparation, buffers held, perturb; no model: a ``BatchNormWatch`` (SAM's)."""
        if scaling is not None:
            scaling.unscale_first(self)
        if self.settings.use_gc:
            sam_functional.centralize_gradients_([local(p.grad) for p in self.params_with_grad()])
        if self.prepare_sam_step is not None:
            self.prepare_sam_step()
        if self._held is None and self.model is not None and next(self.model.buffers(), None) is not None:
            self.hold_buffers()
        norm = self.perturb()
        self._skip = scaling is not None and scaling.first_overflowed(norm)
        if self.model is None and self._moves_buffers is None and not self._skip and self._watch is None:
            self._watch = BatchNormWatch().start(self)

    @torch.no_grad()
    def perturb(self) -> float:
        """Back w up and move to w + e with the gradient at hand (at its true scale). Returns ||g||
        (ASAM: ||T g||); a zero or non-finite norm leaves w where it is. ``restore()`` undoes it."""
        if self._perturbed is not None:
            raise RuntimeError('SAM.perturb() was called twice; call restore() (or second_step()) first')
        groups, norm, only = [], self._norm, self.sam_parameters() if self.sam_parameters is not None else None
        for group in self.base_optimizer.param_groups:
            params = [p for p in group['params'] if p.grad is not None and (only is None or p in only)]
            if params:  # under FSDP2 this rank's shards of the weights and gradients, else the tensors themselves
                groups.append((group, params, [local(p) for p in params] if self._sharded else params,
                               [local(p.grad) if self._sharded else p.grad for p in params]))
        if self._sharded:  # the norm over every rank's shards (one all-reduce)
            norm = partial(global_norm, params=[p for _, ps, _, _ in groups for p in ps])
        clean = self._clean if self.needs_clean_gradient else None
        norm = sam_perturb_(groups, self._backup, clean, norm)
        self._perturbed = [p for _, ps, _, _ in groups for p in ps]
        return norm

    @torch.no_grad()
    def restore(self) -> None:
        """Put back, bit-exactly, the weights ``perturb()`` moved."""
        perturbed, self._perturbed = self._perturbed or [], None
        sam_restore_([local(p) for p in perturbed] if self._sharded else perturbed, perturbed, self._backup)

    def descend(self, scaling: Optional[LossScaling] = None) -> bool:
        """Back to w; the second-pass gradient unscaled (fp16) and adjusted (GSAM). False: this update is skipped."""
        if self._perturbed is None:
            raise RuntimeError('SAM.second_step() was called before first_step()')
        if self._watch is not None:  # no model: warn if the first pass at w + e moved BatchNorm statistics
            self._watch, self._moves_buffers = None, self._watch.stop()
            if self._moves_buffers:
                self._module(NO_MODEL)
        self.restore()
        skip, self._skip = self._skip, False
        if skip or (scaling is not None and not scaling.unscale_second(self.base_optimizer)):
            return False
        if self.adjust_sam_gradient is not None:
            self.adjust_sam_gradient(self.params_with_grad(), self._clean)
        return True

    def apply_descent(self, descend: bool, scaling: Optional[LossScaling], clean: Dict[torch.Tensor, torch.Tensor],
                      zero_grad: bool = False) -> None:
        """The base optimizer's step with the (adjusted) second-pass gradient; a skipped update when not ``descend``."""
        if not descend:  # fp16 overflow: a skipped step (the scaler backs off)
            self.base_optimizer.zero_grad()
            self._updates += 1
            return
        if self.observe_sam_gradient is not None:
            self.observe_sam_gradient(self.params_with_grad(), clean)
        if self.settings.clip_grad is not None:
            self._clip()
        scaler = scaling.step_scaler() if scaling is not None else None  # fp16: it skips an overflowed step
        if scaler is None:
            self.base_optimizer.step()
        else:
            scaler.step(self.base_optimizer)
        if scaling is not None:
            scaling.after_step()
        self._updates += 1
        if self.after_sam_step is not None:
            self.after_sam_step()
        if zero_grad:
            self.base_optimizer.zero_grad()

    def plain_step(self, scaling: Optional[LossScaling] = None) -> None:
        """The base optimizer's step with the gradient at hand (``interval``): unscaled, overflow-checked, clipped."""
        params = self.params_with_grad()
        if scaling is not None:
            scaling.unscale_first(self)
            if params and scaling.gradient_overflowed(params):
                self.apply_descent(False, scaling, {})
                return
        if self.adjust_plain_gradient is not None:
            self.adjust_plain_gradient(params)
        if self.settings.clip_grad is not None:
            self._clip()
        self.base_optimizer.step()
        self._updates += 1

    @torch.no_grad()
    def cancel_step(self) -> None:
        """Abandon a step begun by ``first_step()``: weights and buffers back as they were at w, nothing stepped."""
        self._skip = False
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()  # an abandoned pass at w + e decides nothing
        self.restore()
        self.release_buffers()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)
        if not set_to_none:  # zeros in place: the same tensors, a new version, and not a backward's (closures)
            self.left.record([p for group in self.param_groups for p in group['params']], zeros=True)

    def _clip(self) -> None:
        mode = self.settings.clip_mode
        module = self._module('AGC cannot leave the classifier head out') if mode == 'agc' else None
        sam_functional.clip_gradient_(self.params_with_grad(), self.settings.clip_grad, mode, module)

    # ---- the model's buffers, warnings -----------------------------------------------------------------------

    def hold_buffers(self) -> None:
        """Copy the model's buffers (BatchNorm statistics), once per update, so the second pass cannot move them."""
        if self._held is None:
            self._held = sam_functional.hold_buffers_(self.model, self._buffer_copies) or None  # None: nothing held

    def release_buffers(self) -> None:  # the held buffers back to their first-pass values
        if self._held is not None:
            sam_functional.restore_buffers_(self._held, self._buffer_copies)
        self._held = None

    def _module(self, purpose: str) -> Optional[nn.Module]:  # warns once per purpose when SAM has no model
        if self.model is None and purpose not in self._warned:
            self._warned.add(purpose)
            warnings.warn(UNKNOWN_MODEL.format(purpose=purpose), stacklevel=5)
        return self.model

    # ---- copies, repr (checkpoints: SAMCheckpointing) ----------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        if self._perturbed is not None:
            raise RuntimeError('SAM cannot be copied or pickled between first_step() and second_step()')
        return super().__getstate__()

    def __repr__(self) -> str:
        values = ', '.join(f'{k}={v!r}' for k, v in self.settings.optimizer_values().items())
        return f'{self.Settings.family}({self.base_optimizer!r}, {values})'
