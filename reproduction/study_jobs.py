"""The study's work: per (arm, seed), train.py then the measurement, planned from the cache and run in order.

Each run is a :class:`timm_ext.demo.train_runs.TrainRun` trained through the plugin route (timm's own
train.py; there is no second training loop) by the job runner the demo uses (:mod:`timm_ext.demo.runner`),
one torch thread each, then measured in its own process (``measure_run.py``). Finished runs and their
measurements stay in the cache folder and are not run again.
"""
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Any, Callable, Dict, List, Optional, Sequence, Tuple

from longer_schedules import pending, run_dir
from plan import (
    CLAIM_BY_KEY,
    CPU_FILE,
    IMAGE_SIZE,
    MEASURE_FILE,
    R5_BUDGET_CPU_MIN,
    R5_CHECK,
    R5_REACH,
    R5_SEED_RULE,
    R5_TRAINS,
    SEEDS,
    TRAIN_ARGS,
    Arm,
    RevisionPlan,
)
from power import SeedDecision, budgeted_seeds
from run_results import Archive, long_archive
from supporting_runs import ALL_ARMS, ALL_ARMS_BY_NAME

from timm_ext.demo.runner import Job, Progress, read_summary, thread_env
from timm_ext.demo.runner import run_jobs as run_processes
from timm_ext.demo.train_runs import TrainRun, train_command

__all__ = ['FAILED_FILE', 'MEASURE_SCRIPT', 'STOPPED_FILE', 'StudyJob', 'claim_seeds_of', 'decide', 'measured',
           'pilot_decisions', 'plan_jobs', 'record_failed', 'record_stopped', 'regroup_jobs', 'revision_arms',
           'revision_jobs', 'run_jobs', 'stop_key', 'stopped_runs', 'study_jobs', 'train_args', 'trained', 'training',
           'unique_stops', 'write_cpu']

MEASURE_SCRIPT = Path(__file__).resolve().parent / 'measure_run.py'
FAILED_FILE = 'timm_ext_failed.json'  # a run whose command failed: why, in its folder (record_failed)
STOPPED_FILE = 'stopped.jsonl'  # runs stopped unfinished and trained again, in the runs folder (record_stopped)


def _print(line: str) -> None:
    print(line, flush=True)  # a study runs for an hour, often with its output in a file: show progress as it goes


def training(arm: Arm, data_dir: Path, runs: Path, seed: int) -> TrainRun:
    """``arm`` for ``seed`` as a train.py run: the study's shared settings, the seed and the arm's lr
    (and its weight decay, where it has its own: train.py reads the last ``--weight-decay``)."""
    own = ('--weight-decay', f'{arm.weight_decay:g}') if arm.weight_decay is not None else ()
    return TrainRun(run_dir(runs, arm.name, seed).name, data_dir, arm.model, arm.opt, arm.epochs,
                    (*TRAIN_ARGS, '--seed', str(seed), '--lr', f'{arm.lr:g}', *own), arm.model_kwargs,
                    arm.opt_kwargs)


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
            if (folder / FAILED_FILE).is_file():
                continue  # recorded as failed (run_jobs): kept with why, not trained again
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


def _claim_arms(claim: Any) -> List[str]:
    return [arm for side in (claim.a, claim.b) if side is not None
            for arm in (side if isinstance(side, tuple) else (side,))]


def claim_seeds_of(rev: RevisionPlan, arm: str, first: int = len(SEEDS)) -> Tuple[int, ...]:
    """The seeds from ``first`` on that ``arm`` trains for ``rev``'s claims read at a fixed number of seeds (the most
    any of them reads; revision 3's extra seeds)."""
    n = max([n for key, n in rev.claim_seeds.items() if arm in _claim_arms(CLAIM_BY_KEY[key])], default=first)
    return tuple(range(first, n))


def revision_jobs(rev: RevisionPlan, runs: Path, timm_train: Optional[str], archive: Archive,
                  only: Optional[AbstractSet[str]] = None) -> List[StudyJob]:
    """What one revision of ``plan.PLANS`` still has to train, read from its data, seed by seed: its arms at its
    seeds (the runs an earlier report holds read back, revision 3.1's runs among them where revision 4 reuses them);
    the extra seeds of the claims it reads at a fixed number of seeds; or, for a revision with a seed rule, the check
    before its pilot, its pilot, then the seeds its rule gives each claim. ``only`` limits it to some arms."""
    archived = {*archive, *long_archive(archive)}
    if rev.seed_rule:
        if rev.seed_rule not in SEED_RULES:
            raise ValueError(f'revision {rev.name} names the seed rule {rev.seed_rule!r}, which the planner does not '
                             f'know: one of {", ".join(map(repr, SEED_RULES))}')
        return SEED_RULES[rev.seed_rule](rev, runs, timm_train, archive, only)
    chosen = [a for a in ALL_ARMS if only is None or a.name in only]
    mine = [ALL_ARMS_BY_NAME[n] for n in rev.arms if only is None or n in only or n.rsplit('_x', 1)[0] in only]
    jobs = plan_jobs(runs, mine, rev.seeds, timm_train, archived) if mine else []
    if rev.claim_seeds:
        extra = sorted({seed for a in chosen for seed in claim_seeds_of(rev, a.name)})
        jobs += [job for seed in extra for job in plan_jobs(
            runs, [a for a in chosen if seed in claim_seeds_of(rev, a.name)], [seed], timm_train, archived)]
    return jobs


def regroup_jobs(revs: Sequence[RevisionPlan], runs: Path, names: Sequence[str], seeds: Sequence[int],
                 timm_train: Optional[str]) -> List[StudyJob]:
    """The runs the regrouping rules of ``revs`` (2.4, 3.1) ask for next: a seed's group at twice the schedule, where
    one of its runs missed the convergence rule (:func:`longer_schedules.pending`)."""
    groups = [group for rev in revs for group in rev.regroup]
    if not groups:
        return []
    return [job for arm, seed in pending(runs, names, seeds, [group[0] for group in groups])
            for job in plan_jobs(runs, [arm], [seed], timm_train)]


def study_jobs(revs: Sequence[RevisionPlan], runs: Path, arms: Sequence[Arm], seeds: Sequence[int],
               timm_train: Optional[str], archive: Archive, only: Optional[AbstractSet[str]] = None) -> List[StudyJob]:
    """The study's work in one plan: every arm of ``arms`` at ``seeds`` (the first revision's frame, its supporting
    runs included), then each revision of ``revs`` in order (:func:`revision_jobs`, limited to ``only``), each run
    once."""
    out: Dict[str, StudyJob] = {}
    for job in plan_jobs(runs, arms, seeds, timm_train, {*archive, *long_archive(archive)}):
        out.setdefault(job.key, job)
    for rev in revs:
        for job in revision_jobs(rev, runs, timm_train, archive, only):
            out.setdefault(job.key, job)
    return list(out.values())


def _pilot_run(runs: Path, arm: str, seed: int) -> Optional[Dict[str, Any]]:
    """A finished run's top-1 and CPU seconds (``failed``: why, where its command failed); None while it is not done."""
    folder = run_dir(runs, arm, seed)
    if (folder / FAILED_FILE).is_file():
        rec = json.loads((folder / FAILED_FILE).read_text())
        return dict(failed=rec['why'], cpu_s=rec.get('cpu_s'), top1=None)
    if not measured(folder) or not (folder / CPU_FILE).is_file():
        return None
    return dict(failed=None, top1=json.loads((folder / MEASURE_FILE).read_text())['top1'],
                cpu_s=json.loads((folder / CPU_FILE).read_text()).get('cpu_s'))


def pilot_decisions(rev: RevisionPlan, runs: Path, archive: Archive) -> Optional[List[SeedDecision]]:
    """The seeds each claim of ``rev`` gets from its pilot in the cache ``runs`` (:func:`decide`), once every pilot
    run is done (measured, or recorded as failed); None before."""
    check_arm, check_seed = R5_CHECK
    done = {(a, s): _pilot_run(runs, a, s) for a in (*rev.arms, check_arm.name)
            for s in (rev.seeds if a != check_arm.name else (check_seed,))}
    if any(v is None for v in done.values()):
        return None
    return decide(rev, done, archive)


def decide(rev: RevisionPlan, done: Dict[Tuple[str, int], Dict[str, Any]], archive: Archive) -> List[SeedDecision]:
    """Revision 5's rule (``plan.R5_SEED_RULE``, through :func:`power.budgeted_seeds`) on its finished pilot: ``done``
    holds each pilot run's (and the check's) ``top1``, ``cpu_s`` and ``failed`` (why, or None) by (arm, seed). The
    differences are each arm's top-1 minus SAM's (the reused runs, read back) at the same seed; an arm with a failed
    pilot run or one below ``R5_TRAINS`` is dropped; the CPU already spent is the check's and the pilot's."""
    pilot, dropped, cpu, claims = {}, {}, {}, {}
    for key in rev.claims:
        claim = CLAIM_BY_KEY[key]
        runs_of = [done[claim.b, s] for s in rev.seeds]
        missing = [s for s in rev.seeds if (claim.a, s) not in archive]
        if missing:
            raise ValueError(f'revision {rev.name} pairs {claim.b} with {claim.a}, whose seed {missing[0]} is not in '
                             'the archive: give the report\'s measurements.json (--archive)')
        bad = [f'seed {s}: {r["failed"]}' if r['failed'] else f'seed {s}: top-1 {r["top1"]:.1f} < {R5_TRAINS:g}'
               for s, r in zip(rev.seeds, runs_of) if r['failed'] or r['top1'] < R5_TRAINS]
        if bad:
            dropped[key] = 'cannot train this model (' + '; '.join(bad) + ')'
        else:
            pilot[key] = [r['top1'] - archive[claim.a, s]['top1'] for s, r in zip(rev.seeds, runs_of)]
        pilot.setdefault(key, [0.0])
        cpu[key] = statistics.fmean((r['cpu_s'] or 0.0) / 60 for r in runs_of)
        claims[key] = (claim.margin, claim.direction)
    spent = sum((r['cpu_s'] or 0.0) / 60 for r in done.values())
    return budgeted_seeds(pilot, claims, cpu, dropped, spent, R5_BUDGET_CPU_MIN, R5_REACH)


def _staged_jobs(rev: RevisionPlan, runs: Path, timm_train: Optional[str], archive: Archive,
                 only: Optional[AbstractSet[str]]) -> List[StudyJob]:
    """A revision with a seed rule (revision 5): the check before its pilot, its arms at its pilot seeds, seed by seed;
    once that is done, the seeds its rule gives each claim it reads."""
    arms = [ALL_ARMS_BY_NAME[name] for name in rev.arms if only is None or name in only]
    jobs = plan_jobs(runs, [R5_CHECK[0]], [R5_CHECK[1]], timm_train, set(archive))
    jobs += plan_jobs(runs, arms, rev.seeds, timm_train, set(archive))
    if jobs:
        return jobs
    decisions = pilot_decisions(rev, runs, archive) or []
    more = {CLAIM_BY_KEY[d.key].b: d.n for d in decisions if d.status == 'read'}
    extra = sorted({s for n in more.values() for s in range(len(rev.seeds), n)})
    return [job for seed in extra for job in plan_jobs(
        runs, [a for a in arms if more.get(a.name, 0) > seed], [seed], timm_train, set(archive))]


def revision_arms(rev: RevisionPlan) -> Tuple[str, ...]:
    """The arms ``rev`` trains: its own and, under revision 5's seed rule, its check's."""
    return (*rev.arms, *((R5_CHECK[0].name,) if rev.seed_rule == R5_SEED_RULE else ()))


# the seed rules a revision may name (``RevisionPlan.seed_rule``) and the planner that follows each
SEED_RULES = {R5_SEED_RULE: _staged_jobs}


def write_cpu(run_dir: Path, cpu_s: Optional[float], lanes: int) -> None:
    """``CPU_FILE`` in ``run_dir``: the run's CPU seconds (its own processes' user + system time, training and
    measuring; None where the OS reported none), the lanes it ran beside and the machine's cores. Written whole
    (a tmp file, then replaced): a study stopped mid-write leaves no half file."""
    tmp = run_dir / (CPU_FILE + '.tmp')
    tmp.write_text(json.dumps(dict(cpu_s=None if cpu_s is None else round(cpu_s, 1), lanes=lanes,
                                   cores=os.cpu_count())))
    tmp.replace(run_dir / CPU_FILE)


def _log_tail(log_file: Path, lines: int = 3) -> str:
    try:
        return ' | '.join(x.strip() for x in log_file.read_text(errors='replace').splitlines()[-lines:] if x.strip())
    except OSError:
        return 'no log'


def record_failed(run_dir: Path, log_file: Path, code: int, cpu_s: Optional[float]) -> None:
    """``FAILED_FILE`` in ``run_dir``: a run whose command failed is kept with why (its exit code and the end of its
    log) and its CPU time, and the planner does not train it again (:func:`plan_jobs`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    why = f'exit code {code}: {_log_tail(log_file)}'
    (run_dir / FAILED_FILE).write_text(json.dumps(dict(why=why, cpu_s=None if cpu_s is None else round(cpu_s, 1),
                                                       when=time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime()))))


def record_stopped(runs: Path, run_dir: Path) -> None:
    """A line in ``runs/STOPPED_FILE`` for an unfinished run about to be trained again (the study was stopped while it
    trained: train.py cannot resume it): its name, the epochs it had finished and when its folder was last written."""
    summary = run_dir / 'summary.csv'
    epochs = len(read_summary(summary)) if summary.is_file() else 0
    when = time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(run_dir.stat().st_mtime))
    with open(runs / STOPPED_FILE, 'a') as f:
        f.write(json.dumps(dict(run=run_dir.name, epochs=epochs, last_written=when,
                                why='stopped: the study was interrupted while it trained; trained again')) + '\n')


def stop_key(record: Dict[str, Any]) -> Tuple[str, int]:
    """What names one stop: the run and the epochs it had finished. Not when its folder was last written: a cache
    restored on another machine carries the restore's file times, so one stop recorded before and after (by
    ``keep_runs.py``, then by :func:`record_stopped`) differs only there."""
    return record['run'], int(record.get('epochs', 0))


def unique_stops(records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``records`` with each stop once (:func:`stop_key`), the first record of it kept."""
    seen: set = set()
    return [x for x in records if not (stop_key(x) in seen or seen.add(stop_key(x)))]


def stopped_runs(runs: Path) -> List[Dict[str, Any]]:
    """Every record of :func:`record_stopped` in ``runs``, oldest first."""
    path = runs / STOPPED_FILE
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def run_jobs(jobs: List[StudyJob], runs: Path, lanes: int, log: Callable[[str], None] = _print) -> None:
    """Run the jobs ``lanes`` at a time in their order, one torch thread each; a failed command stops its job, the
    others go on, and the failed ones are named at the end. A finished train-and-measure job writes its run's CPU
    time (:func:`write_cpu`) as it ends; a job that only measures again writes none, as its CPU time would leave
    out the training (an earlier file stays)."""
    runs.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        if job.trains and job.run_dir.exists():
            record_stopped(runs, job.run_dir)
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
                elif key in progress.failed:
                    record_failed(by_key[key].run_dir, runs / f'{key}.log', progress.failed[key],
                                  progress.cpu_s.get(key))
                status = f'FAILED (see {runs / (key + ".log")})' if key in progress.failed else 'done'
                log(f'[{(now - start) / 60:5.1f} min] {len(reported)}/{len(jobs)} {key}: {status} '
                    f'in {progress.wall_s(key):.0f} s')

    progress = run_processes([j.job(runs) for j in jobs], thread_env(1), lanes, on_update, poll_s=0.5,
                             longest_first=False, keep_going=True)
    if progress.failed:
        raise RuntimeError(f'{len(progress.failed)} run(s) failed: {", ".join(progress.failed)}; their logs are in '
                           f'{runs}')
