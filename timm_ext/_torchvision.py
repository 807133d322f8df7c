"""torchvision must load with the installed torch before timm (which imports it) can.

A torchvision wheel built for another torch fails inside ``import torchvision`` with
``RuntimeError: operator torchvision::nms does not exist`` (or an undefined-symbol ImportError),
deep in timm's import chain. This turns that into one ImportError that names both versions and the fix.
"""
import importlib.metadata

__all__ = ['TORCHVISION_FIX', 'require_loadable_torchvision']

TORCHVISION_FIX = ('reinstall torch and torchvision together from the same index, e.g. '
                   '`pip install --force-reinstall torch torchvision` (docs/troubleshooting.md)')


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return 'not installed'


def require_loadable_torchvision() -> None:
    """Import torchvision; raise one ImportError naming torch's and torchvision's versions when it cannot load."""
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # RuntimeError (operators missing) or ImportError (undefined symbols, not installed)
        raise ImportError(
            f'timm-ext needs torchvision (timm imports it), but torchvision {_version("torchvision")} does not load '
            f'with torch {_version("torch")} ({type(e).__name__}: {e}): {TORCHVISION_FIX}') from None
