"""Fixes of timm library bugs that later timm releases fixed, applied at ``import timm_ext`` on the releases
that have them, so that every timm that timm-ext admits (``timm>=1.0.23``) behaves like the current one.

* timm 1.0.23 ... 1.0.28, ``timm.data.create_loader``: asks torch's DataLoader for persistent workers even
  with ``num_workers=0``, which torch refuses (``ValueError: persistent_workers option needs num_workers >
  0``): train.py and validate.py cannot run with ``--workers 0``. timm 1.0.29 asks only when there are workers.
* timm 1.0.23 ... 1.0.25, ``timm.create_model('local-dir:DIR', pretrained=True)``: reads ``model.safetensors``
  with ``torch.load`` (``UnpicklingError: invalid load key``), so a folder that ``timm-ext export`` wrote does
  not load. timm 1.0.26 reads it with safetensors.

train.py binds ``create_loader`` when it is imported, before it imports its ``--device-modules``: timm-ext's
launcher (:mod:`timm_ext.launch.build_command`) starts train.py through the runner :mod:`timm_ext.cli._child`,
which imports timm_ext first, on the releases that need the loader fix. Each fix wraps timm's function,
once, and touches nothing on a timm that has the fix.
"""
import functools
import inspect
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, List, Optional

from packaging.version import InvalidVersion, Version

__all__ = ['LOADER_FIXED_IN', 'LOCAL_DIR_FIXED_IN', 'apply_backports', 'needs_fix']

LOADER_FIXED_IN = '1.0.29'  # create_loader: persistent_workers only with num_workers > 0
LOCAL_DIR_FIXED_IN = '1.0.26'  # load_state_dict_from_path: safetensors read with safetensors
_MARK = '_timm_ext_backport'


def needs_fix(fixed_in: str, timm_version: Optional[str] = None) -> bool:
    """Whether timm ``timm_version`` (default: the installed one) is older than the release ``fixed_in``."""
    if timm_version is None:
        try:
            timm_version = version('timm')
        except PackageNotFoundError:
            return False
    try:
        return Version(timm_version).release < Version(fixed_in).release
    except InvalidVersion:
        return False  # not a release number (a source build): assume a current timm


def _loader_without_idle_persistent_workers(create_loader: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(create_loader)

    @functools.wraps(create_loader)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if not bound.arguments.get('num_workers'):
            bound.arguments['persistent_workers'] = False
        return create_loader(*bound.args, **bound.kwargs)

    setattr(guarded, _MARK, True)
    return guarded


def _local_dir_reading_safetensors(load_from_path: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load_from_path)
    def guarded(path: Any, *args: Any, **kwargs: Any) -> Any:
        weights = Path(path) / 'model.safetensors'  # the file timm prefers, and the one timm-ext export writes
        if weights.is_file() and not any(Path(path).glob('*.pth')) and not any(Path(path).glob('*.bin')):
            from safetensors.torch import load_file
            return load_file(weights, device='cpu')
        return load_from_path(path, *args, **kwargs)

    setattr(guarded, _MARK, True)
    return guarded


def _fix_loader() -> bool:
    import timm.data
    import timm.data.loader
    original = timm.data.loader.create_loader
    if getattr(original, _MARK, False):
        return True
    if 'persistent_workers' not in inspect.signature(original).parameters:
        return False
    timm.data.loader.create_loader = timm.data.create_loader = _loader_without_idle_persistent_workers(original)
    return True


def _fix_local_dir() -> bool:
    import timm.models._builder as builder  # the name _builder's load_pretrained calls
    original = getattr(builder, 'load_state_dict_from_path', None)
    if original is None:
        return False
    if not getattr(original, _MARK, False):
        builder.load_state_dict_from_path = _local_dir_reading_safetensors(original)
    return True


def apply_backports() -> List[str]:
    """Apply every fix the installed timm needs (idempotent); the timm functions that were fixed."""
    fixed = []
    if needs_fix(LOADER_FIXED_IN) and _fix_loader():
        fixed.append('timm.data.create_loader')
    if needs_fix(LOCAL_DIR_FIXED_IN) and _fix_local_dir():
        fixed.append('timm.models._builder.load_state_dict_from_path')
    return fixed
