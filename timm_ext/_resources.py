"""Folders of the repository that ship with timm-ext: ``recipes/`` and ``patches/``.

They stay at the top of the repository; the wheel carries them inside the package as
``timm_ext/_recipes`` and ``timm_ext/_patches`` (``[tool.setuptools.package-dir]`` in pyproject.toml).
In a source checkout (an editable install) they are found beside the package instead.
"""
from timm_ext_cli.commands import packaged_dir  # defined beside the package: the command line finds it without torch

__all__ = ['packaged_dir']
