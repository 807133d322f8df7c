"""The study's cached runs, read back: every run's measurements and train.py settings, and when they were made.

A run's measurements are ``timm_ext_measurements.json`` in its folder (``measure_run.py``); revision 2.4's
longer schedules of the lr sweep's pair are read through :func:`longer_schedules.tried`, the runs they
replace kept under ``replaced``.
"""
import json
from pathlib import Path
from typing import Any, Dict, List, Sequence

import yaml
from longer_schedules import tried
from plan import MEASURE_FILE, Arm

# every run's measurements, by arm, in seed order
Results = Dict[str, List[Dict[str, Any]]]


def load_results(runs: Path, arms: Sequence[Arm], seeds: Sequence[int]) -> Results:
    """Every run's measurements (and its train.py settings from ``args.yaml``), by arm, in seed order."""
    out: Results = {}
    for arm in arms:
        for seed in seeds:
            runs_tried = [_load_run(d) for d in tried(runs, arm.name, seed)]  # revision 2.4: the shorter ones too
            m = runs_tried[-1]
            if len(runs_tried) > 1:
                m['replaced'] = runs_tried[:-1]
            out.setdefault(arm.name, []).append(m)
    return out


def _load_run(run_dir: Path) -> Dict[str, Any]:
    m = json.loads((run_dir / MEASURE_FILE).read_text())
    m['run'] = run_dir.name
    args_file = run_dir / 'args.yaml'
    if args_file.is_file():
        m['train_args'] = yaml.safe_load(args_file.read_text())
    return m


def study_timing(runs: Path, arms: Sequence[Arm], seeds: Sequence[int]) -> Dict[str, float]:
    """When the cached runs were made, from their files: the first run's start (train.py's ``args.yaml``) to the last
    measurement, and the sum over runs of training (``args.yaml`` to the last ``summary.csv`` row) and measuring
    (the measurement's own clock), one core each. A cache filled by several studies (cached runs reused, runs
    measured again) spans all of them, so the report states the span, not a study's duration."""
    starts, ends, busy = [], [], 0.0
    for d in (d for arm in arms for seed in seeds for d in tried(runs, arm.name, seed)):
        start = (d / 'args.yaml').stat().st_mtime
        starts.append(start)
        ends.append((d / MEASURE_FILE).stat().st_mtime)
        busy += max(0.0, (d / 'summary.csv').stat().st_mtime - start)
        busy += float(json.loads((d / MEASURE_FILE).read_text()).get('measure_wall_s', 0.0))
    return dict(wall_min=(max(ends) - min(starts)) / 60, run_min=busy / 60, runs=len(starts), first=min(starts),
                last=max(ends))
