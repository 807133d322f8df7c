"""SAM under PyTorch Lightning: the settings SAM cannot make exact, refused in one line before the first update.

Imported by ``import timm_ext`` (it imports no Lightning); it registers its checks with
``timm_ext.optim.framework_checks``, so SAM itself knows nothing of Lightning.

Under automatic optimization Lightning hands ``SAM.step`` a closure built by its precision plugin,
``functools.partial(plugin._wrap_closure, lightning_module, optimizer, closure)``: one call runs
``training_step``, zero_grad and backward, then ``on_before_optimizer_step`` and the gradient clipping of
``Trainer(gradient_clip_val=...)``. SAM calls it at w and at w + e, so plain, ``bf16-mixed``, DDP, schedulers
and checkpoints are exact (``tests/test_integrations_lightning.py``). The trainer is read from the partial's
arguments (the ``LightningModule``'s ``.trainer``), never guessed. Refused here:

* ``gradient_clip_algorithm='value'``: it clips both passes, and clipping the first-pass gradient by value
  turns the ascent direction e (clipping by norm keeps it, and equals SAM's own ``clip_grad``);
* ``gradient_clip_val`` under GSAM / LookSAM: their update also reads the first-pass gradient Lightning clipped;
* ``m_sharpness``: Lightning's closure cannot take the ``chunk`` that cuts its batch;
* manual optimization's ``opt.step()`` without a closure: nothing to re-evaluate at w + e (after SAM's own
  ``first_step()`` that step finishes the update instead, and Lightning counts it: ``finishes_manual_step``;
  ``second_step()`` called instead is warned once, since Lightning does not count it: ``uncounted_second_step``);
* ``accumulate_grad_batches > 1``: Lightning runs the window's earlier micro-batches outside ``step`` and hands
  SAM a closure for the last one only, so SAM could not re-evaluate the window at w + e. The message names the
  Lightning pattern that can (manual optimization, a closure over the kept window; docs/integrations.md). This
  check is needed: outside Lightning, gradients from a backward before ``step(closure)`` are davda54/sam's first
  pass (``timm_ext.optim.left_gradients``), so only Lightning's own setting tells a window apart.

Some Lightning routes never give SAM a closure: ``precision='16-mixed'`` (``MixedPrecision`` and
``FSDPPrecision`` run the closure themselves, then ``GradScaler.step(optimizer)``) and DeepSpeed (its engine
steps). ``lightning_problem(None, optimizer)`` is asked only when ``SAM.step()`` has no closure and nothing to
replay, where SAM would refuse anyway: it names the setting from the trainer of the optimizer's model (the
``LightningModule`` that ``configure_optimizers`` gave ``create_optimizer_v2``: its precision plugin), reading no
frame. A SAM built over a submodule knows no trainer, and gets SAM's own one-line ``NoSecondPassError``; either
way, no weight moves. The closure checks are asked once per kind of closure (its function: the precision plugin's
``_wrap_closure``), not on every step.
"""
import functools
import sys
from typing import Any, Callable, Iterator, Optional

from timm_ext.optim.framework_checks import (
    register_closure_check,
    register_finishing_closure,
    register_stepless_check,
    register_uncounted_check,
)

__all__ = ['ACCUMULATE', 'CLIP_VALUE', 'CLIP_VARIANT', 'DEEPSPEED', 'FP16', 'M_SHARPNESS', 'MANUAL_NO_CLOSURE',
           'UNCOUNTED', 'finishes_manual_step', 'lightning_problem', 'uncounted_second_step']

_PREFIX = 'SAM under PyTorch Lightning: '
CLIP_VALUE = (
    _PREFIX + "Trainer(gradient_clip_val={val}, gradient_clip_algorithm='value') clips both of SAM's passes, and "
    "clipping the first-pass gradient by value turns the ascent direction: leave gradient_clip_val unset and clip "
    "the gradient SAM applies with the optimizer's clip_grad={val}, clip_mode='value' (opt_kwargs)")
CLIP_VARIANT = (
    _PREFIX + "Trainer(gradient_clip_val={val}) also clips the first-pass gradient that {name}'s update reads: "
    "leave gradient_clip_val unset and pass clip_grad={val}, clip_mode='{mode}' to the optimizer (opt_kwargs)")
M_SHARPNESS = (
    _PREFIX + "m_sharpness={m} needs a closure that takes SAM's chunk and cuts its batch with it, and Lightning's "
    "closure cannot: leave m_sharpness unset")
MANUAL_NO_CLOSURE = (
    _PREFIX + "manual optimization's opt.step() without a closure leaves SAM nothing to re-evaluate at w + e: "
    "call opt.step(closure=fn) (fn zeroes the grads, runs manual_backward and returns the loss), or "
    "opt.optimizer.first_step() before a second forward-backward and then opt.step()")
UNCOUNTED = (
    _PREFIX + "manual optimization counts opt.step(), not SAM's second_step(), so trainer.global_step does not "
    "advance and max_steps never ends the run: after the second manual_backward call opt.step() (it finishes the "
    "update first_step() began) instead of second_step()")
FP16 = (
    _PREFIX + "precision='16-mixed' runs the closure itself and then GradScaler.step(optimizer) without it, so "
    "SAM cannot evaluate the loss at w + e: use precision='bf16-mixed' (or '32-true')")
ACCUMULATE = (
    _PREFIX + "Trainer(accumulate_grad_batches={n}) runs the window's earlier micro-batches outside optimizer.step "
    "and hands SAM a closure for the last one only, so SAM cannot re-evaluate the window at w + e: leave "
    "accumulate_grad_batches unset and, for SAM on the accumulated batch, use manual optimization with "
    "opt.step(closure) over the kept window (docs/integrations.md, 'Gradient accumulation in Lightning')")
DEEPSPEED = (
    _PREFIX + "a DeepSpeed strategy steps the optimizer inside its engine without the closure (and partitions the "
    "gradients SAM takes one global norm of): use strategy='ddp'")


def lightning_problem(closure: Optional[Callable[..., Any]], optimizer: Any) -> Optional[str]:
    """The one line for a Lightning setting SAM cannot make exact; None when there is none (or no Lightning).

    ``closure`` is what ``SAM.step`` received: Lightning's wrapped closure, or None (then the trainer of the
    optimizer's model says whether a Lightning plugin steps SAM without one)."""
    if closure is None:
        return _stepped_without_closure(getattr(optimizer, 'model', None))
    module = _lightning_module_of(closure)
    if module is None:
        return None
    m_sharpness = getattr(getattr(optimizer, 'settings', None), 'm_sharpness', None)
    if m_sharpness:
        return M_SHARPNESS.format(m=m_sharpness)
    inner = closure.args[2] if len(closure.args) > 2 else None
    if not getattr(module, 'automatic_optimization', True) and _is_do_nothing_closure(inner):
        return MANUAL_NO_CLOSURE
    try:
        trainer = module.trainer
    except RuntimeError:  # not attached to a Trainer
        return None
    accumulate = getattr(trainer, 'accumulate_grad_batches', 1)
    if getattr(module, 'automatic_optimization', True) and isinstance(accumulate, int) and accumulate > 1:
        return ACCUMULATE.format(n=accumulate)
    clip_val = getattr(trainer, 'gradient_clip_val', None)
    if not clip_val or clip_val <= 0:
        return None
    algorithm = getattr(trainer, 'gradient_clip_algorithm', None) or 'norm'
    mode = str(getattr(algorithm, 'value', algorithm)).lower()  # a str, or GradClipAlgorithmType.VALUE
    if mode == 'value':
        return CLIP_VALUE.format(val=clip_val)
    if getattr(optimizer, 'needs_clean_gradient', False):  # GSAM, LookSAM: their hooks read the clipped g
        family = getattr(getattr(optimizer, 'Settings', None), 'family', type(optimizer).__name__)
        return CLIP_VARIANT.format(val=clip_val, name=family, mode=mode)
    return None


def _lightning_roots() -> Iterator[Any]:
    """The Lightning packages this process has imported (``lightning.pytorch``, ``pytorch_lightning``)."""
    for name in ('lightning.pytorch', 'pytorch_lightning'):
        root = sys.modules.get(name)
        if root is not None and hasattr(root, 'LightningModule'):
            yield name, root


def _lightning_module_of(closure: Any) -> Optional[Any]:
    """The LightningModule among the arguments of a precision plugin's wrapped closure, else None."""
    if not isinstance(closure, functools.partial):
        return None
    for _, root in _lightning_roots():
        for arg in closure.args:
            if isinstance(arg, root.LightningModule):
                return arg
    return None


def _is_do_nothing_closure(inner: Any) -> bool:
    for name, _ in _lightning_roots():
        optimizer_module = sys.modules.get(f'{name}.core.optimizer')
        if optimizer_module is not None and inner is getattr(optimizer_module, 'do_nothing_closure', None):
            return True
    return False


def finishes_manual_step(closure: Any) -> bool:
    """Manual optimization's ``opt.step()`` without a closure: Lightning's closure around its do-nothing one, which
    runs no pass (after ``first_step()`` it finishes SAM's update, and Lightning counts the step)."""
    module = _lightning_module_of(closure)
    inner = closure.args[2] if module is not None and len(closure.args) > 2 else None
    return module is not None and not getattr(module, 'automatic_optimization', True) and _is_do_nothing_closure(inner)


def uncounted_second_step(optimizer: Any) -> Optional[str]:
    """UNCOUNTED for ``second_step()`` called on Lightning's wrapper (``self.optimizers()``), or on a SAM whose model
    is a LightningModule under manual optimization on a trainer; else None."""
    for name, _ in _lightning_roots():
        wrapper = getattr(sys.modules.get(f'{name}.core.optimizer'), 'LightningOptimizer', None)
        if wrapper is not None and isinstance(optimizer, wrapper):
            return UNCOUNTED
    model = getattr(optimizer, 'model', None)
    if not any(isinstance(model, root.LightningModule) for _, root in _lightning_roots()):
        return None
    try:
        model.trainer  # noqa: B018  (raises when not attached to a Trainer)
    except RuntimeError:
        return None
    return None if getattr(model, 'automatic_optimization', True) else UNCOUNTED


def _stepped_without_closure(model: Any) -> Optional[str]:
    """FP16 or DEEPSPEED when ``model`` is a LightningModule whose trainer's precision plugin never passes SAM the
    closure (fp16 ``MixedPrecision`` / ``FSDPPrecision`` with a GradScaler, ``DeepSpeedPrecision``)."""
    if not any(isinstance(model, root.LightningModule) for _, root in _lightning_roots()):
        return None
    try:
        plugin = model.trainer.precision_plugin
    except (RuntimeError, AttributeError):  # not attached to a Trainer
        return None
    kinds = {cls.__name__ for cls in type(plugin).__mro__}
    if 'DeepSpeedPrecision' in kinds:
        return DEEPSPEED
    if kinds & {'MixedPrecision', 'FSDPPrecision'} and getattr(plugin, 'scaler', None) is not None:
        return FP16
    return None


register_closure_check(lightning_problem)
register_stepless_check(lambda optimizer: lightning_problem(None, optimizer))
register_finishing_closure(finishes_manual_step)
register_uncounted_check(uncounted_second_step)
