"""The study's cached runs, read back: every run's measurements and train.py settings, and when they were made.

A run's measurements are ``timm_ext_measurements.json`` in its folder (``measure_run.py``), its CPU time
``timm_ext_cpu.json`` (``study_jobs.run_jobs``, from issue 57 on); revision 2.4's
longer schedules of the lr sweep's pair are read through :func:`longer_schedules.tried`, the runs they
replace kept under ``replaced``. A run that is not in the cache is read back from an archive, the
``measurements.json`` of an earlier report (revision 3 reuses seeds 0-4 that way instead of training them again).
"""
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml
from longer_schedules import LONG_ARMS, tried
from plan import CPU_FILE, LONG_PAIR, LONG_REUSED, MEASURE_FILE, Arm

# every run's measurements, by arm, in seed order
Results = Dict[str, List[Dict[str, Any]]]
# an earlier report's runs, by (arm, seed)
Archive = Dict[Tuple[str, int], Dict[str, Any]]


def load_archive(path: Path) -> Archive:
    """The runs of an earlier report's ``measurements.json``, by (arm, seed), each as that report saved it but for
    the old timings' ``cpu_s``, read as the ``wall_s`` it was (:func:`_wall_clock`)."""
    try:
        saved = json.loads(Path(path).read_text())
        archive = {(arm, int(m['seed'])): m for arm, runs in saved['runs'].items() for m in runs}
        for m in archive.values():
            for x in (m, *m.get('replaced', [])):
                _wall_clock(x)
        return archive
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f'cannot read the archived runs in {path} ({type(e).__name__}: {e}): give the '
                         f'measurements.json a report wrote, or --no-archive to train every run') from None


def _wall_clock(m: Dict[str, Any]) -> None:
    # before issue 57 a timing's cpu_s was wall-clock (file times + measure_wall_s), not CPU time: a timing
    # without wall_s is one of those, and its cpu_s is renamed to what it measured
    t = m.get('timing')
    if t and 'cpu_s' in t and 'wall_s' not in t:
        t['wall_s'] = t.pop('cpu_s')


def long_archive(archive: Archive) -> Archive:
    """Revision 4's runs in an earlier report: its own (``vit_x2``, ``vit_sam_x2``), else, at ``LONG_REUSED``,
    revision 3.1's runs of the same settings, which that report keeps as the final runs of ``vit`` and ``vit_sam``."""
    out: Archive = {}
    for name, arm in zip(LONG_PAIR, LONG_ARMS):
        out.update({key: m for key, m in archive.items() if key[0] == arm.name})
        for seed in LONG_REUSED:
            m = archive.get((name, seed))
            if (arm.name, seed) not in out and m is not None and m.get('run') == f'{arm.name}-s{seed}':
                out[arm.name, seed] = {k: v for k, v in m.items() if k != 'replaced'}
    return out


def in_cache(runs: Path, arm: str, seed: int) -> bool:
    """The run (its final schedule, for revision 2.4's pair) is measured in the cache folder ``runs``."""
    return (tried(runs, arm, seed)[-1] / MEASURE_FILE).is_file()


def load_results(runs: Path, arms: Sequence[Arm], seeds: Sequence[int], archive: Optional[Archive] = None,
                 seeds_of: Optional[Dict[str, Sequence[int]]] = None) -> Results:
    """Every run's measurements (and its train.py settings from ``args.yaml``), by arm, in seed order: from the
    cache, else from ``archive``. ``seeds_of`` gives an arm seeds of its own (revision 3's extended arms)."""
    out: Results = {}
    for arm in arms:
        for seed in (seeds_of or {}).get(arm.name, seeds):
            if archive is not None and (arm.name, seed) in archive and not in_cache(runs, arm.name, seed):
                out.setdefault(arm.name, []).append(dict(archive[arm.name, seed]))
                continue
            runs_tried = [load_run(d) for d in tried(runs, arm.name, seed)]  # revision 2.4: the shorter ones too
            m = runs_tried[-1]
            if len(runs_tried) > 1:
                m['replaced'] = runs_tried[:-1]
            out.setdefault(arm.name, []).append(m)
    return out


def load_run(run_dir: Path) -> Dict[str, Any]:
    m = json.loads((run_dir / MEASURE_FILE).read_text())
    m['run'] = run_dir.name
    timing = run_timing(run_dir)
    if timing:
        m['timing'] = timing
    args_file = run_dir / 'args.yaml'
    if args_file.is_file():
        m['train_args'] = yaml.safe_load(args_file.read_text())
    return m


def run_timing(run_dir: Path) -> Optional[Dict[str, Any]]:
    """When a cached run was made, from its files: ``start`` (train.py's ``args.yaml``), ``end`` (the measurement)
    and ``wall_s``, its wall-clock: training (``args.yaml`` to the last ``summary.csv`` row) plus measuring (the
    measurement's own clock; the measuring process's start-up not counted). Wall-clock is not CPU time where lanes
    share the cores, so ``cpu_s`` (with the ``lanes`` and ``cores`` it ran on) comes from ``CPU_FILE`` alone, where
    ``run_jobs`` wrote one with a CPU time. None without the first three files."""
    files = [run_dir / name for name in ('args.yaml', 'summary.csv', MEASURE_FILE)]
    if not all(f.is_file() for f in files):
        return None
    start, trained, end = (f.stat().st_mtime for f in files)
    measure = float(json.loads(files[2].read_text()).get('measure_wall_s', 0.0))
    out: Dict[str, Any] = dict(start=start, end=end, wall_s=max(0.0, trained - start) + measure)
    cpu_file = run_dir / CPU_FILE
    if cpu_file.is_file():
        cpu = json.loads(cpu_file.read_text())
        if cpu.get('cpu_s') is not None:
            out.update(cpu_s=float(cpu['cpu_s']), lanes=cpu.get('lanes'), cores=cpu.get('cores'))
    return out


def unique_runs(ms: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every run of ``ms`` once: each with the runs it replaced, a run read under two arms counted once (revision
    4's reused runs are revision 3.1's: the same ``run`` folder)."""
    out, seen = [], set()
    for m in ms:
        for x in (*m.get('replaced', []), m):
            key = x.get('run') or (x.get('arm'), x.get('seed'), x.get('epochs'))
            if key not in seen:
                seen.add(key)
                out.append({k: v for k, v in x.items() if k != 'replaced'})
    return out


def timing_of(ms: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The runs' time from each run's ``timing``, every run once (:func:`unique_runs`): ``runs`` timed, their
    wall-clock (``wall_min``, summed) and span (``first`` to ``last``); their CPU time (``cpu_min``, None where
    none recorded it) over the ``cpu_runs`` that did, as only runs from issue 57 on record one; and ``at_once``,
    the most runs that ran at the same moment, as wall-clock summed over runs sharing the cores is not the work
    done. Runs without a timing (read back from a report that did not record it) are not counted; None if none."""
    times = [t for x in unique_runs(ms) for t in [x.get('timing')] if t]
    if not times:
        return None
    cpu = [t['cpu_s'] for t in times if t.get('cpu_s') is not None]
    return dict(runs=len(times), wall_min=sum(t['wall_s'] for t in times) / 60, first=min(t['start'] for t in times),
                last=max(t['end'] for t in times), cpu_runs=len(cpu), cpu_min=sum(cpu) / 60 if cpu else None,
                at_once=most_at_once([(t['start'], t['end']) for t in times]))


def most_at_once(spans: Sequence[Tuple[float, float]]) -> int:
    """The most ``(start, end)`` spans that overlap at one moment; one that ends as another starts does not overlap
    it (a lane's next run starts when its last one ends)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])  # ends first at a tie
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def first_schedules(r: Results) -> Results:
    """Every run at the first schedule it was trained at (the run a longer schedule replaced, where one did): the
    study as read before revisions 2.4 and 3.1 trained seeds again."""
    return {arm: [m.get('replaced', [m])[0] for m in ms] for arm, ms in r.items()}


def longer_runs(ms: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The runs of ``ms``'s seeds at a schedule longer than the seed's first (what revisions 2.4 and 3.1 trained),
    each on its own, without the runs it replaced."""
    return [{k: v for k, v in x.items() if k != 'replaced'} for m in ms if 'replaced' in m
            for x in (*m['replaced'][1:], m)]
