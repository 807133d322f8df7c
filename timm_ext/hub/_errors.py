"""The one exception of ``timm_ext.hub``."""

__all__ = ['HubError']


class HubError(ValueError):
    """A checkpoint, hub folder or hub repo that cannot be used, in one line that names the file and the fix."""


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message (its type name when it has none)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
