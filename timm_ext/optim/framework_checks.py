"""Training-framework settings SAM cannot make exact, refused in one line before the first pass.

``SAM.step(closure)`` asks each framework's check whether the closure comes from a setting that would make the
update silently different from SAM (Lightning's value clipping of the first-pass gradient, Accelerate's
accumulation that never hands SAM the earlier micro-batches, ...). A check imports its framework only when the
process has already imported it, so a process without that framework pays nothing.
"""
import sys
from typing import Any, Callable, Optional

__all__ = ['framework_problem', 'stepless_problem']


def framework_problem(closure: Callable[..., Any], optimizer: Any) -> Optional[str]:
    """The one line for the first framework setting SAM cannot make exact, None when there is none."""
    if 'lightning' in sys.modules or 'pytorch_lightning' in sys.modules:
        from timm_ext.optim.lightning_checks import lightning_problem
        problem = lightning_problem(closure, optimizer)
        if problem:
            return problem
    if 'accelerate' in sys.modules:
        from timm_ext.optim.accelerate_checks import accelerate_problem
        problem = accelerate_problem(closure, optimizer)
        if problem:
            return problem
    return None


def stepless_problem(optimizer: Any) -> Optional[str]:
    """The one line for a framework that calls ``step()`` without a closure after running the closure itself
    (Lightning's fp16 and DeepSpeed plugins), None otherwise."""
    if 'lightning' in sys.modules or 'pytorch_lightning' in sys.modules:
        from timm_ext.optim.lightning_checks import lightning_problem
        return lightning_problem(None, optimizer)
    return None
