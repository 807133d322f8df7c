"""Which way the demo's runs train: timm's train.py where it can be had, else the demo's built-in loop.

timm's wheel has no train.py: it is given (``--timm-train``, ``$TIMM_EXT_TIMM_TRAIN``), cached, or downloaded
from GitHub (:mod:`timm_ext.launch.timm_scripts`). A machine that reaches the package index but not GitHub
has none of these; the demo then says so in one line and trains the same runs in its built-in loop of timm's
own parts (:mod:`timm_ext.demo.builtin_loop`), which gives the same top-1 image for image. Only a download
that fails falls back: a train.py that is given or cached but wrong stays the one-line error it was.
"""
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

from timm_ext.demo.jobs import Job
from timm_ext.demo.train_runs import TrainRun, train_jobs

if TYPE_CHECKING:  # the launch modules load train.py's parser: imported when a route is chosen
    from timm_ext.launch.timm_scripts import TimmScript

__all__ = ['BUILTIN_LOOP', 'builtin_loop_jobs', 'demo_jobs', 'train_py_or_reason']

BUILTIN_LOOP = 'timm_ext.demo.builtin_loop'  # run as ``python -m``, one process per run


def train_py_or_reason(timm_train: Optional[Union[str, Path]] = None) -> Tuple[Optional['TimmScript'], Optional[str]]:
    """``(train.py, None)`` where it can be had, ``(None, line)`` when it is not on this machine and could not be
    downloaded: the line says why and how to give it. Raises TrainConfigError (one line) for a train.py that
    is given or cached but wrong, as :func:`~timm_ext.launch.build_command.resolve_script` does."""
    import timm

    from timm_ext.launch.build_command import resolve_script
    from timm_ext.launch.timm_scripts import ScriptError, find_script, locate_script

    try:
        location = locate_script('train.py', timm_train)
    except ScriptError:  # given or cached, and wrong: resolve_script raises its line
        location = None
    if location is None or location.script is not None:
        return resolve_script('train.py', timm_train), None
    try:
        return find_script('train.py'), None
    except ScriptError as e:
        return None, (f'timm\'s train.py for timm {timm.__version__} is not on this machine and could not be '
                      f'downloaded from {location.url} ({e.download_reason or e}): running the demo\'s runs in its '
                      f'built-in loop of timm\'s own parts (to use train.py, give --timm-train PATH or '
                      f'$TIMM_EXT_TIMM_TRAIN, or save it as {location.path})')


def builtin_loop_jobs(runs: Sequence[TrainRun], output: Path) -> List[Job]:
    """The jobs that train ``runs`` into ``output`` with the built-in loop; its arguments are checked here
    (:class:`~timm_ext.demo.builtin_loop.LoopArgumentError`, one line) before anything is written."""
    from timm_ext.demo.builtin_loop import parse_loop_args

    jobs = []
    for run in runs:
        args = run.train_args(output)
        parse_loop_args(args)
        jobs.append(replace(run.job([sys.executable, '-m', BUILTIN_LOOP, *args], output),
                            program='the demo\'s built-in loop'))
    return jobs


def demo_jobs(runs: Sequence[TrainRun], output: Path,
              timm_train: Optional[Union[str, Path]] = None) -> Tuple[List[Job], Optional[str]]:
    """The demo's jobs through train.py, or through the built-in loop with the line that says why."""
    script, reason = train_py_or_reason(timm_train)
    if script is None:
        return builtin_loop_jobs(runs, output), reason
    return train_jobs(runs, output, script=script), None
