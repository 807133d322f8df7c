"""The versions timm-ext declares (its installed metadata, i.e. pyproject.toml), checked before timm is imported.

A torch below the declared floor fails somewhere deep (in timm's import, in an optimizer kernel, inside
train.py): ``import timm_ext`` refuses it in one line that names both versions and the fix. A timm below
its floor still loads timm-ext, since ``timm-ext patch`` serves train.py of timm 1.0.15 ... 1.0.22, so it
gets one warning line instead. ``timm-ext doctor`` reports the same facts (:mod:`timm_ext.doctor`).
"""
import importlib.metadata
import warnings
from typing import Dict, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = ['DIST', 'TimmExtVersionWarning', 'check_installed_versions', 'declared_requirements',
           'installed_version', 'version_problem']

DIST = 'timm-ext'


class TimmExtVersionWarning(UserWarning):
    """An installed package is older than timm-ext declares, and timm-ext still loads."""


def declared_requirements() -> Dict[str, Requirement]:
    """timm-ext's install requirements by canonical distribution name (empty when run from a bare source tree)."""
    try:
        lines = importlib.metadata.requires(DIST) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    found = {}
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({'extra': ''}):
            found[canonicalize_name(req.name)] = req
    return found


def installed_version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problem(dist: str, version: Optional[str],
                    requirements: Optional[Dict[str, Requirement]] = None) -> Optional[str]:
    """One line naming ``version`` of ``dist``, the declared range and the fix; None when it satisfies it
    (or nothing is declared, or ``version`` is not a release number, e.g. a source build)."""
    req = (declared_requirements() if requirements is None else requirements).get(canonicalize_name(dist))
    if req is None or not req.specifier or version is None:
        return None
    try:
        public = Version(version).public  # 2.4.1+cpu is 2.4.1
    except InvalidVersion:
        return None
    if req.specifier.contains(public, prereleases=True):
        return None
    return f'timm-ext needs {req}, found {dist} {version}: pip install "{req}"'


def check_installed_versions() -> None:
    """Refuse a torch outside the declared range (ImportError); warn once for a timm outside it."""
    requirements = declared_requirements()
    torch_problem = version_problem('torch', installed_version('torch'), requirements)
    if torch_problem:
        raise ImportError(torch_problem)
    timm_problem = version_problem('timm', installed_version('timm'), requirements)
    if timm_problem:
        warnings.warn(f'{timm_problem} (train.py of timm 1.0.15 ... 1.0.22 needs `timm-ext patch`, which '
                      f'`timm-ext train` applies)', TimmExtVersionWarning, stacklevel=2)
