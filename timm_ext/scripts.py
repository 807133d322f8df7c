"""Moved to :mod:`timm_ext.launch.find` (the sha256 table: :mod:`timm_ext.launch.release_table`).

This module keeps old imports working, with a FutureWarning, as timm's moved modules do.
"""
import warnings

from timm_ext.launch.find import *  # noqa: F401,F403
from timm_ext.launch.release_table import *  # noqa: F401,F403

warnings.warn(f'Importing from {__name__} is deprecated, please import via timm_ext.launch.find',
              FutureWarning, stacklevel=2)
