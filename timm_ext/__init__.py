"""timm-ext: Context Broadcasting, Scaled-ReLU conv stems, AlterNet and SAM as a timm plugin.

``import timm_ext`` registers every timm-ext model with timm's registry and every optimizer
with timm's optimizer factory. Importing is cheap: it only defines classes and
registers entrypoints; nothing is built, downloaded or compiled.
"""
import importlib
from types import ModuleType

from timm_ext._requirements import check_installed_versions
from timm_ext._torchvision import require_loadable_torchvision

check_installed_versions()  # a torch below the declared floor: one line, before timm imports it
require_loadable_torchvision()  # timm imports torchvision: one line that names the fix, not timm's traceback

# importing `models` registers the models with timm; `optim` registers SAM with timm's optimizer factory
from timm_ext import layers, models, optim  # noqa: E402
from timm_ext._timm_backports import apply_backports  # noqa: E402
from timm_ext.integrations import accelerate, lightning  # noqa: E402, F401  (SAM's checks; no framework imported)
from timm_ext.launch.train_py_hooks import install_if_train_py  # noqa: E402
from timm_ext.version import __version__  # noqa: E402

apply_backports()  # bugs of older timm releases that later ones fixed (create_loader, local-dir:)
install_if_train_py()  # in timm's train.py (--device-modules timm_ext): exact resume, summary.csv continued

__all__ = ['__version__', 'layers', 'models', 'optim']

# imported on first use, so that `timm_ext.hub.load_model(...)` works after a plain `import timm_ext`
_LAZY_SUBPACKAGES = ('analysis', 'catalog', 'data', 'demo', 'hub', 'recipes')


def __getattr__(name: str) -> ModuleType:
    """``timm_ext.hub`` and the other subpackages of ``_LAZY_SUBPACKAGES``, imported when first used (PEP 562)."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f'{__name__}.{name}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
