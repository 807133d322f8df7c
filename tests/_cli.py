"""One way for tests to run the ``timm-ext`` command in-process and read what it printed, and how the command it
prints names timm's train.py."""
from pathlib import Path
from typing import List, Tuple, Union

import timm

from timm_ext.cli import main

# Release-aware, because timm differs: on timm < 1.0.29 (create_loader asks for persistent workers with --workers 0,
# fixed in 1.0.29) timm-ext starts train.py through a runner that imports timm_ext, and so its fix, first
# (docs/compatibility.md); on newer releases train.py itself
TRAIN_PY_RUNNER = ('-m', 'timm_ext.cli._child', 'timm_ext') if tuple(
    int(p) for p in timm.__version__.split('.')[:3] if p.isdigit()) < (1, 0, 29) else ()


def train_py_argv(train_py: Union[str, Path]) -> List[str]:
    """The words of a printed train command that start train.py (after the interpreter or torchrun's arguments)."""
    return [*TRAIN_PY_RUNNER, str(train_py)]


def run_cli(capsys, *argv) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``timm-ext ARGV``; argparse's own exits (``--help``, usage) included. With
    pytest's ``capfd`` for ``capsys``, what the command's child process (train.py, validate.py) printed too."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err
