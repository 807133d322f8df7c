"""What the job runner runs: one train.py process per job (plus any commands after it), and how it fails.

A job is defined by files, not by Python state: its command lines, the log its output goes to and the
``summary.csv`` train.py appends a row to after every epoch, so progress is read the same way for every
caller (the demo, the reproduction study, the SAM-variant table).
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Tuple

__all__ = ['Job', 'JobFailed']


@dataclass(frozen=True)
class Job:
    """One train.py process: its argv, its log file, the summary.csv it writes, and how much work it is.

    ``then``: commands run after ``argv`` succeeds, in the same lane and log (e.g. measuring the trained run).
    """
    name: str
    argv: Sequence[str]
    log: Path
    summary: Path
    epochs: int
    cost: float = 1.0  # relative time of one epoch (a SAM step is two forward-backward passes: 2)
    then: Tuple[Sequence[str], ...] = ()
    program: str = 'train.py'  # what ``argv`` runs, as a failure names it

    @property
    def work(self) -> float:
        return self.epochs * self.cost


class JobFailed(RuntimeError):
    """A job's command exited with an error; the message names the job, its exit code, its log and its tail."""
