"""Launching timm's own scripts: the one training route of timm-ext.

* :mod:`~timm_ext.launch.release_table`: the sha256 table of timm releases' ``train.py`` / ``validate.py``;
* :mod:`~timm_ext.launch.find`: find, verify, cache and download the script for the installed timm;
* :mod:`~timm_ext.launch.patches`: the SAM patch of ``train.py`` before timm's task API (v1.0.15 ... v1.0.22);
* :mod:`~timm_ext.launch.arg_checks` and :mod:`~timm_ext.launch.preflight`: what is checked before the script
  starts, on the namespace the script itself parses;
* :mod:`~timm_ext.launch.distributed`: torchrun's arguments on one node or across nodes, SLURM's environment;
* :mod:`~timm_ext.launch.global_batch`: ``--grad-accum-steps auto``, a paper recipe's global batch at any world size;
* :mod:`~timm_ext.launch.commands`: the child's command line (``build_train_command``, ``build_validate_command``).

Nothing is imported here, so that ``import timm_ext.launch.find`` stays light (no torch, no timm).
"""
