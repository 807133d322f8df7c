"""Argument types checked the same way across timm-ext (positive counts and numbers), so a bad count or size
is refused with the same one-line message everywhere (``{name} must be a positive integer, got 0``)."""
from typing import Any

__all__ = ['is_positive_int', 'positive_int', 'positive_number']


def is_positive_int(value: Any) -> bool:
    """An ``int`` >= 1 (``True`` is not a count, ``2.0`` is not an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def positive_int(name: str, value: Any) -> int:
    """``value`` if it is an int >= 1, else ``ValueError('{name} must be a positive integer, got {value!r}')``."""
    if not is_positive_int(value):
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    return value


def positive_number(name: str, value: Any) -> float:
    """``value`` if it is a number > 0 (not NaN), else ``ValueError('{name} must be > 0, got {value!r}')``."""
    try:
        ok = bool(value > 0)
    except (TypeError, RuntimeError):  # a string, None, a tensor of several values
        ok = False
    if not ok:
        raise ValueError(f'{name} must be > 0, got {value!r}')
    return value
