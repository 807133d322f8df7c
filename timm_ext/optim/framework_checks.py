"""Training-framework settings SAM cannot make exact, refused in one line before the first pass (and how a
framework steps an update that ``first_step()`` began).

SAM knows no framework. A framework's integration module (``timm_ext.integrations.lightning``,
``timm_ext.integrations.accelerate``, both imported by ``import timm_ext``) registers its checks here. ``SAM.step``
asks the closure checks once per kind of closure it is stepped with (the closure's function, and whether a
GradScaler hands SAM its scale), before anything moves, never on the steps after; and the checks for a ``step()``
without a closure only where SAM has nothing to replay and would refuse anyway, to name the setting instead.
After ``first_step()``, a framework's ``step()`` may hand SAM a closure that runs no pass (Lightning's manual
optimization): ``closure_finishes`` tells it, and such a step finishes the update. A framework that counts only its
own ``step()`` says so once when ``second_step()`` is called directly instead (``warn_if_uncounted``).
"""
import warnings
from typing import Any, Callable, List, Optional

__all__ = ['closure_finishes', 'refuse_closure', 'register_closure_check', 'register_finishing_closure',
           'register_stepless_check', 'register_uncounted_check', 'stepless_problem', 'warn_if_uncounted']

ClosureCheck = Callable[[Callable[..., Any], Any], Optional[str]]
SteplessCheck = Callable[[Any], Optional[str]]
_closure_checks: List[ClosureCheck] = []
_stepless_checks: List[SteplessCheck] = []
_finishing_checks: List[Callable[[Callable[..., Any]], bool]] = []
_uncounted_checks: List[SteplessCheck] = []


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


def register_finishing_closure(check: Callable[[Callable[..., Any]], bool]) -> None:
    """``check(closure)``: True for a framework's closure that runs no pass (its ``step()`` after ``first_step()``)."""
    if check not in _finishing_checks:
        _finishing_checks.append(check)


def closure_finishes(closure: Callable[..., Any]) -> bool:
    """Whether ``closure`` is a framework's step after ``first_step()`` (it runs hooks, no forward or backward)."""
    return any(check(closure) for check in _finishing_checks)


def register_uncounted_check(check: SteplessCheck) -> None:
    """``check(optimizer)``: the line for a framework that counts only its own ``step()``, else None."""
    if check not in _uncounted_checks:
        _uncounted_checks.append(check)


def warn_if_uncounted(optimizer: Any) -> bool:
    """Warn with the first registered line for ``second_step()`` called around a framework's count; True (asked)."""
    problem = next((p for check in _uncounted_checks if (p := check(optimizer))), None)
    if problem:
        warnings.warn(problem, stacklevel=4)
    return True
