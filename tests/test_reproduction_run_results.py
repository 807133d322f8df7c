"""reproduction/run_results.py: runs read from the cache, or back from an earlier report's measurements.json."""
import json
import os

import pytest
from _reproduction import fake_run, fake_runs, plan, run_results, write_run


def _archive(tmp_path, seeds=(0, 1)):
    runs = {name: [dict(fake_run(plan.ARM_BY_NAME[name], s), top1=50.0 + s, run=f'{name}-s{s}') for s in seeds]
            for name in ('vit', 'vit_sam')}
    path = tmp_path / 'measurements.json'
    path.write_text(json.dumps(dict(seeds=list(seeds), runs=runs)))
    return path


def test_archived_runs_are_read_back_and_the_cache_wins(tmp_path):
    archive = run_results.load_archive(_archive(tmp_path))
    assert sorted(archive) == [('vit', 0), ('vit', 1), ('vit_sam', 0), ('vit_sam', 1)]
    runs = tmp_path / 'runs'
    write_run(runs, plan.ARM_BY_NAME['vit'], 1)  # trained again here: the cache's run is read
    arms = [plan.ARM_BY_NAME['vit'], plan.ARM_BY_NAME['vit_sam']]
    r = run_results.load_results(runs, arms, [0, 1], archive)
    assert [m['top1'] for m in r['vit']] == [50.0, 91.0] and [m['top1'] for m in r['vit_sam']] == [50.0, 51.0]
    # an arm may have seeds of its own (revision 3); a seed in neither place is an error, never skipped
    write_run(runs, plan.ARM_BY_NAME['vit'], 2)
    r = run_results.load_results(runs, arms[:1], [0], archive, seeds_of={'vit': (0, 1, 2)})
    assert [m['seed'] for m in r['vit']] == [0, 1, 2]
    with pytest.raises(FileNotFoundError):
        run_results.load_results(runs, arms, [0, 3], archive)


def _times(run, start, trained, measured, measure_wall_s=30.0):
    """The run's files dated: train.py began at ``start``, its last epoch at ``trained``, measured at ``measured``."""
    m = json.loads((run / plan.MEASURE_FILE).read_text())
    (run / plan.MEASURE_FILE).write_text(json.dumps(dict(m, measure_wall_s=measure_wall_s, measure_cpu_s=29.0)))
    for name, t in (('args.yaml', start), ('summary.csv', trained), (plan.MEASURE_FILE, measured)):
        os.utime(run / name, (t, t))


def test_timing_is_wall_clock_from_the_files_and_cpu_time_only_from_the_cpu_file(tmp_path):
    runs = fake_runs(tmp_path / 'runs', seeds=(0,))
    arms = [plan.ARM_BY_NAME['vit'], plan.ARM_BY_NAME['vit_sam']]
    _times(runs / 'vit-s0', 1000.0, 1600.0, 1640.0)
    _times(runs / 'vit_sam-s0', 1010.0, 1700.0, 1740.0)
    r = run_results.load_results(runs, arms, [0])
    # training 600 s from args.yaml to summary.csv, and the measurement's own 30 s; no CPU file: no CPU time
    assert r['vit'][0]['timing'] == dict(start=1000.0, end=1640.0, wall_s=630.0)
    total = run_results.timing_of(r['vit'] + r['vit_sam'])
    assert total == dict(runs=2, wall_min=(630.0 + 720.0) / 60, first=1000.0, last=1740.0, cpu_runs=0, cpu_min=None,
                         at_once=2)
    # the CPU time run_jobs recorded (training and measuring, user + system), with the lanes and cores beside it
    (runs / 'vit-s0' / plan.CPU_FILE).write_text(json.dumps(dict(cpu_s=1234.5, lanes=2, cores=4)))
    (runs / 'vit_sam-s0' / plan.CPU_FILE).write_text(json.dumps(dict(cpu_s=None, lanes=2, cores=4)))  # none known
    r = run_results.load_results(runs, arms, [0])
    assert r['vit'][0]['timing'] == dict(start=1000.0, end=1640.0, wall_s=630.0, cpu_s=1234.5, lanes=2, cores=4)
    assert r['vit_sam'][0]['timing'] == dict(start=1010.0, end=1740.0, wall_s=720.0)
    total = run_results.timing_of(r['vit'] + r['vit_sam'])
    assert total['cpu_runs'] == 1 and total['cpu_min'] == 1234.5 / 60 and total['runs'] == 2
    assert run_results.timing_of([{'seed': 0}]) is None  # v3's runs recorded no times


def test_at_once_is_the_most_runs_running_at_one_moment():
    def at_once(*spans):
        return run_results.timing_of([dict(run=f'r{i}', timing=dict(start=a, end=b, wall_s=b - a))
                                      for i, (a, b) in enumerate(spans)])['at_once']

    assert at_once((0.0, 60.0), (100.0, 160.0), (200.0, 230.0)) == 1  # one after another
    assert at_once((0.0, 60.0), (60.0, 120.0)) == 1  # a lane's next run starts as its last one ends
    assert at_once((0.0, 100.0), (10.0, 50.0), (40.0, 120.0), (110.0, 130.0)) == 3  # 0-100, 10-50 and 40-120 at 45
    assert at_once((0.0, 100.0), (10.0, 20.0), (30.0, 40.0), (50.0, 60.0)) == 2


def test_an_earlier_reports_cpu_s_is_read_as_the_wall_clock_it_was(tmp_path):
    old = dict(start=0.0, end=60.0, cpu_s=50.0)  # a report before issue 57: file times + measure_wall_s
    new = dict(start=100.0, end=200.0, wall_s=90.0, cpu_s=170.0, lanes=2, cores=4)
    vit = plan.ARM_BY_NAME['vit']
    runs = dict(vit=[dict(fake_run(vit, 0), run='vit_x2-s0', timing=dict(old, start=70.0, end=130.0),
                          replaced=[dict(fake_run(vit, 0), run='vit-s0', timing=dict(old))]),
                     dict(fake_run(vit, 1), run='vit-s1', timing=dict(new)),
                     dict(fake_run(vit, 2), run='vit-s2')])  # v3: no timing
    path = tmp_path / 'measurements.json'
    path.write_text(json.dumps(dict(seeds=[0, 1, 2], runs=runs)))
    archive = run_results.load_archive(path)
    assert archive['vit', 0]['timing'] == dict(start=70.0, end=130.0, wall_s=50.0)
    assert archive['vit', 0]['replaced'][0]['timing'] == dict(start=0.0, end=60.0, wall_s=50.0)
    assert archive['vit', 1]['timing'] == new and 'timing' not in archive['vit', 2]
    total = run_results.timing_of(list(archive.values()))
    assert total['runs'] == 3 and total['wall_min'] == (50.0 + 50.0 + 90.0) / 60
    assert total['cpu_runs'] == 1 and total['cpu_min'] == 170.0 / 60


def test_an_unreadable_archive_is_one_line(tmp_path):
    bad = tmp_path / 'measurements.json'
    bad.write_text('{"seeds": [0]}')
    with pytest.raises(ValueError, match=r'cannot read the archived runs in .*measurements.json \(KeyError: '
                                         r"'runs'\): give the measurements.json a report wrote, or --no-archive"):
        run_results.load_archive(bad)


def test_every_run_counts_once_and_revision_3_1s_runs_are_revision_4s_where_the_same():
    first = dict(run='vit-s6', seed=6, timing=dict(start=0.0, end=60.0, wall_s=60.0))
    again = dict(run='vit_x2-s6', seed=6, timing=dict(start=100.0, end=220.0, wall_s=120.0), replaced=[first])
    # revision 4 reads revision 3.1's run of seed 6 under its own arm: the same folder, counted once
    runs = run_results.unique_runs([again, dict(again), {k: v for k, v in again.items() if k != 'replaced'}])
    assert [m['run'] for m in runs] == ['vit-s6', 'vit_x2-s6'] and all('replaced' not in m for m in runs)
    assert run_results.timing_of([again, dict(again)])['wall_min'] == 3.0  # 1 + 2 minutes, not 1 + 2 + 1 + 2
    archive = {('vit', 6): again, ('vit_sam', 6): dict(again, run='vit_sam_x2-s6'), ('vit', 7): dict(run='vit-s7'),
               ('vit', 12): dict(run='vit-s12', seed=12)}  # seed 12 never trained again: nothing to reuse
    long = run_results.long_archive(archive)
    assert set(long) == {('vit_x2', 6), ('vit_sam_x2', 6)} and 'replaced' not in long['vit_x2', 6]
    assert long['vit_x2', 6]['run'] == 'vit_x2-s6'
    # a report that holds revision 4's runs gives them back as they are
    assert run_results.long_archive({('vit_x2', 3): dict(run='vit_x2-s3')}) == {('vit_x2', 3): dict(run='vit_x2-s3')}
