"""A torchvision that does not load with torch: one ImportError naming both versions and the fix."""
import importlib.abc
import importlib.metadata
import sys

import pytest

from timm_ext._torchvision import TORCHVISION_FIX, require_loadable_torchvision

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


class _BrokenTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of torchvision fail the way a wheel built for another torch does."""

    def find_spec(self, name, path, target=None):
        if name == 'torchvision':
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise RuntimeError('operator torchvision::nms does not exist')


def test_loadable_torchvision_passes():
    require_loadable_torchvision()


def test_torchvision_built_for_another_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, 'torchvision')
    monkeypatch.setattr(sys, 'meta_path', [_BrokenTorchvision(), *sys.meta_path])
    with pytest.raises(ImportError) as info:
        require_loadable_torchvision()
    torch_v, tv_v = importlib.metadata.version('torch'), importlib.metadata.version('torchvision')
    assert str(info.value) == (
        f'timm-ext needs torchvision (timm imports it), but torchvision {tv_v} does not load with torch {torch_v} '
        f'(RuntimeError: operator torchvision::nms does not exist): {TORCHVISION_FIX}')
    assert '\n' not in str(info.value)


def test_torchvision_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torchvision', None)  # what Python does for a package that cannot import
    expected = r'^timm-ext needs torchvision .*\(ModuleNotFoundError: .*\): reinstall torch'
    with pytest.raises(ImportError, match=expected):
        require_loadable_torchvision()
