"""Import a framework's integration module when the framework itself is imported, so that its checks are there
before its first step, and a process without that framework never imports it.

``install()`` (run by ``import timm_ext``) imports the integrations of frameworks already imported and adds one
finder to ``sys.meta_path`` that, for the watched names only, lets the normal import run and then imports the
integration (a post-import hook). Nothing else is changed: every other import passes through untouched.
"""
import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Dict, Optional, Sequence

__all__ = ['INTEGRATIONS', 'install']

# framework module -> the timm-ext module that registers what SAM needs under it
INTEGRATIONS: Dict[str, str] = {
    'lightning.pytorch': 'timm_ext.integrations.lightning',
    'pytorch_lightning': 'timm_ext.integrations.lightning',
    'accelerate': 'timm_ext.integrations.accelerate',
}


class _ThenImport(importlib.abc.Loader):
    """The framework's own loader, then its integration module."""

    def __init__(self, loader: Any, integration: str) -> None:
        self.loader = loader
        self.integration = integration

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        importlib.import_module(self.integration)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...: the framework loader's
        return getattr(self.loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, integrations: Dict[str, str]) -> None:
        self.integrations = integrations
        self._finding: set = set()

    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        integration = self.integrations.get(name)
        if integration is None or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)  # the finders after this one
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return None
        spec.loader = _ThenImport(spec.loader, integration)
        return spec


def install(integrations: Optional[Dict[str, str]] = None) -> None:
    """Integrations of the frameworks already imported now, the others when theirs is (once per process)."""
    integrations = dict(INTEGRATIONS if integrations is None else integrations)
    for name, integration in integrations.items():
        if name in sys.modules:
            importlib.import_module(integration)
    pending = {name: i for name, i in integrations.items() if name not in sys.modules}
    if pending and not any(isinstance(f, _PostImportFinder) and f.integrations == pending for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder(pending))
