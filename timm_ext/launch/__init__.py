"""Launching timm's own scripts: the one training route of timm-ext.

* :mod:`~timm_ext.launch.release_table`: the sha256 table of timm releases' ``train.py`` / ``validate.py``;
* :mod:`~timm_ext.launch.timm_scripts`: find, verify, cache and download the script for the installed timm, read
  its parser, parse a command line as it does;
* :mod:`~timm_ext.launch.patches`: the SAM patch of ``train.py`` before timm's task API (v1.0.15 ... v1.0.22);
* :mod:`~timm_ext.launch.command_checks`: every check of a command line before the script starts, on the
  namespace the script itself parses;
* :mod:`~timm_ext.launch.image_folder`: a dataset folder as timm's reader and samplers see it (for the checks);
* :mod:`~timm_ext.launch.global_batch`: a paper recipe's global batch, ``--grad-accum-steps auto`` at any world size;
* :mod:`~timm_ext.launch.distributed`: torchrun's arguments on one node or across nodes, SLURM's environment;
* :mod:`~timm_ext.launch.build_command`: the child's command line (``build_train_command``,
  ``build_validate_command``) and environment;
* :mod:`~timm_ext.launch.from_run`, :mod:`~timm_ext.launch.resume`: validate.py's arguments from a training run,
  the command that resumes an interrupted one;
* :mod:`~timm_ext.launch.train_py_hooks`: what ``--device-modules timm_ext`` adds inside train.py.

Nothing is imported here, so that ``import timm_ext.launch.timm_scripts`` stays light (no torch, no timm).
Imports point one way: ``timm_ext.cli`` uses this package, never the reverse; this package uses
:mod:`timm_ext.recipes`, never the reverse.
"""
