"""Training-framework settings SAM cannot make exact, refused in one line before the first pass.

SAM knows no framework. A framework's integration module (``timm_ext.integrations.lightning``,
``timm_ext.integrations.accelerate``, both imported by ``import timm_ext``) registers its checks here. ``SAM.step``
asks the closure checks once per kind of closure it is stepped with (the closure's function, and whether a
GradScaler hands SAM its scale), before anything moves, never on the steps after; and the checks for a ``step()``
without a closure only where SAM has nothing to replay and would refuse anyway, to name the setting instead.
"""
from typing import Any, Callable, List, Optional

__all__ = ['refuse_closure', 'register_closure_check', 'register_stepless_check', 'stepless_problem']

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


def stepless_problem(optimizer: Any) -> Optional[str]:
    """The first registered check's line for a ``step()`` without a closure, None when there is none."""
    return next((p for check in _stepless_checks if (p := check(optimizer))), None)


def refuse_closure(closure: Callable[..., Any], optimizer: Any) -> None:
    """A one-line ``ValueError`` with the first registered check's line for this closure, if any."""
    problem = next((p for check in _closure_checks if (p := check(closure, optimizer))), None)
    if problem:
        raise ValueError(problem)
