"""Wall time of ``timm-ext demo --quick`` and of the full demo, run as a user runs them, with top-1 per run.

Each demo runs through the command line (``timm-ext`` on PATH, else ``python -m timm_ext``) into a
fresh temporary output folder; its wall time counts everything the user waits for: the CLI's
start-up, every train.py run (start-up and evaluation included), the table and the plot. The data
cache is warm (written once before timing, as after a user's first demo); ``--cold`` also times
each demo with an empty data cache. The 1- and 5-minute load averages are printed before and after
each demo, and the CPU time of the CLI and all its train.py runs (which a busy machine inflates
less than the wall time): on a busy machine the times are inflated (targets: ``--quick`` <= 40 s, full <= 180 s on
2 idle cores; docs/demo.md).

    python benchmarks/bench_demo.py [--timm-train PATH] [--only quick|full] [--cold]
"""
import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from timm_ext.machine import cpu_name

TARGETS_S = {'quick': 40.0, 'full': 180.0}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f'{one:.2f} / {five:.2f}'


def cli() -> List[str]:
    found = shutil.which('timm-ext')
    return [found] if found else [sys.executable, '-m', 'timm_ext']


def run_demo(kind: str, data_root: Path, timm_train: Optional[str]) -> Dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f'bench_demo_{kind}_') as tmp:
        out = Path(tmp) / 'out'
        argv = cli() + ['demo', '--output', str(out), '--no-progress', '--data-root', str(data_root)]
        argv += ['--quick'] if kind == 'quick' else []
        argv += ['--timm-train', timm_train] if timm_train else []
        before, cpu = load(), resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after, cpu_after = load(), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f'bench_demo: {" ".join(argv)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}')
        summary = json.loads((out / 'summary.json').read_text())
    return dict(kind=kind, wall=wall, cpu_s=cpu_s, before=before, after=after, summary=summary)


def report(result: Dict[str, object], cache: str) -> None:
    summary = result['summary']
    kind, wall = result['kind'], result['wall']
    target = TARGETS_S[kind]
    print(f'\n## {kind} demo ({cache} data cache): {wall:.1f} s wall (target <= {target:.0f} s on 2 idle cores), '
          f'load average 1/5 min {result["before"]} before, {result["after"]} after')
    print(f'{summary["epochs"]} epochs, {summary["jobs"]} runs at a time, {summary["threads_per_run"]} thread(s) '
          f'each; the demo itself reported {summary["wall_s"]:.1f} s from the first train.py start to the last exit; '
          f'CPU time (user + sys) of the CLI and its train.py runs: {result["cpu_s"]:.1f} s')
    print('| run | top-1 (last) | top-1 (best) | run wall time | run CPU time |')
    print('|---|---|---|---|---|')
    for run in summary['runs']:
        cpu = f'{run["cpu_s"]:.1f} s' if run.get('cpu_s') is not None else 'n/a'
        print(f'| {run["label"]} | {run["top1"]:.1f} % | {run["best_top1"]:.1f} % | {run["wall_s"]:.1f} s | {cpu} |')
    for line in summary['contributions']:
        print(f'- {line}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--timm-train', default=os.environ.get('TIMM_EXT_TIMM_TRAIN'),
                        help='timm\'s train.py (default $TIMM_EXT_TIMM_TRAIN, else the one timm-ext finds)')
    parser.add_argument('--only', choices=('quick', 'full'), default=None, help='time one demo only')
    parser.add_argument('--cold', action='store_true', help='also time each demo with an empty data cache')
    args = parser.parse_args()

    import timm
    import torch

    from timm_ext.data import default_cache_dir, digits_image_folder
    from timm_ext.demo import IMAGE_SIZE
    print(f'CPU: {cpu_name()}, {len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}'
          f' cores usable; Python {platform.python_version()}, torch {torch.__version__}, timm {timm.__version__}; '
          f'{time.strftime("%Y-%m-%d %H:%M")}')
    warm_root = default_cache_dir() / 'data'
    digits_image_folder(warm_root, size=IMAGE_SIZE)  # the warm cache: written once, untimed
    for kind in ('quick', 'full') if args.only is None else (args.only,):
        report(run_demo(kind, warm_root, args.timm_train), 'warm')
        if args.cold:
            with tempfile.TemporaryDirectory(prefix='bench_demo_data_') as cold_root:
                report(run_demo(kind, Path(cold_root), args.timm_train), 'cold')


if __name__ == '__main__':
    main()
