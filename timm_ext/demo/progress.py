"""What the job runner's progress bar shows: finished epochs over all runs, which runs are training, and the ETA.

The ETA lays the work left (epochs x each job's relative cost) out on the lanes at the pace measured so
far, train.py's start-up counted apart from its epochs.
"""
from typing import Dict, Optional, Sequence, Tuple

from timm_ext.demo.jobs import Job

__all__ = ['Progress', 'format_eta']


def format_eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return 'ETA --:--'
    seconds = int(round(seconds))
    return f'ETA {seconds // 60}:{seconds % 60:02d}'


class Progress:
    """What the progress bar shows: finished epochs over all runs, the ETA, and which runs are training.

    The runner fills in, per job, when it started and finished, its finished epochs, when its first and
    its latest epoch ended (``time.perf_counter`` seconds), its CPU time and, for a failed job, its exit code.
    ``jobs`` come in the order the runner starts them.
    """

    def __init__(self, jobs: Sequence[Job], lanes: int) -> None:
        self.jobs = {j.name: j for j in jobs}
        self.lanes = lanes
        self.done: Dict[str, int] = {j.name: 0 for j in jobs}
        self.started: Dict[str, float] = {}
        self.finished: Dict[str, float] = {}
        self.first_epoch_at: Dict[str, float] = {}
        self.last_epoch_at: Dict[str, float] = {}
        self.cpu_s: Dict[str, Optional[float]] = {}
        self.failed: Dict[str, int] = {}

    @property
    def total_epochs(self) -> int:
        return sum(j.epochs for j in self.jobs.values())

    @property
    def done_epochs(self) -> int:
        return sum(self.done.values())

    def wall_s(self, name: str) -> float:
        return self.finished[name] - self.started[name]

    def epoch_done(self, name: str, epochs: int, now: float) -> None:
        if epochs > self.done[name]:
            self.first_epoch_at.setdefault(name, now)
            self.last_epoch_at[name] = now
            self.done[name] = epochs

    def pace(self) -> Optional[Tuple[float, float]]:
        """``(seconds per unit of work, seconds of start-up)`` measured so far; None before any epoch ends.

        The pace comes from the epochs after each run's first (the first also holds train.py's start-up)
        when there are any, else from first epochs; start-up is what a first epoch took beyond that pace.
        """
        ran = list(self.first_epoch_at)
        if not ran:
            return None
        steady = [n for n in ran if self.done[n] >= 2]
        if steady:
            per_unit = sum(self.last_epoch_at[n] - self.first_epoch_at[n] for n in steady) / sum(
                (self.done[n] - 1) * self.jobs[n].cost for n in steady)
        else:
            per_unit = sum(self.first_epoch_at[n] - self.started[n] for n in ran) / sum(
                self.jobs[n].cost for n in ran)
        start_up = sum(max(0.0, self.first_epoch_at[n] - self.started[n] - self.jobs[n].cost * per_unit)
                       for n in ran) / len(ran)
        return per_unit, start_up

    def eta(self, now: float) -> Optional[float]:
        """Seconds until every job is done: each core's remaining work at the measured pace, queued jobs added
        to the core that frees first, in the order the runner starts them (the order of ``jobs``)."""
        pace = self.pace()
        if pace is None:
            return None
        per_unit, start_up = pace
        free_at = []
        for name, began in self.started.items():
            if name in self.finished:
                continue
            job, done = self.jobs[name], self.done[name]
            if done:
                left = (job.epochs - done) * job.cost * per_unit - (now - self.last_epoch_at[name])
            else:
                left = start_up + job.work * per_unit - (now - began)
            free_at.append(max(0.0, left))
        free_at += [0.0] * max(0, self.lanes - len(free_at))
        for job in self.jobs.values():
            if job.name not in self.started:
                free_at.sort()
                free_at[0] += start_up + job.work * per_unit
        return max(free_at)

    def postfix(self, now: float) -> str:
        """``ETA m:ss, training: full 3/10, vit 5/10`` (the runs now training, with their epochs)."""
        running = [f'{n} {self.done[n]}/{self.jobs[n].epochs}' for n in self.started if n not in self.finished]
        return f'{format_eta(self.eta(now))}, training: {", ".join(running) if running else "-"}'
