"""Run several train.py processes side by side on a few CPU cores, longest first, with progress and an ETA.

The demo's runs are small models on tiny images: one CPU thread each keeps a core busy, so two
runs on two cores finish sooner than the same runs one after the other with two threads each; and one
thread per run, always, keeps the top-1 the same on every machine and for every ``--jobs``.
Each run is its own process group writing its own log; its finished epochs are counted from the
rows of the ``summary.csv`` train.py writes after every epoch. Ctrl-C or a failed run stops every
other run (the whole process group) before the error surfaces, with the failed run's log tail.
"""
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from timm_ext._summary_csv import read_summary

__all__ = ['Job', 'JobFailed', 'Progress', 'available_cores', 'format_eta', 'log_tail',
           'plan_parallelism', 'run_jobs', 'schedule']


@dataclass(frozen=True)
class Job:
    """One train.py process: its argv, its log file, the summary.csv it writes, and how much work it is."""
    name: str
    argv: Sequence[str]
    log: Path
    summary: Path
    epochs: int
    cost: float = 1.0  # relative time of one epoch (a SAM step is two forward-backward passes: 2)

    @property
    def work(self) -> float:
        return self.epochs * self.cost


class JobFailed(RuntimeError):
    """A train.py run exited with an error; the message names the run, its exit code, its log and its tail."""


def available_cores() -> int:
    """CPU cores this process may run on (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def plan_parallelism(runs: int, cores: int, jobs: Optional[int] = None) -> Tuple[int, int]:
    """``(processes at a time, torch threads each)``: one run per core up to the number of runs, each with one
    thread whatever the cores. A run's float results depend on its thread count (torch splits reductions by
    thread): with the cores shared out as threads the demo's top-1 changed with the machine and ``--jobs``
    (the full demo's runs by up to 0.8 points at 2 threads against 1), and with one thread it does not."""
    if jobs is None:
        jobs = min(runs, cores)
    return max(1, min(jobs, runs)), 1


def schedule(jobs: Sequence[Job]) -> List[Job]:
    """Longest first (most work), so the last run to start is a short one and the cores finish together."""
    return sorted(jobs, key=lambda j: -j.work)


def log_tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors='replace').strip().splitlines()
    except OSError:
        return ''
    return '\n'.join(text[-lines:])


def format_eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return 'ETA --:--'
    seconds = int(round(seconds))
    return f'ETA {seconds // 60}:{seconds % 60:02d}'


class Progress:
    """What the progress bar shows: finished epochs over all runs, the ETA, and which runs are training.

    The runner fills in, per job, when it started and finished, its finished epochs, and when its
    first and its latest epoch ended (``time.perf_counter`` seconds).
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
        to the core that frees first, in the order the runner starts them."""
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
        for job in schedule(self.jobs.values()):
            if job.name not in self.started:
                free_at.sort()
                free_at[0] += start_up + job.work * per_unit
        return max(free_at)

    def postfix(self, now: float) -> str:
        """``ETA m:ss, training: full 3/10, vit 5/10`` (the runs now training, with their epochs)."""
        running = [f'{n} {self.done[n]}/{self.jobs[n].epochs}' for n in self.started if n not in self.finished]
        return f'{format_eta(self.eta(now))}, training: {", ".join(running) if running else "-"}'


def _reap(child: subprocess.Popen) -> Tuple[Optional[int], Optional[float]]:
    """``(exit code, CPU seconds)`` of a finished child, ``(None, None)`` while it runs; CPU time where the OS
    reports it (``os.wait4``: the run's user + system time, its own waited-for children included)."""
    if not hasattr(os, 'wait4'):
        return child.poll(), None
    try:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
    except ChildProcessError:  # already reaped
        return child.poll(), None
    if pid == 0:
        return None, None
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_utime + usage.ru_stime


def _stop(child: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End a child's whole process group (train.py and any data-loader workers): SIGTERM, then SIGKILL."""
    if child.poll() is not None:
        return
    for hard in (False, True):
        try:
            if hasattr(os, 'killpg'):
                os.killpg(child.pid, signal.SIGKILL if hard else signal.SIGTERM)
            else:  # Windows: no process groups, the child alone
                child.kill() if hard else child.terminate()
        except (ProcessLookupError, PermissionError):
            pass
        try:
            child.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_jobs(
        jobs: Sequence[Job],
        env: Dict[str, str],
        lanes: int,
        on_update: Callable[[Progress, float], None] = lambda progress, now: None,
        poll_s: float = 0.25,
        tick_s: float = 1.0,
) -> Progress:
    """Run every job, ``lanes`` at a time in :func:`schedule` order; returns the final :class:`Progress`
    (per job: start and end times, epochs, CPU seconds where the OS reports them).

    ``on_update(progress, now)`` is called whenever a run starts, finishes an epoch or ends. A failed run
    (non-zero exit) stops the others and raises :class:`JobFailed`; Ctrl-C stops them all and re-raises.
    """
    order = schedule(jobs)
    progress = Progress(order, lanes)
    children: Dict[str, subprocess.Popen] = {}
    logs = {}
    walls: Dict[str, float] = {}
    last_update = 0.0
    try:
        pending = list(order)
        while pending or len(walls) < len(order):
            changed = False
            while pending and len(children) - len(walls) < lanes:
                job = pending.pop(0)
                logs[job.name] = open(job.log, 'w')
                progress.started[job.name] = time.perf_counter()
                children[job.name] = subprocess.Popen(
                    list(job.argv), stdout=logs[job.name], stderr=subprocess.STDOUT, env=env,
                    start_new_session=True)  # its own process group: stopped as a whole, not hit by the terminal's ^C
                changed = True
            for name, child in children.items():
                if name in walls:
                    continue
                code, cpu = _reap(child)
                rows = len(read_summary(progress.jobs[name].summary))
                if rows > progress.done[name]:
                    progress.epoch_done(name, rows, time.perf_counter())
                    changed = True
                if code is None:
                    continue
                now = time.perf_counter()
                progress.finished[name] = now
                progress.cpu_s[name] = cpu
                walls[name] = now - progress.started[name]
                logs[name].close()
                changed = True
                if code != 0:
                    job = progress.jobs[name]
                    raise JobFailed(f'train.py failed for the demo run {name!r} (exit code {code}); its log is '
                                    f'{job.log}:\n{log_tail(job.log)}')
            now = time.perf_counter()
            if changed or now - last_update >= tick_s:  # a tick keeps the bar's clock and ETA moving
                on_update(progress, now)
                last_update = now
            if len(walls) < len(order):
                time.sleep(poll_s)
    finally:
        for child in children.values():
            _stop(child)
        for log in logs.values():
            log.close()
    return progress
