"""timm-ext: Context Broadcasting, Scaled-ReLU conv stems, AlterNet and SAM as a timm plugin.

``import timm_ext`` registers every timm-ext model with timm's registry and every optimizer
with timm's optimizer factory. Importing is cheap: it only defines classes and
registers entrypoints; nothing is built, downloaded or compiled.
"""
# importing `models` registers the models with timm; `optim` registers SAM with timm's optimizer factory
from timm_ext import layers, models, optim
from timm_ext.version import __version__

__all__ = ['__version__', 'layers', 'models', 'optim']
