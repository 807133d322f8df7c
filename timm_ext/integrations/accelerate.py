"""SAM under Hugging Face Accelerate: the settings SAM cannot make exact with a closure, refused in one line.

Imported by ``import timm_ext`` (it imports no Accelerate); it registers its check with
``timm_ext.optim.framework_checks``, so SAM itself knows nothing of Accelerate.

Hugging Face Accelerate wraps the optimizer given to ``accelerator.prepare`` in an ``AcceleratedOptimizer``
(``accelerate/optimizer.py``), whose ``step(closure)`` calls the wrapped optimizer only when
``GradientState.sync_gradients`` is true, through ``scaler.step(optimizer, closure)`` when it holds an fp16
``GradScaler``. Two settings therefore make ``SAM.step(closure)`` silently different from SAM:

* ``gradient_accumulation_steps > 1``: on the window's earlier micro-batches the wrapper never calls ``step``
  (nor the closure), so the closure SAM finally gets holds the last micro-batch alone.
* ``mixed_precision='fp16'`` on a device with a ``GradScaler``: the closure scales its loss with the scaler's
  scale, while ``GradScaler.step`` hands SAM a scale and an inf check made before the closure ran.

The check is asked once per kind of closure a SAM is stepped with, never on every step, and it reads no frame:
it finds the ``AcceleratedOptimizer`` that holds this SAM among the objects that refer to it (``gc.get_referrers``:
Accelerate's ``prepare`` made it, and keeps the SAM as its ``optimizer``), and reads that wrapper's own settings.
So a closure loop over a SAM that Accelerate never wrapped is never refused, whatever an earlier ``Accelerator`` of
the process left in Accelerate's process-wide ``GradientState``. Accelerate is never imported here: the check reads
``sys.modules``, so it looks only in a process that has imported Accelerate.
"""
import gc
import sys
from typing import Any, Callable, Optional

from timm_ext.optim.framework_checks import register_closure_check

__all__ = ['ACCELERATE_ACCUMULATION', 'ACCELERATE_FP16', 'accelerate_problem', 'accelerated_wrapper']

ACCELERATE_ACCUMULATION = (
    'SAM.step(closure) under Accelerate with gradient_accumulation_steps={steps}: Accelerate calls step only on '
    'the last micro-batch of each window, so SAM would re-evaluate that micro-batch alone at w + e, not the '
    'accumulated batch: keep the window\'s micro-batches and, when accelerator.sync_gradients, call '
    'sam.first_step() (the SAM given to prepare), replay them with accelerator.backward, then optimizer.step() '
    '(docs/integrations.md, Accelerate), or use gradient_accumulation_steps=1')

ACCELERATE_FP16 = (
    'SAM.step(closure) under Accelerate mixed_precision=\'fp16\': Accelerate steps through '
    'GradScaler.step(optimizer, closure), whose loss scale and inf check SAM\'s two closure passes cannot use: '
    'use mixed_precision=\'bf16\' (or \'no\')')


def accelerated_wrapper(optimizer: Any) -> Optional[Any]:
    """The ``AcceleratedOptimizer`` (or subclass) that holds ``optimizer``, None when Accelerate never wrapped it
    (or was never imported). Found among the objects that refer to ``optimizer``: the wrapper itself, or its
    ``__dict__`` where the instance keeps one apart."""
    module = sys.modules.get('accelerate.optimizer')
    wrapper_type = getattr(module, 'AcceleratedOptimizer', None)
    if wrapper_type is None:
        return None
    for holder in gc.get_referrers(optimizer):
        if isinstance(holder, dict) and holder.get('optimizer') is optimizer:
            owners = [o for o in gc.get_referrers(holder) if getattr(o, '__dict__', None) is holder]
        else:
            owners = [holder]
        for owner in owners:
            if isinstance(owner, wrapper_type) and getattr(owner, 'optimizer', None) is optimizer:
                return owner
    return None


def accelerate_problem(closure: Callable[..., Any], optimizer: Any) -> Optional[str]:
    """The one line for an Accelerate setting that would make ``optimizer.step(closure)`` silently different
    from SAM, None when there is none (or when Accelerate does not wrap ``optimizer``)."""
    wrapper = accelerated_wrapper(optimizer)
    if wrapper is None:
        return None
    gradient_state = getattr(wrapper, 'gradient_state', None)
    steps = getattr(gradient_state, 'num_steps', 1) or 1
    if steps > 1:
        return ACCELERATE_ACCUMULATION.format(steps=steps)
    scaler = getattr(wrapper, 'scaler', None)
    if scaler is not None and getattr(scaler, 'is_enabled', lambda: True)():
        return ACCELERATE_FP16
    return None


register_closure_check(accelerate_problem)
