"""The one runner of train.py jobs: several processes side by side on a few CPU cores, with progress.

The demo, the reproduction study (``reproduction/``) and the SAM-variant table all train small models on
the digits through timm's train.py; this module runs their jobs. One CPU thread per run keeps a core busy,
so two runs on two cores finish sooner than the same runs one after the other with two threads each, and
it keeps the top-1 the same on every machine and for any number of lanes. Each job is its own process
group writing its own log; its finished epochs are counted from the rows of the ``summary.csv`` train.py
writes after every epoch. Ctrl-C stops every run (the whole process group); a failed run stops the others
before the error surfaces, with its log tail, unless the caller keeps going and reads the failures.
"""
import os
import signal
import subprocess
import time
from typing import IO, Callable, Dict, List, Optional, Sequence, Tuple

from timm_ext._summary_csv import read_summary
from timm_ext.demo.jobs import Job, JobFailed
from timm_ext.demo.progress import Progress

__all__ = ['Job', 'JobFailed', 'Progress', 'available_cores', 'log_tail', 'plan_parallelism', 'read_summary',
           'run_jobs', 'schedule', 'thread_env']


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


def thread_env(threads: int) -> Dict[str, str]:
    """The environment of a train.py child: this process's timm_ext, ``threads`` torch (OpenMP, MKL) threads."""
    from timm_ext.launch.build_command import child_env

    return dict(child_env(), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def schedule(jobs: Sequence[Job]) -> List[Job]:
    """Longest first (most work), so the last run to start is a short one and the cores finish together."""
    return sorted(jobs, key=lambda j: -j.work)


def log_tail(path: os.PathLike, lines: int = 8) -> str:
    try:
        with open(path, errors='replace') as f:
            text = f.read().strip().splitlines()
    except OSError:
        return ''
    return '\n'.join(text[-lines:])


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


def _start(argv: Sequence[str], log: IO[str], env: Dict[str, str]) -> subprocess.Popen:
    # its own process group: stopped as a whole, not hit by the terminal's ^C
    return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _add(total: Optional[float], cpu: Optional[float]) -> Optional[float]:
    return None if total is None or cpu is None else total + cpu


def run_jobs(
        jobs: Sequence[Job],
        env: Dict[str, str],
        lanes: int,
        on_update: Callable[[Progress, float], None] = lambda progress, now: None,
        poll_s: float = 0.25,
        tick_s: float = 1.0,
        longest_first: bool = True,
        keep_going: bool = False,
        label: str = 'run',
) -> Progress:
    """Run every job, ``lanes`` at a time (:func:`schedule` order, or as given without ``longest_first``), each
    job's commands one after the other in its lane, its output appended to its log; returns the final
    :class:`Progress` (per job: start and end times, epochs, CPU seconds where the OS reports them, failures).

    ``on_update(progress, now)`` is called whenever a run starts, finishes an epoch or ends, and every ``tick_s``.
    A failed command (non-zero exit) ends its job: it stops the others and raises :class:`JobFailed` (its
    message names the ``label`` and the job), or with ``keep_going`` lands in ``progress.failed`` while the
    other jobs go on. Ctrl-C stops them all and re-raises.
    """
    order = schedule(jobs) if longest_first else list(jobs)
    progress = Progress(order, lanes)
    pending = list(order)
    running: Dict[str, subprocess.Popen] = {}
    left: Dict[str, List[Sequence[str]]] = {}
    logs: Dict[str, IO[str]] = {}
    last_update = 0.0
    try:
        while pending or running:
            changed = False
            while pending and len(running) < lanes:
                job = pending.pop(0)
                logs[job.name] = open(job.log, 'a')
                left[job.name] = list(job.then)
                progress.started[job.name] = time.perf_counter()
                progress.cpu_s[job.name] = 0.0
                running[job.name] = _start(job.argv, logs[job.name], env)
                changed = True
            for name, child in list(running.items()):
                code, cpu = _reap(child)
                rows = len(read_summary(progress.jobs[name].summary))
                if rows > progress.done[name]:
                    progress.epoch_done(name, rows, time.perf_counter())
                    changed = True
                if code is None:
                    continue
                changed = True
                progress.cpu_s[name] = _add(progress.cpu_s[name], cpu)
                if code == 0 and left[name]:
                    running[name] = _start(left[name].pop(0), logs[name], env)
                    continue
                del running[name]
                progress.finished[name] = time.perf_counter()
                logs[name].close()
                if code != 0:
                    progress.failed[name] = code
                    if not keep_going:
                        job = progress.jobs[name]
                        what = job.program if len(left[name]) == len(job.then) else f'a command after {job.program}'
                        raise JobFailed(f'{what} failed for the {label} {name!r} (exit code {code}); its log is '
                                        f'{job.log}:\n{log_tail(job.log)}')
            now = time.perf_counter()
            if changed or now - last_update >= tick_s:  # a tick keeps the bar's clock and ETA moving
                on_update(progress, now)
                last_update = now
            if pending or running:
                time.sleep(poll_s)
    finally:
        for child in running.values():
            _stop(child)
        for log in logs.values():
            log.close()
    return progress
