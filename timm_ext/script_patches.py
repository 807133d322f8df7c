"""Moved to :mod:`timm_ext.launch.patches`.

This module keeps old imports working, with a FutureWarning, as timm's moved modules do.
"""
import warnings

from timm_ext.launch.patches import *  # noqa: F401,F403
from timm_ext.launch.release_table import sha256_of as sha256_file  # noqa: F401

warnings.warn(f'Importing from {__name__} is deprecated, please import via timm_ext.launch.patches',
              FutureWarning, stacklevel=2)
