"""The reproduction study: the papers' claims on real digits under a stated convergence rule, 5 seeds and more.

``python reproduction/reproduce.py --timm-train PATH`` (from the repository root) trains every arm of
``plan.ARMS`` for every seed with timm's own train.py, through the job runner the demo uses
(``study_jobs.py``: :mod:`timm_ext.demo.runner`; there is no second training loop), measures each
finished run in its own process (``measure_run.py``), then writes ``docs/reproduction.md``, its plots
and ``docs/reproduction/measurements.json`` (``report.py``). It prints the plan and an ETA first.
Finished runs and their measurements are kept in ``--runs`` and reused, so the same command resumes an
interrupted study or, with everything cached, only regenerates the report. ``--dry-run`` prints the plan
and stops; ``--report-only`` refuses to train. Runs that are not in ``--runs`` but in the last report's
``measurements.json`` (``--archive``) are read back from it, not trained again; revision 3's extra seeds for
the claims the power analysis put within reach (``plan.EXTENDED_SEEDS``) are part of the default plan.

The claims, their directions, margins and the convergence rule live in ``plan.py``, fixed before the
runs; ``supporting_runs.py`` adds the supporting runs that explain failed claims (``why_failed.py``),
``longer_schedules.py`` the longer schedules of revisions 2.4 and 3.1; the statistics are
:mod:`timm_ext.analysis.stats`.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import AbstractSet, Callable, List, Optional, Sequence

from keep_runs import all_reported, keep_runs, kept_path
from longer_schedules import LONG_ARMS, doubled
from plan import (
    ARM_BY_NAME,
    EXTENDED_GROUP,
    EXTENDED_PAIRS,
    EXTENDED_SEEDS,
    LONG_PAIR,
    LONG_SEEDS,
    MAX_DOUBLINGS,
    PLANS,
    R5_CHECK,
    SEEDS,
    Arm,
    RevisionPlan,
    extended_seeds,
)
from run_ledger import load_earlier_runs
from run_results import Archive, load_archive, long_archive
from study_jobs import StudyJob, pilot_decisions, regroup_jobs, revision_arms, run_jobs, study_jobs, unique_stops
from supporting_runs import ALL_ARMS, SUPPORT_ARMS

__all__ = ['main', 'print_plan']

# seconds of one plain-ViT run (30 epochs, one thread) on this project's 2-core EPYC machine: the ETA's unit
UNIT_SECONDS = 80.0


def _print(line: str) -> None:
    print(line, flush=True)  # a study runs for an hour, often with its output in a file: show progress as it goes


def _eta_minutes(jobs: Sequence[StudyJob], lanes: int) -> float:
    return sum(j.cost for j in jobs) * UNIT_SECONDS / max(1, min(lanes, os.cpu_count() or 1)) / 60


def print_plan(jobs: Sequence[StudyJob], arms: Sequence[Arm], seeds: Sequence[int], lanes: int,
               log: Callable[[str], None] = _print, longer: Sequence[StudyJob] = (),
               archived: Sequence[tuple] = (), extended: bool = False, revs: Sequence[RevisionPlan] = ()) -> None:
    """What will run (per arm: seeds to train, seeds only to measure, seeds cached or archived; a revision with a seed
    rule, its runs) and the ETA."""
    support = sum(a in SUPPORT_ARMS for a in arms)
    seeds_of = {a.name: (*seeds, *(extended_seeds(a.name) if extended else ())) for a in arms}
    total = sum(len(v) for v in seeds_of.values())
    log(f'reproduction study: {len(arms)} arms ({support} of them supporting runs) x {len(seeds)} seeds'
        + (f', and revision 3\'s extra seeds for {len(EXTENDED_SEEDS)} claims' if extended else '')
        + f' = {total} train.py runs')
    for arm in arms:
        mine = [j for j in jobs if j.arm is arm]
        train = [j.seed for j in mine if j.trains]
        measure = [j.seed for j in mine if not j.trains]
        old = sum((arm.name, seed) in archived for seed in seeds_of[arm.name] if seed not in train + measure)
        cached = len(seeds_of[arm.name]) - len(mine) - old
        log(f'  {arm.name:<20} {arm.model:<24} {arm.opt:<9} lr {arm.lr:<6g} data {arm.fraction:<5g} '
            f'{arm.epochs:>3} epochs: train {len(train)}, measure only {len(measure)}, cached {cached}'
            + (f', archived {old}' if archived else '')
            + (f' (seeds {len(seeds)}-{seeds_of[arm.name][-1]}: revision 3)' if len(seeds_of[arm.name]) > len(seeds)
               else ''))
    names = {a.name for a in arms}
    pairs = [pair for pair in EXTENDED_PAIRS if all(n in names for n in pair)]
    for pair in pairs:
        per_seed = sum(doubled(ARM_BY_NAME[n], 1).cost for n in pair) * UNIT_SECONDS / max(1, lanes) / 60
        log(f'then each seed whose {" / ".join(pair)} pair misses the convergence rule trains both again at twice '
            f'the schedule (revision 2.4; up to {MAX_DOUBLINGS} times): +{per_seed:.0f} min per seed at 2x, '
            f'+{2 * per_seed:.0f} more at 4x')
    if extended and all(n in names for n in EXTENDED_GROUP):
        log(f'and each new seed of revision 3 where a run of {" / ".join(EXTENDED_GROUP)} (the arms it trains for '
            f'that seed) misses the rule trains all of them again at twice the schedule (revision 3.1; up to '
            f'{MAX_DOUBLINGS} times)')
    if extended and all(n in names for n in LONG_PAIR):
        mine = [j for j in jobs if j.arm in LONG_ARMS]
        read_back = sum(key[0] == LONG_ARMS[0].name for key in archived)
        log(f'revision 4: {" / ".join(a.name for a in LONG_ARMS)} ({LONG_ARMS[0].epochs} epochs) at seeds '
            f'{LONG_SEEDS[0]}-{LONG_SEEDS[-1]}: train {sum(j.trains for j in mine)} runs, measure only '
            f'{sum(not j.trains for j in mine)}, read back {read_back} pairs; a run that misses the convergence rule '
            f'is named, not trained again')
    for rev in (r for r in revs if r.seed_rule):
        mine = [j for j in jobs if j.arm.name in rev.arms or j.arm.name == R5_CHECK[0].name]
        log(f'revision {rev.name}: {len(rev.arms)} arms; its check and its pilot at seeds '
            f'{rev.seeds[0]}-{rev.seeds[-1]}, then the seeds its rule gives each claim ({rev.seed_rule}): train '
            f'{sum(j.trains for j in mine)} runs now, measure only {sum(not j.trains for j in mine)}')
    if jobs:
        log(f'ETA: {_eta_minutes(jobs, lanes):.0f} min with {lanes} runs at a time on an idle 2-core machine '
            f'(a plain ViT run = {UNIT_SECONDS:.0f} s), then the report (< 2 min)')
    elif longer:
        log(f'the plan is cached; first {len(longer)} run(s) at a longer schedule (revisions 2.4 and 3.1: '
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


def _print_decisions(revs: Sequence[RevisionPlan], runs: Path, archive: Archive) -> None:
    """The seeds each claim of a revision with a seed rule gets, once its pilot is done."""
    for rev in revs:
        for d in (pilot_decisions(rev, runs, archive) if rev.seed_rule else None) or ():
            _print(f'  revision {rev.name}: {d.key:<16} {d.status:<13} {d.why}')


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python reproduction/reproduce.py', description=__doc__.splitlines()[0])
    parser.add_argument('--runs', default=None, help='folder of the train.py runs and their measurements, reused '
                        '(default: $TIMM_EXT_CACHE/reproduction-v3-runs)')
    parser.add_argument('--docs', default='docs', help='folder that receives reproduction.md and reproduction/')
    parser.add_argument('--seeds', type=int, nargs='+', default=None,
                        help='the seeds of every arm (default: 0-4, and revision 3\'s extra seeds for its claims)')
    parser.add_argument('--arms', nargs='+', default=None,
                        help='subset of the arms (default: all, the supporting runs and every revision\'s included)')
    parser.add_argument('--jobs', type=int, default=2, help='runs at a time (one thread each)')
    parser.add_argument('--timm-train', default=None, help='timm\'s train.py (or its folder)')
    parser.add_argument('--dry-run', action='store_true', help='print the plan and the ETA, run nothing')
    parser.add_argument('--report-only', action='store_true', help='regenerate the report from cached runs; '
                        'refuse if any run or measurement is missing')
    parser.add_argument('--archive', default=None, help='an earlier report\'s measurements.json whose runs are read '
                        'back instead of trained again (default: DOCS/reproduction/measurements.json if it exists)')
    parser.add_argument('--keep-runs', action='store_true', help='copy the finished, failed and stopped runs of --runs '
                        'that the archive lacks into it (keep_runs.py), train nothing and write no report: a study '
                        'on a machine that will not keep its cache')
    parser.add_argument('--no-archive', action='store_true', help='read no earlier report: train every run that is '
                        'not in --runs')
    parser.add_argument('--revision', default=PLANS[-1].name, choices=[p.name for p in PLANS],
                        help='the study as of this revision of the plan: its work and every earlier one\'s, and its '
                        'report (default: the last, %(default)s)')
    args = parser.parse_args(argv)
    known = {a.name for a in ALL_ARMS} | {n for rev in PLANS for n in rev.arms}
    unknown = [a for a in args.arms or () if a not in known]
    if unknown:
        parser.error(f'unknown arm {unknown[0]!r}: choose from {", ".join(sorted(known))}')
    if args.jobs < 1:
        parser.error(f'--jobs must be at least 1, got {args.jobs}')
    arms = [a for a in ALL_ARMS if args.arms is None or a.name in args.arms]
    extended = args.seeds is None
    seeds = list(SEEDS) if extended else args.seeds
    from timm_ext.data import default_cache_dir

    runs = Path(args.runs).expanduser() if args.runs else default_cache_dir() / 'reproduction-v3-runs'
    archive: Archive = {}
    archive_path = Path(args.archive) if args.archive else Path(args.docs) / 'reproduction' / 'measurements.json'
    kept = kept_path(archive_path)  # runs kept while the study trains (--keep-runs), read as archived ones
    # the runs kept of a revision after --revision belong to a later study: a report of an earlier one leaves them out
    later = {a for rev in PLANS[[p.name for p in PLANS].index(args.revision) + 1:] for a in revision_arms(rev)}
    if not args.no_archive and (args.archive or archive_path.is_file() or kept.is_file()):
        try:
            archive.update(load_archive(archive_path))
            archive.update({k: m for k, m in (load_archive(kept) if kept.is_file() else {}).items()
                            if k[0] not in later})
        except ValueError as e:
            parser.error(str(e))
    if args.keep_runs:
        from supporting_runs import ALL_ARMS_BY_NAME

        done = keep_runs(runs, archive_path, ALL_ARMS_BY_NAME)
        for what, names in done.items():
            _print(f'{what.replace("_", " ")}: {len(names)}' + (f' ({", ".join(names)})' if names else ''))
        _print(f'kept in: {kept_path(archive_path)}')
        return 0
    start = time.perf_counter()
    load_before = os.getloadavg()[1]
    # the first revision's frame (every chosen arm at the seeds), then every later revision's work from its data
    # (--seeds: the frame at those seeds only, and the rules that train a seed's group again)
    upto = PLANS[:[p.name for p in PLANS].index(args.revision) + 1]
    revs = upto if extended else tuple(rev for rev in upto if rev.regroup)
    only = None if args.arms is None else set(args.arms)
    jobs = study_jobs(revs if extended else (), runs, arms, seeds, args.timm_train, archive, only)
    # revisions 2.4 and 3.1 extend a seed's group at any seed the study trains (3.1's groups: the new seeds only)
    every_seed = sorted({*seeds, *(s for a in arms for s in (extended_seeds(a.name) if extended else ()))})
    names = [a.name for a in arms]
    jobs_after = [] if jobs else regroup_jobs(revs, runs, names, every_seed, args.timm_train)
    print_plan(jobs, arms, seeds, args.jobs, longer=jobs_after, archived=[*archive, *long_archive(archive)],
               extended=extended, revs=revs if args.arms is None else ())
    if args.dry_run:
        return 0
    if (jobs or jobs_after) and args.report_only:
        first = (jobs or jobs_after)[0]
        parser.error(f'--report-only: {len(jobs or jobs_after)} run(s) are not trained or measured in {runs} '
                     f'(first: {first.key}); run without --report-only to train them')
    to_train = sum(1 for j in jobs if j.trains)
    run_jobs(jobs, runs, args.jobs)
    for _ in range(MAX_DOUBLINGS):  # revisions 2.4 and 3.1: seed by seed, until every run of a seed's group converges
        more = regroup_jobs(revs, runs, names, every_seed, args.timm_train)
        if not more:
            break
        _print(f'{len(more)} run(s) at twice the schedule, where a run of a seed\'s group missed the convergence rule: '
               f'{", ".join(j.key for j in more)}; ETA {_eta_minutes(more, args.jobs):.0f} min')
        to_train += sum(1 for j in more if j.trains)
        run_jobs(more, runs, args.jobs)
    for _ in range(len(revs)):  # a revision with a seed rule (5): the seeds its rule gives, once its pilot is done
        more = study_jobs(revs if extended else (), runs, arms, seeds, args.timm_train, archive, only)
        if not more:
            break
        _print_decisions(revs, runs, archive)
        _print(f'{len(more)} run(s) the seed rule gives: {", ".join(j.key for j in more[:6])}'
               f'{" ..." if len(more) > 6 else ""}; ETA {_eta_minutes(more, args.jobs):.0f} min')
        to_train += sum(1 for j in more if j.trains)
        run_jobs(more, runs, args.jobs)
    from report import write_report

    command = 'python reproduction/reproduce.py ' + ' '.join(_public_argv(list(argv if argv is not None
                                                                                else sys.argv[1:])))
    earlier = load_earlier_runs(archive_path) if archive else {}  # withdrawn arms' runs: kept, read by no claim
    records = _records([p for p in (archive_path, kept) if archive and p.is_file()], later)  # failed, stopped runs
    path = write_report(runs, arms, seeds, Path(args.docs), command.strip(), wall_s=time.perf_counter() - start,
                        trained=to_train, load=(load_before, os.getloadavg()[1]), archive=archive,
                        extended=extended, earlier=earlier, revision=args.revision, earlier_records=records)
    print(f'report: {path} ({time.perf_counter() - start:.0f} s in all)')
    if Path(args.docs) / 'reproduction' / 'measurements.json' == archive_path and all_reported(archive_path):
        kept.unlink()  # everything kept while the study trained is in the report's measurements.json now
        print(f'removed {kept}: every run and record in it is in {archive_path}')
    return 0


def _records(paths: Sequence[Path], later: AbstractSet[str] = frozenset()) -> dict:
    """The failed and stopped runs the archive and the runs kept beside it recorded, each once, but those of the
    arms in ``later`` (a later revision's)."""
    from report import FAILED_KEY, STOPPED_KEY

    def ours(run: str) -> bool:
        return run.rpartition('-s')[0] not in later

    failed: dict = {}
    stopped: list = []
    for path in paths:
        saved = json.loads(path.read_text())
        failed.update({run: why for run, why in saved.get(FAILED_KEY, {}).items() if ours(run)})
        stopped = unique_stops([*stopped, *(x for x in saved.get(STOPPED_KEY, []) if ours(x['run']))])
    return {**({FAILED_KEY: failed} if failed else {}), **({STOPPED_KEY: stopped} if stopped else {})}


if __name__ == '__main__':
    raise SystemExit(main())
