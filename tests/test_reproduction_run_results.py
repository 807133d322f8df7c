"""reproduction/run_results.py: runs read from the cache, or back from an earlier report's measurements.json."""
import json

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


def test_timing_is_each_cached_runs_own_and_archived_runs_keep_theirs(tmp_path):
    runs = fake_runs(tmp_path / 'runs', seeds=(0,))
    arms = [plan.ARM_BY_NAME['vit'], plan.ARM_BY_NAME['vit_sam']]
    r = run_results.load_results(runs, arms, [0])
    t = r['vit'][0]['timing']
    assert t['start'] == (runs / 'vit-s0' / 'args.yaml').stat().st_mtime and t['cpu_s'] >= 0
    total = run_results.timing_of(r['vit'] + r['vit_sam'])
    assert total['runs'] == 2 and total['first'] <= total['last']
    archived = dict(r['vit'][0], timing=dict(start=0.0, end=60.0, cpu_s=120.0))  # as a report saved it
    assert run_results.timing_of([archived])['run_min'] == 2.0
    assert run_results.timing_of([{'seed': 0}]) is None  # v3's runs recorded no times


def test_an_unreadable_archive_is_one_line(tmp_path):
    bad = tmp_path / 'measurements.json'
    bad.write_text('{"seeds": [0]}')
    with pytest.raises(ValueError, match=r'cannot read the archived runs in .*measurements.json \(KeyError: '
                                         r"'runs'\): give the measurements.json a report wrote, or --no-archive"):
        run_results.load_archive(bad)


def test_every_run_counts_once_and_revision_3_1s_runs_are_revision_4s_where_the_same():
    first = dict(run='vit-s6', seed=6, timing=dict(start=0.0, end=60.0, cpu_s=60.0))
    again = dict(run='vit_x2-s6', seed=6, timing=dict(start=100.0, end=220.0, cpu_s=120.0), replaced=[first])
    # revision 4 reads revision 3.1's run of seed 6 under its own arm: the same folder, counted once
    runs = run_results.unique_runs([again, dict(again), {k: v for k, v in again.items() if k != 'replaced'}])
    assert [m['run'] for m in runs] == ['vit-s6', 'vit_x2-s6'] and all('replaced' not in m for m in runs)
    assert run_results.timing_of([again, dict(again)])['run_min'] == 3.0  # 1 + 2 minutes, not 1 + 2 + 1 + 2
    archive = {('vit', 6): again, ('vit_sam', 6): dict(again, run='vit_sam_x2-s6'), ('vit', 7): dict(run='vit-s7'),
               ('vit', 12): dict(run='vit-s12', seed=12)}  # seed 12 never trained again: nothing to reuse
    long = run_results.long_archive(archive)
    assert set(long) == {('vit_x2', 6), ('vit_sam_x2', 6)} and 'replaced' not in long['vit_x2', 6]
    assert long['vit_x2', 6]['run'] == 'vit_x2-s6'
    # a report that holds revision 4's runs gives them back as they are
    assert run_results.long_archive({('vit_x2', 3): dict(run='vit_x2-s3')}) == {('vit_x2', 3): dict(run='vit_x2-s3')}
