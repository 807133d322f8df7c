"""Folders of the repository that ship with timm-ext: ``recipes/`` and ``patches/``.

They stay at the top of the repository; the wheel carries them inside the package as
``timm_ext/_recipes`` and ``timm_ext/_patches`` (``[tool.setuptools.package-dir]`` in pyproject.toml).
In a source checkout (an editable install) they are found beside the package instead.
"""
from pathlib import Path

__all__ = ['packaged_dir']

_FOLDERS = ('recipes', 'patches')


def packaged_dir(name: str) -> Path:
    """The shipped folder ``name`` ('recipes' or 'patches'): inside an installed wheel or in a checkout."""
    if name not in _FOLDERS:
        raise ValueError(f'Unknown packaged folder {name!r}; one of: {", ".join(_FOLDERS)}')
    package = Path(__file__).resolve().parent
    inside = package / f'_{name}'
    if inside.is_dir():
        return inside
    checkout = package.parent
    if (checkout / name).is_dir() and (checkout / 'pyproject.toml').is_file():
        return checkout / name
    raise FileNotFoundError(
        f'timm-ext\'s {name}/ folder is missing: looked in {inside} (installed wheel) and in '
        f'{checkout / name} (source checkout); reinstall timm-ext')
