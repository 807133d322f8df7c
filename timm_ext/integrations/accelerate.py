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

Only a ``step`` called by an ``AcceleratedOptimizer`` is checked (found among the callers' frames), so a closure
loop that Accelerate does not drive is never refused, whatever an earlier ``Accelerator`` of the process left
in Accelerate's process-wide ``GradientState``. Accelerate is never imported here: the check reads
``sys.modules``, so it finds an ``AcceleratedOptimizer`` only in a process that has imported Accelerate.
"""
import sys
from typing import Any, Callable, Optional

from timm_ext.optim.framework_checks import register_closure_check

__all__ = ['ACCELERATE_ACCUMULATION', 'ACCELERATE_FP16', 'accelerate_problem', 'accelerated_caller']

_MAX_FRAMES = 24  # AcceleratedOptimizer.step -> (GradScaler.step ->) torch's step wrapper -> SAM.step -> checks

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


def accelerated_caller() -> Optional[Any]:
    """The ``AcceleratedOptimizer`` (or subclass) whose ``step`` is among the callers, None when the step does
    not come from Accelerate."""
    module = sys.modules.get('accelerate.optimizer')
    wrapper_type = getattr(module, 'AcceleratedOptimizer', None)
    if wrapper_type is None:
        return None
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == 'step' and isinstance(frame.f_locals.get('self'), wrapper_type):
            return frame.f_locals['self']
        frame = frame.f_back
    return None


def accelerate_problem(closure: Callable[..., Any], optimizer: Any) -> Optional[str]:
    """The one line for an Accelerate setting that would make ``optimizer.step(closure)`` silently different
    from SAM, None when there is none (or when Accelerate is not the caller)."""
    wrapper = accelerated_caller()
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
