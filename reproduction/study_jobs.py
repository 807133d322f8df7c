"""The study's work: per (arm, seed), train.py then the measurement, planned from the cache and run in order.

Each run is a :class:`timm_ext.demo.train_runs.TrainRun` trained through the plugin route (timm's own
train.py; there is no second training loop) by the job runner the demo uses (:mod:`timm_ext.demo.runner`),
one torch thread each, then measured in its own process (``measure_run.py``). Finished runs and their
measurements stay in the cache folder and are not run again.
"""
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Callable, List, Optional, Sequence, Tuple

from longer_schedules import LONG_ARMS, pending, run_dir
from plan import CPU_FILE, IMAGE_SIZE, LONG_SEEDS, MEASURE_FILE, TRAIN_ARGS, Arm, extended_seeds

from timm_ext.demo.runner import Job, Progress, read_summary, thread_env
from timm_ext.demo.runner import run_jobs as run_processes
from timm_ext.demo.train_runs import TrainRun, train_command

__all__ = ['MEASURE_SCRIPT', 'StudyJob', 'extended_jobs', 'extension_jobs', 'long_jobs', 'measured', 'plan_jobs',
           'run_jobs', 'train_args', 'trained', 'training', 'write_cpu']

MEASURE_SCRIPT = Path(__file__).resolve().parent / 'measure_run.py'


def _print(line: str) -> None:
    print(line, flush=True)  # a study runs for an hour, often with its output in a file: show progress as it goes


def training(arm: Arm, data_dir: Path, runs: Path, seed: int) -> TrainRun:
    """``arm`` for ``seed`` as a train.py run: the study's shared settings, the seed and the arm's lr."""
    return TrainRun(run_dir(runs, arm.name, seed).name, data_dir, arm.model, arm.opt, arm.epochs,
                    (*TRAIN_ARGS, '--seed', str(seed), '--lr', f'{arm.lr:g}'), arm.model_kwargs, arm.opt_kwargs)


def train_args(arm: Arm, data_dir: Path, runs: Path, seed: int) -> List[str]:
    """train.py's arguments for ``arm`` and ``seed`` (its folder in ``runs``: ``<arm>-s<seed>``)."""
    return training(arm, data_dir, runs, seed).train_args(runs)


def trained(run_dir: Path, epochs: int) -> bool:
    """A finished run: every epoch in summary.csv and a last checkpoint."""
    if not (run_dir / 'last.pth.tar').is_file() or not (run_dir / 'summary.csv').is_file():
        return False
    return len(read_summary(run_dir / 'summary.csv')) >= epochs


def measured(run_dir: Path) -> bool:
    """Measurements newer than the checkpoint they were taken on."""
    m, ckpt = run_dir / MEASURE_FILE, run_dir / 'last.pth.tar'
    return m.is_file() and ckpt.is_file() and m.stat().st_mtime >= ckpt.stat().st_mtime


@dataclass
class StudyJob:
    """One (arm, seed): the commands still to run (train, then measure) and the cost left, in ETA units."""
    arm: Arm
    seed: int
    run_dir: Path
    commands: List[List[str]]
    cost: float

    @property
    def key(self) -> str:
        return f'{self.arm.name}-s{self.seed}'

    @property
    def trains(self) -> bool:
        return len(self.commands) == 2

    def job(self, runs: Path) -> Job:
        """The runner's job: the first command, then the rest in the same lane, logged to ``runs/<key>.log``."""
        return Job(self.key, self.commands[0], runs / f'{self.key}.log', self.run_dir / 'summary.csv',
                   self.arm.epochs, self.cost / max(1, self.arm.epochs), tuple(self.commands[1:]))


def plan_jobs(runs: Path, arms: Sequence[Arm], seeds: Sequence[int], timm_train: Optional[str],
              archived: AbstractSet[Tuple[str, int]] = frozenset()) -> List[StudyJob]:
    """The work not cached yet, seed by seed in ``arms`` order (an interrupted study has whole seeds); an (arm, seed)
    in ``archived`` is read back from an earlier report unless the cache has begun it."""
    from timm_ext.data import digits_image_folder, digits_subset_folder

    jobs, script = [], None
    for seed in seeds:
        for arm in arms:
            folder = run_dir(runs, arm.name, seed)
            if (arm.name, seed) in archived and not folder.exists():
                continue
            commands, cost = [], 0.0
            if not trained(folder, arm.epochs):
                data = (digits_subset_folder(arm.fraction, size=IMAGE_SIZE) if arm.fraction < 1
                        else digits_image_folder(size=IMAGE_SIZE))
                command = train_command(training(arm, data, runs, seed), runs, timm_train, script)
                script = command.script  # found and verified once
                commands.append(command.argv)
                cost += arm.cost
            if commands or not measured(folder):
                commands.append([sys.executable, str(MEASURE_SCRIPT), str(folder), arm.name, str(seed)])
                cost += 0.05 if arm.measure == 'curve' else (0.35 if not commands[:-1] else 0.0)
            if commands:
                jobs.append(StudyJob(arm, seed, folder, commands, cost))
    return jobs


def extended_jobs(runs: Path, arms: Sequence[Arm], timm_train: Optional[str],
                  archived: AbstractSet[Tuple[str, int]] = frozenset()) -> List[StudyJob]:
    """Revision 3: each arm's extra seeds for the claims read at more seeds, seed by seed (the claims that need the
    fewest seeds are complete first)."""
    extra = sorted({seed for arm in arms for seed in extended_seeds(arm.name)})
    return [job for seed in extra for job in plan_jobs(
        runs, [a for a in arms if seed in extended_seeds(a.name)], [seed], timm_train, archived)]


def extension_jobs(runs: Path, arms: Sequence[Arm], seeds: Sequence[int],
                   timm_train: Optional[str]) -> List[StudyJob]:
    """Revisions 2.4 and 3.1: a seed's group at twice the schedule, where one of its runs missed the rule."""
    return [job for arm, seed in pending(runs, [a.name for a in arms], seeds)
            for job in plan_jobs(runs, [arm], [seed], timm_train)]


def long_jobs(runs: Path, timm_train: Optional[str],
              archived: AbstractSet[Tuple[str, int]] = frozenset()) -> List[StudyJob]:
    """Revision 4: the ViT pair at twice its schedule for every seed of ``LONG_SEEDS``, seed by seed; what
    ``archived`` holds (revision 3.1's pairs at ``LONG_REUSED``, read back) is not trained again."""
    return plan_jobs(runs, LONG_ARMS, LONG_SEEDS, timm_train, archived)


def write_cpu(run_dir: Path, cpu_s: Optional[float], lanes: int) -> None:
    """``CPU_FILE`` in ``run_dir``: the run's CPU seconds (its own processes' user + system time, training and
    measuring; None where the OS reported none), the lanes it ran beside and the machine's cores. Written whole
    (a tmp file, then replaced): a study stopped mid-write leaves no half file."""
    tmp = run_dir / (CPU_FILE + '.tmp')
    tmp.write_text(json.dumps(dict(cpu_s=None if cpu_s is None else round(cpu_s, 1), lanes=lanes,
                                   cores=os.cpu_count())))
    tmp.replace(run_dir / CPU_FILE)


def run_jobs(jobs: List[StudyJob], runs: Path, lanes: int, log: Callable[[str], None] = _print) -> None:
    """Run the jobs ``lanes`` at a time in their order, one torch thread each; a failed command stops its job, the
    others go on, and the failed ones are named at the end. A finished train-and-measure job writes its run's CPU
    time (:func:`write_cpu`) as it ends; a job that only measures again writes none, as its CPU time would leave
    out the training (an earlier file stays)."""
    runs.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        if job.trains and job.run_dir.exists():
            shutil.rmtree(job.run_dir)  # train then measure: an unfinished run here, train.py cannot resume it
    start = time.perf_counter()
    reported: List[str] = []
    by_key = {j.key: j for j in jobs}

    def on_update(progress: Progress, now: float) -> None:
        for key in progress.finished:
            if key not in reported:
                reported.append(key)
                if key not in progress.failed and by_key[key].trains:
                    write_cpu(by_key[key].run_dir, progress.cpu_s.get(key), lanes)
                status = f'FAILED (see {runs / (key + ".log")})' if key in progress.failed else 'done'
                log(f'[{(now - start) / 60:5.1f} min] {len(reported)}/{len(jobs)} {key}: {status} '
                    f'in {progress.wall_s(key):.0f} s')

    progress = run_processes([j.job(runs) for j in jobs], thread_env(1), lanes, on_update, poll_s=0.5,
                             longest_first=False, keep_going=True)
    if progress.failed:
        raise RuntimeError(f'{len(progress.failed)} run(s) failed: {", ".join(progress.failed)}; their logs are in '
                           f'{runs}')
