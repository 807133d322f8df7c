"""``--resume``: which optimizer a checkpoint holds, before train.py loads it, and the command that resumes a run.

train.py's ``--resume`` loads the checkpoint's optimizer state into whatever optimizer this run builds: AdamW's
moments into SAM's base optimizer, SAM's into plain AdamW, SGD's momentum into an Adam. Nothing says so, and
the run continues with a state that belongs to another optimizer. :func:`resume_problems` reads the checkpoint
(weights-only) first and refuses a mismatch unless ``--no-resume-opt`` is given (train.py's own flag: the
weights load, the optimizer starts fresh). :func:`run_folder` and :func:`resume_command` give the exact command
that continues an interrupted run in its own folder.
"""
import argparse
import shlex
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

__all__ = ['optimizer_label', 'resume_command', 'resume_problems', 'run_folder']


def optimizer_label(opt: str) -> str:
    """``opt`` as timm's factory reads it, with its kind: ``samadamw (SAM)``, ``adamw (plain)``."""
    from timm_ext.recipes.checks import is_sam_optimizer

    return f'{opt} ({"SAM" if is_sam_optimizer(opt) else "plain"})'


def _factory_name(opt: str) -> str:
    return str(opt).lower().split('_')[-1]  # timm's factory reads the text after the last underscore


def resume_problems(args: argparse.Namespace) -> Tuple[List[str], List[str]]:
    """(problems, notes) of ``--resume``: the checkpoint's optimizer against this run's, one line each."""
    path = getattr(args, 'resume', '')
    if not path:
        return [], []
    from timm_ext.hub import HubError, load_checkpoint
    from timm_ext.recipes.checks import is_sam_optimizer

    try:
        ckpt = load_checkpoint(path)
    except HubError as e:
        return [f'--resume: {e}'], []
    saved_opt = ckpt.train_args.get('opt')
    epoch = f', epoch {ckpt.epoch}: train.py continues at epoch {ckpt.epoch + 1}' if ckpt.epoch is not None else ''
    if args.no_resume_opt or ckpt.optimizer_is_sam is None or not isinstance(saved_opt, str):
        state = 'no optimizer state' if ckpt.optimizer_is_sam is None else (
            'its optimizer state is not loaded (--no-resume-opt)' if args.no_resume_opt else 'an optimizer state')
        return [], [f'--resume {path}: weights of {ckpt.arch or "the model"}, {state}{epoch}']
    saved_sam, this_sam = ckpt.optimizer_is_sam, is_sam_optimizer(args.opt)
    if saved_sam != this_sam or _factory_name(saved_opt) != _factory_name(args.opt):
        kind = 'SAM' if saved_sam else 'plain'
        return [f'--resume {path} holds the state of {saved_opt} ({kind}), and this run builds '
                f'{optimizer_label(args.opt)}: train.py would load one optimizer\'s state into the other; resume '
                f'with --opt {saved_opt}, or add --no-resume-opt to load the weights and start the optimizer '
                f'fresh'], []
    return [], [f'--resume {path}: weights and the state of {optimizer_label(saved_opt)}{epoch}']


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
