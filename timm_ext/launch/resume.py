"""The run an interrupted ``timm-ext train`` leaves behind, and the exact command that continues it.

train.py writes a run to ``--output`` / ``--experiment`` (a folder named after the start time when no experiment
is given). :func:`run_folder` finds it and :func:`resume_command` gives the command line that resumes it in the
same folder. (Whether a ``--resume`` checkpoint fits this run's optimizer is checked before launch:
:mod:`timm_ext.launch.command_checks`.)
"""
import argparse
import shlex
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ['resume_command', 'run_folder']


def run_folder(args: argparse.Namespace, started: Optional[float] = None) -> Optional[Path]:
    """The folder train.py writes this run to: ``--output`` (default ./output/train) / ``--experiment``; without an
    experiment name train.py makes one with the start time, so the newest folder there with a ``last.pth.tar``
    written after ``started`` (seconds since the epoch)."""
    base = Path(args.output or './output/train').expanduser()
    if args.experiment:
        return base / args.experiment
    if not base.is_dir():
        return None
    runs = [p for p in base.iterdir() if (p / 'last.pth.tar').is_file()
            and (started is None or (p / 'last.pth.tar').stat().st_mtime >= started)]
    return max(runs, key=lambda p: (p / 'last.pth.tar').stat().st_mtime, default=None)


def resume_command(argv: Sequence[str], folder: Path, experiment_given: bool) -> str:
    """``timm-ext ARGV`` with ``--resume FOLDER/last.pth.tar`` in place of any earlier ``--resume``, and the
    folder's name as ``--experiment`` when train.py named it (so the run continues in the same folder)."""
    kept: List[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == '--resume':
            skip = True
        elif not token.startswith('--resume='):
            kept.append(token)
    extra = ['--resume', str(folder / 'last.pth.tar')] + ([] if experiment_given else ['--experiment', folder.name])
    return shlex.join(['timm-ext', *kept, *extra])
