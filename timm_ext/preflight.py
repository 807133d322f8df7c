"""Moved to :mod:`timm_ext.launch.preflight`.

This module keeps old imports working, with a FutureWarning, as timm's moved modules do.
"""
import warnings

from timm_ext.launch.preflight import *  # noqa: F401,F403

warnings.warn(f'Importing from {__name__} is deprecated, please import via timm_ext.launch.preflight',
              FutureWarning, stacklevel=2)
