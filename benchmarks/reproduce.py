"""The reproduction study: the papers' claims on real digits, trained to convergence over 5 seeds, with statistics.

``python benchmarks/reproduce.py --timm-train PATH`` (from the repository root) trains every arm of
``_repro_plan.ARMS`` for every seed with timm's own train.py (the command of
:func:`timm_ext.launch.commands.build_train_command`; there is no second training loop), measures
each finished run in its own process (``_repro_measure.py``), then writes ``docs/reproduction.md``,
its plots and ``docs/reproduction/measurements.json`` (``_repro_report.py``). It prints the plan
and an ETA first. Finished runs and their measurements are kept in ``--runs`` and reused, so the
same command resumes an interrupted study or, with everything cached, only regenerates the report.
``--dry-run`` prints the plan and stops; ``--report-only`` refuses to train.

The claims, their directions, margins and the convergence rule live in ``_repro_plan.py``, fixed
before the runs; ``_repro_support.py`` adds the supporting runs that explain failed claims
(``_repro_why.py``); the statistics are :mod:`timm_ext.analysis.stats`.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _repro_extend import doubled, pending, run_dir  # noqa: E402
from _repro_measure import MEASURE_FILE  # noqa: E402
from _repro_plan import ARM_BY_NAME, EXTENDED_PAIRS, IMAGE_SIZE, MAX_DOUBLINGS, SEEDS, TRAIN_ARGS, Arm  # noqa: E402
from _repro_support import ALL_ARMS, SUPPORT_ARMS  # noqa: E402

__all__ = ['Job', 'plan_jobs', 'run_jobs', 'train_args', 'main']

# seconds of one plain-ViT run (30 epochs, one thread) on this project's 2-core EPYC machine: the ETA's unit
UNIT_SECONDS = 80.0
MEASURE_SCRIPT = Path(__file__).resolve().parent / '_repro_measure.py'


def _print(line: str) -> None:
    print(line, flush=True)  # a study runs for an hour, often with its output in a file: show progress as it goes


def train_args(arm: Arm, data_dir: Path, runs: Path, seed: int) -> List[str]:
    """train.py's arguments for ``arm`` and ``seed``: the study's shared settings, then the arm's own."""
    args = [*TRAIN_ARGS, '--seed', str(seed), '--lr', f'{arm.lr:g}', '--epochs', str(arm.epochs),
            '--data-dir', str(data_dir), '--output', str(runs), '--experiment', run_dir(runs, arm.name, seed).name,
            '--model', arm.model, '--opt', arm.opt,
            '--model-kwargs', *(f'{k}={v}' for k, v in arm.model_kwargs.items())]
    if arm.opt_kwargs:
        args += ['--opt-kwargs', *(f'{k}={v}' for k, v in arm.opt_kwargs.items())]
    return args


def trained(run_dir: Path, epochs: int) -> bool:
    """A finished run: every epoch in summary.csv and a last checkpoint."""
    from timm_ext._summary_csv import read_summary

    if not (run_dir / 'last.pth.tar').is_file() or not (run_dir / 'summary.csv').is_file():
        return False
    return len(read_summary(run_dir / 'summary.csv')) >= epochs


def measured(run_dir: Path) -> bool:
    """Measurements newer than the checkpoint they were taken on."""
    m, ckpt = run_dir / MEASURE_FILE, run_dir / 'last.pth.tar'
    return m.is_file() and ckpt.is_file() and m.stat().st_mtime >= ckpt.stat().st_mtime


@dataclass
class Job:
    """One (arm, seed): the commands still to run (train, then measure) and the cost left, in ETA units."""
    arm: Arm
    seed: int
    run_dir: Path
    commands: List[List[str]]
    cost: float

    @property
    def key(self) -> str:
        return f'{self.arm.name}-s{self.seed}'


def plan_jobs(runs: Path, arms: Sequence[Arm], seeds: Sequence[int], timm_train: Optional[str]) -> List[Job]:
    """The work not cached yet, seed by seed in ``arms`` order (an interrupted study has whole seeds)."""
    from timm_ext.data import digits_image_folder, digits_subset_folder
    from timm_ext.launch.commands import build_train_command

    jobs = []
    for seed in seeds:
        for arm in arms:
            folder = run_dir(runs, arm.name, seed)
            commands, cost = [], 0.0
            if not trained(folder, arm.epochs):
                data = (digits_subset_folder(arm.fraction, size=IMAGE_SIZE) if arm.fraction < 1
                        else digits_image_folder(size=IMAGE_SIZE))
                commands.append(build_train_command(train_args(arm, data, runs, seed), timm_train=timm_train).argv)
                cost += arm.cost
            if commands or not measured(folder):
                commands.append([sys.executable, str(MEASURE_SCRIPT), str(folder), arm.name, str(seed)])
                cost += 0.05 if arm.measure == 'curve' else (0.35 if not commands[:-1] else 0.0)
            if commands:
                jobs.append(Job(arm, seed, folder, commands, cost))
    return jobs


def extension_jobs(runs: Path, arms: Sequence[Arm], seeds: Sequence[int], timm_train: Optional[str]) -> List[Job]:
    """Revision 2.4: the lr sweep's pair at twice the schedule, for each seed where one of its runs missed the rule."""
    return [job for arm, seed in pending(runs, [a.name for a in arms], seeds)
            for job in plan_jobs(runs, [arm], [seed], timm_train)]


def run_jobs(jobs: List[Job], runs: Path, lanes: int, log: Callable[[str], None] = _print) -> None:
    """Run the jobs ``lanes`` at a time, one torch thread each; a failed command stops its job (named at the end)."""
    from timm_ext.launch.commands import child_env

    env = dict(child_env(), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    runs.mkdir(parents=True, exist_ok=True)
    todo = list(jobs)
    active: List[Tuple[Job, subprocess.Popen, Any]] = []
    failed: List[str] = []
    total = len(jobs)
    start = time.perf_counter()

    started: Dict[str, float] = {}

    def launch(job: Job) -> None:
        if job.key not in started and len(job.commands) == 2 and job.run_dir.exists():
            shutil.rmtree(job.run_dir)  # train then measure: an unfinished run here, train.py cannot resume it
        started.setdefault(job.key, time.perf_counter())
        cmd = job.commands.pop(0)
        logf = open(runs / f'{job.key}.log', 'a')
        active.append((job, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env), logf))

    done = 0
    while todo or active:
        while todo and len(active) < lanes:
            launch(todo.pop(0))
        time.sleep(0.5)
        for item in list(active):
            job, proc, logf = item
            if proc.poll() is None:
                continue
            logf.close()
            active.remove(item)
            if proc.returncode != 0:
                failed.append(job.key)
                job.commands.clear()
            if job.commands:
                launch(job)
                continue
            done += 1
            elapsed = time.perf_counter() - start
            log(f'[{elapsed / 60:5.1f} min] {done}/{total} {job.key}: '
                f'{"FAILED (see " + str(runs / (job.key + ".log")) + ")" if job.key in failed else "done"} '
                f'in {time.perf_counter() - started[job.key]:.0f} s')
    if failed:
        raise RuntimeError(f'{len(failed)} run(s) failed: {", ".join(failed)}; their logs are in {runs}')


def _eta_minutes(jobs: Sequence[Job], lanes: int) -> float:
    return sum(j.cost for j in jobs) * UNIT_SECONDS / max(1, min(lanes, os.cpu_count() or 1)) / 60


def print_plan(jobs: Sequence[Job], arms: Sequence[Arm], seeds: Sequence[int], lanes: int,
               log: Callable[[str], None] = _print, longer: Sequence[Job] = ()) -> None:
    """What will run (per arm: seeds to train, seeds only to measure, seeds cached) and the ETA."""
    support = sum(a in SUPPORT_ARMS for a in arms)
    log(f'reproduction study: {len(arms)} arms ({support} of them supporting runs) x {len(seeds)} seeds = '
        f'{len(arms) * len(seeds)} train.py runs')
    for arm in arms:
        mine = [j for j in jobs if j.arm is arm]
        train = [j.seed for j in mine if len(j.commands) == 2]
        measure = [j.seed for j in mine if len(j.commands) == 1]
        cached = len(seeds) - len(mine)
        log(f'  {arm.name:<20} {arm.model:<24} {arm.opt:<9} lr {arm.lr:<6g} data {arm.fraction:<5g} '
            f'{arm.epochs:>3} epochs: train {len(train)}, measure only {len(measure)}, cached {cached}')
    names = {a.name for a in arms}
    pairs = [pair for pair in EXTENDED_PAIRS if all(n in names for n in pair)]
    for pair in pairs:
        per_seed = sum(doubled(ARM_BY_NAME[n], 1).cost for n in pair) * UNIT_SECONDS / max(1, lanes) / 60
        log(f'then each seed whose {" / ".join(pair)} pair misses the convergence rule trains both again at twice '
            f'the schedule (revision 2.4; up to {MAX_DOUBLINGS} times): +{per_seed:.0f} min per seed at 2x, '
            f'+{2 * per_seed:.0f} more at 4x')
    if jobs:
        log(f'ETA: {_eta_minutes(jobs, lanes):.0f} min with {lanes} runs at a time on an idle 2-core machine '
            f'(a plain ViT run = {UNIT_SECONDS:.0f} s), then the report (< 2 min)')
    elif longer:
        log(f'the plan is cached; first {len(longer)} run(s) at a longer schedule (revision 2.4: '
            f'{", ".join(j.key for j in longer)}), ETA {_eta_minutes(longer, lanes):.0f} min, then the report')
    else:
        log('everything is cached: regenerating the report only (< 2 min)')


def _public_argv(argv: Sequence[str]) -> List[str]:
    """The command as the report prints it: this machine's paths as placeholders."""
    placeholders = {'--timm-train': 'PATH', '--runs': 'DIR', '--docs': 'DIR'}
    out: List[str] = []
    for arg in argv:
        key, eq, _ = arg.partition('=')
        if out and out[-1] in placeholders:
            out.append(placeholders[out[-1]])
        elif eq and key in placeholders:
            out.append(f'{key}={placeholders[key]}')
        else:
            out.append(arg)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python benchmarks/reproduce.py', description=__doc__.splitlines()[0])
    parser.add_argument('--runs', default=None, help='folder of the train.py runs and their measurements, reused '
                        '(default: $TIMM_EXT_CACHE/reproduction-v3-runs)')
    parser.add_argument('--docs', default='docs', help='folder that receives reproduction.md and reproduction/')
    parser.add_argument('--seeds', type=int, nargs='+', default=list(SEEDS))
    parser.add_argument('--arms', nargs='+', default=[a.name for a in ALL_ARMS],
                        help='subset of the arms (default: all, the supporting runs included)')
    parser.add_argument('--jobs', type=int, default=2, help='runs at a time (one thread each)')
    parser.add_argument('--timm-train', default=None, help='timm\'s train.py (or its folder)')
    parser.add_argument('--dry-run', action='store_true', help='print the plan and the ETA, run nothing')
    parser.add_argument('--report-only', action='store_true', help='regenerate the report from cached runs; '
                        'refuse if any run or measurement is missing')
    args = parser.parse_args(argv)
    names = {a.name for a in ALL_ARMS}
    unknown = [a for a in args.arms if a not in names]
    if unknown:
        parser.error(f'unknown arm {unknown[0]!r}: choose from {", ".join(sorted(names))}')
    if args.jobs < 1:
        parser.error(f'--jobs must be at least 1, got {args.jobs}')
    arms = [a for a in ALL_ARMS if a.name in args.arms]
    from timm_ext.data import default_cache_dir

    runs = Path(args.runs).expanduser() if args.runs else default_cache_dir() / 'reproduction-v3-runs'
    start = time.perf_counter()
    load_before = os.getloadavg()[1]
    jobs = plan_jobs(runs, arms, args.seeds, args.timm_train)
    jobs_after = [] if jobs else extension_jobs(runs, arms, args.seeds, args.timm_train)
    print_plan(jobs, arms, args.seeds, args.jobs, longer=jobs_after)
    if args.dry_run:
        return 0
    if (jobs or jobs_after) and args.report_only:
        first = (jobs or jobs_after)[0]
        parser.error(f'--report-only: {len(jobs or jobs_after)} run(s) are not trained or measured in {runs} '
                     f'(first: {first.key}); run without --report-only to train them')
    to_train = sum(1 for j in jobs if len(j.commands) == 2)
    run_jobs(jobs, runs, args.jobs)
    for _ in range(MAX_DOUBLINGS):  # revision 2.4: the lr sweep's pair, seed by seed, until both runs converge
        more = extension_jobs(runs, arms, args.seeds, args.timm_train)
        if not more:
            break
        _print(f'{len(more)} run(s) at twice the schedule, where the lr sweep\'s pair missed the convergence rule: '
               f'{", ".join(j.key for j in more)}; ETA {_eta_minutes(more, args.jobs):.0f} min')
        to_train += sum(1 for j in more if len(j.commands) == 2)
        run_jobs(more, runs, args.jobs)
    from _repro_report import write_report

    command = 'python benchmarks/reproduce.py ' + ' '.join(_public_argv(list(argv if argv is not None
                                                                                else sys.argv[1:])))
    path = write_report(runs, arms, args.seeds, Path(args.docs), command.strip(), wall_s=time.perf_counter() - start,
                        trained=to_train, load=(load_before, os.getloadavg()[1]))
    print(f'report: {path} ({time.perf_counter() - start:.0f} s in all)')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
