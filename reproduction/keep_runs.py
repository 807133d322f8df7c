"""A study's runs kept where a new machine finds them, while it still trains.

The cache (``--runs``) lives on the machine that trains; a machine that does not keep it (a new session's) loses
every run not yet in a report. ``reproduce.py --keep-runs`` copies every finished run of the cache that the archive
lacks, the failed runs' records and the stopped runs' records into ``KEPT_FILE`` beside the archive (the
``measurements.json`` the repository keeps, which only a report writes), and trains nothing. The study reads that
file back with the archive instead of training its runs again (:func:`study_jobs.plan_jobs`); the next report puts
them in measurements.json, and the file goes once everything in it is there (:func:`all_reported`). A run folder that is
recorded as stopped, unless a file in it or its job's log beside it was written in the last ``IN_FLIGHT_S`` seconds:
that run is still training or being measured (both write their logs every few seconds), and is named, not recorded.
Stop the study first (Ctrl-C) to have its unfinished runs recorded.
"""
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping

from plan import CPU_FILE, Arm
from report import FAILED_KEY, STOPPED_KEY, machine_neutral
from run_results import load_run
from study_jobs import FAILED_FILE, measured, stop_key, stopped_runs, trained

from timm_ext.demo.runner import read_summary

__all__ = ['IN_FLIGHT_S', 'KEPT_FILE', 'all_reported', 'keep_runs', 'kept_path']

KEPT_FILE = 'runs_in_progress.json'  # beside the archive: runs kept while the study trains

IN_FLIGHT_S = 120.0  # a run folder written this recently is a run still training (an epoch here takes seconds)


def _last_written(folder: Path) -> float:
    log = folder.with_name(folder.name + '.log')  # the job's log (study_jobs.run_jobs)
    files = [folder, *(f for f in folder.rglob('*') if f.is_file()), *([log] if log.is_file() else [])]
    return max(f.stat().st_mtime for f in files)


def kept_path(archive_path: Path) -> Path:
    return archive_path.with_name(KEPT_FILE)


def _saved(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else dict(runs={})


def keep_runs(runs: Path, archive_path: Path, arms: Mapping[str, Arm], now: float = 0.0) -> Dict[str, List[str]]:
    """Copy the runs of ``arms`` (by name) in ``runs`` (folders ``<arm>-s<seed>``) that the archive at
    ``archive_path`` lacks into its ``KEPT_FILE`` (written whole: a tmp file, then replaced); returns the run names by
    what was done: ``kept``, ``failed``, ``stopped`` (recorded) and ``in_flight`` (left alone). Nothing already kept
    is replaced or removed; the archive itself is only read."""
    archived, path = _saved(archive_path), kept_path(archive_path)
    saved = _saved(path)
    have = {(arm, int(m['seed'])) for s in (archived, saved) for arm, ms in s['runs'].items() for m in ms}
    failed: Dict[str, Any] = saved.get(FAILED_KEY, {})
    stopped: List[Dict[str, Any]] = saved.get(STOPPED_KEY, [])
    done: Dict[str, List[str]] = dict(kept=[], failed=[], stopped=[], in_flight=[])
    now = now or time.time()
    for folder in sorted(runs.iterdir()) if runs.is_dir() else ():
        name, _, seed_text = folder.name.rpartition('-s')
        arm = arms.get(name)
        if arm is None or not seed_text.isdigit() or not folder.is_dir():
            continue
        seed = int(seed_text)
        if (name, seed) in have or folder.name in failed or folder.name in archived.get(FAILED_KEY, {}):
            continue
        if (folder / FAILED_FILE).is_file():
            failed[folder.name] = json.loads((folder / FAILED_FILE).read_text())
            done['failed'].append(folder.name)
        elif trained(folder, arm.epochs) and measured(folder) and (folder / CPU_FILE).is_file():
            saved['runs'].setdefault(arm.name, []).append(machine_neutral({arm.name: [load_run(folder)]})[
                arm.name][0])
            saved['runs'][arm.name].sort(key=lambda m: int(m['seed']))
            done['kept'].append(folder.name)
        elif now - _last_written(folder) < IN_FLIGHT_S:
            done['in_flight'].append(folder.name)
        elif not any(x['run'] == folder.name and x.get('kept') for x in stopped):
            summary = folder / 'summary.csv'
            epochs = len(read_summary(summary)) if summary.is_file() else 0
            stopped.append(dict(run=folder.name, epochs=epochs, kept=True, last_written=time.strftime(
                '%Y-%m-%d %H:%M:%S', time.gmtime(_last_written(folder))),
                why='stopped: the study stopped while it trained (its machine\'s session ended); trained again'))
            done['stopped'].append(folder.name)
    known = {stop_key(x) for x in (*stopped, *archived.get(STOPPED_KEY, []))}
    stopped += [x for x in stopped_runs(runs) if stop_key(x) not in known]
    if failed:
        saved[FAILED_KEY] = failed
    if stopped:
        saved[STOPPED_KEY] = stopped
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(json.dumps(saved))
    tmp.replace(path)
    return done


def all_reported(archive_path: Path) -> bool:
    """Every run and record of the archive's ``KEPT_FILE`` is in the archive (a report has put it there): the file
    may go. False while it holds anything the archive lacks, or when there is no such file."""
    path = kept_path(archive_path)
    if not path.is_file():
        return False
    archived, saved = _saved(archive_path), _saved(path)
    runs = {(arm, m['run']) for arm, ms in archived['runs'].items() for m in ms}
    stopped = {stop_key(x) for x in archived.get(STOPPED_KEY, [])}
    return (all((arm, m['run']) in runs for arm, ms in saved['runs'].items() for m in ms)
            and set(saved.get(FAILED_KEY, {})) <= set(archived.get(FAILED_KEY, {}))
            and all(stop_key(x) in stopped for x in saved.get(STOPPED_KEY, [])))
