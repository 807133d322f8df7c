"""Training-framework settings SAM cannot make exact, refused in one line before the first pass.

SAM knows no framework. A framework's integration module (``timm_ext.integrations.lightning``,
``timm_ext.integrations.accelerate``, both imported by ``import timm_ext``) registers its checks here, and
``SAM.step``'s driver asks them before anything moves: a closure that comes from
a setting that would make the update silently different from SAM, or a ``step()`` without a closure from a
framework that ran the closure itself.
"""
from typing import Any, Callable, List, Optional

__all__ = ['closure_problem', 'register_closure_check', 'register_stepless_check', 'stepless_problem']

ClosureCheck = Callable[[Callable[..., Any], Any], Optional[str]]
SteplessCheck = Callable[[Any], Optional[str]]
_closure_checks: List[ClosureCheck] = []
_stepless_checks: List[SteplessCheck] = []


def register_closure_check(check: ClosureCheck) -> None:
    """``check(closure, optimizer)``: the one line for a setting SAM cannot make exact, else None (once each)."""
    if check not in _closure_checks:
        _closure_checks.append(check)


def register_stepless_check(check: SteplessCheck) -> None:
    """``check(optimizer)`` for ``step()`` without a closure: the one line, else None (once each)."""
    if check not in _stepless_checks:
        _stepless_checks.append(check)


def closure_problem(closure: Callable[..., Any], optimizer: Any) -> Optional[str]:
    """The first registered check's line for this closure, None when there is none."""
    return next((p for check in _closure_checks if (p := check(closure, optimizer))), None)


def stepless_problem(optimizer: Any) -> Optional[str]:
    """The first registered check's line for a ``step()`` without a closure, None when there is none."""
    return next((p for check in _stepless_checks if (p := check(optimizer))), None)
