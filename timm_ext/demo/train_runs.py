"""A train.py run on an ImageFolder, as data: its model, optimizer, epochs and the caller's shared settings.

The demo, the reproduction study and the SAM-variant table describe their runs with :class:`TrainRun`;
:func:`train_jobs` turns them into the runner's jobs through the plugin route
(:func:`timm_ext.launch.build_command.build_train_command`: timm's own train.py, checked against its parser,
``--device-modules timm_ext``). The one other loop is the demo's, for a machine without train.py
(:mod:`timm_ext.demo.builtin_loop`): it takes these runs' arguments, no others, and calls timm's parts as
train.py does, so the demo's top-1 is the same either way.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence, Tuple, Union

from timm_ext.demo.jobs import Job

if TYPE_CHECKING:  # the launch modules load train.py's parser: imported when a command is built
    from timm_ext.launch.build_command import TrainCommand
    from timm_ext.launch.timm_scripts import TimmScript

__all__ = ['TrainRun', 'train_command', 'train_jobs']


@dataclass(frozen=True)
class TrainRun:
    """One train.py run: ``model`` with ``opt`` on the ImageFolder ``data_dir`` for ``epochs``.

    ``name`` is train.py's ``--experiment``: the run's folder under the output folder (its ``summary.csv``
    and checkpoints), its log ``<name>.log`` beside it. ``settings`` are the train.py arguments the caller's
    runs share (schedule, batch, augmentation, seed, ...); ``cost`` the relative time of one epoch.
    """
    name: str
    data_dir: Path
    model: str
    opt: str
    epochs: int
    settings: Tuple[str, ...] = ()
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    opt_kwargs: Mapping[str, Any] = field(default_factory=dict)
    cost: float = 1.0

    def train_args(self, output: Path) -> List[str]:
        """train.py's arguments: the data, output and run name, the model and optimizer, then ``settings``."""
        args = ['--data-dir', str(self.data_dir), '--output', str(output), '--experiment', self.name,
                '--model', self.model, '--epochs', str(self.epochs), '--opt', self.opt, *self.settings,
                '--model-kwargs', *(f'{k}={v}' for k, v in self.model_kwargs.items())]
        if self.opt_kwargs:
            args += ['--opt-kwargs', *(f'{k}={v}' for k, v in self.opt_kwargs.items())]
        return args

    def job(self, argv: Sequence[str], output: Path) -> Job:
        """The runner's job for this run with the command line ``argv``, logging to ``output/<name>.log``."""
        return Job(self.name, list(argv), output / f'{self.name}.log', output / self.name / 'summary.csv',
                   self.epochs, self.cost)


def train_command(run: TrainRun, output: Path, timm_train: Optional[Union[str, Path]] = None,
                  script: Optional['TimmScript'] = None) -> 'TrainCommand':
    """:func:`~timm_ext.launch.build_command.build_train_command` for ``run`` (``script``: one found before)."""
    from timm_ext.launch.build_command import build_train_command

    return build_train_command(run.train_args(output), timm_train=timm_train, script=script)


def train_jobs(runs: Sequence[TrainRun], output: Path, timm_train: Optional[Union[str, Path]] = None,
               script: Optional['TimmScript'] = None) -> List[Job]:
    """The jobs that train ``runs`` into ``output``; train.py is found and verified once (or is ``script``), and every
    problem (script, arguments) raises :class:`~timm_ext.launch.build_command.TrainConfigError` before anything is
    written."""
    if not runs:
        return []
    first = train_command(runs[0], output, timm_train, script)
    argvs = [first.argv] + [train_command(run, output, script=first.script).argv for run in runs[1:]]
    return [run.job(argv, output) for run, argv in zip(runs, argvs)]
