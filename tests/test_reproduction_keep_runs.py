"""reproduction/keep_runs.py: a study's runs kept in the archive as it trains; a new machine trains only the rest."""
import json
import os
import time

from _reproduction import (
    TRAIN_PY,
    fake_run,
    keep_runs,
    plan,
    reproduce,
    run_results,
    study_jobs,
    supporting_runs,
    write_run,
)
from conftest import require_timm_script

ARMS = supporting_runs.ALL_ARMS_BY_NAME


def _archive(path, seeds=(0, 1)):
    runs = {'vit': [dict(fake_run(plan.ARM_BY_NAME['vit'], s), run=f'vit-s{s}') for s in seeds]}
    path.write_text(json.dumps(dict(revision='4', runs=runs, other={'kept': 'as it was'})))
    return path


def _aged(folder, seconds):
    old = time.time() - seconds
    for f in (folder, *folder.rglob('*')):
        os.utime(f, (old, old))


def _study(tmp_path):
    """A cache with one run of each kind: finished, archived already, failed, stopped long ago, still training."""
    runs = tmp_path / 'runs'
    vit_sam = ARMS['vit_sam']
    done = write_run(runs, vit_sam, 2)
    (done / 'args.yaml').write_text(f'model: {vit_sam.model}\nseed: 2\noutput: /home/me/runs\n')
    (done / plan.MEASURE_FILE).touch()
    (done / plan.CPU_FILE).write_text(json.dumps(dict(cpu_s=600.0, lanes=2, cores=2)))
    write_run(runs, ARMS['vit'], 1)  # in the archive already: left as the archive has it
    failed = runs / 'vit_sam-s3'
    failed.mkdir()
    (failed / study_jobs.FAILED_FILE).write_text(json.dumps(dict(why='exit code 1: boom', cpu_s=5.0)))
    for seed, age in ((4, 3600), (5, 0), (6, 3600)):  # stopped an hour ago; written a moment ago: still training
        d = runs / f'vit_sam-s{seed}'
        d.mkdir()
        (d / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n0,1,1,50,90,0.001\n')
        _aged(d, age)
    (runs / 'vit_sam-s6.log').write_text('measuring')  # its folder is old, its job's log new: being measured
    (runs / 'not_an_arm-s0').mkdir()
    (runs / study_jobs.STOPPED_FILE).write_text(json.dumps(dict(run='vit_sam-s1', epochs=7, last_written='x',
                                                                why='stopped')) + '\n')
    return runs


def test_finished_failed_and_stopped_runs_are_kept_once_beside_the_archive_which_is_left_alone(tmp_path):
    runs, archive = _study(tmp_path), _archive(tmp_path / 'measurements.json')
    before = archive.read_text()
    done = keep_runs.keep_runs(runs, archive, ARMS)
    assert archive.read_text() == before  # only a report writes measurements.json
    path = keep_runs.kept_path(archive)
    assert done == dict(kept=['vit_sam-s2'], failed=['vit_sam-s3'], stopped=['vit_sam-s4'],
                    in_flight=['vit_sam-s5', 'vit_sam-s6'])
    saved = json.loads(path.read_text())
    assert list(saved['runs']) == ['vit_sam']  # vit-s1 is in the archive already
    kept = saved['runs']['vit_sam'][0]
    assert (kept['seed'], kept['top1'], kept['run']) == (2, 94.0, 'vit_sam-s2')
    assert kept['timing']['cpu_s'] == 600.0 and kept['train_args']['output'] == '<runs>'  # no folder of this machine
    assert saved['failed_runs'] == {'vit_sam-s3': dict(why='exit code 1: boom', cpu_s=5.0)}
    assert [(x['run'], x['epochs']) for x in saved['stopped_runs']] == [('vit_sam-s4', 1), ('vit_sam-s1', 7)]
    assert keep_runs.keep_runs(runs, archive, ARMS) == dict(kept=[], failed=[], stopped=[],
                                                           in_flight=['vit_sam-s5', 'vit_sam-s6'])
    assert json.loads(path.read_text()) == saved  # a second call adds nothing twice
    archive = run_results.load_archive(path)  # read back as the study reads it, by (arm, seed)
    assert archive['vit_sam', 2]['top1'] == 94.0


def test_a_new_machine_trains_only_what_the_archive_lacks(tmp_path, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs, path = _study(tmp_path), _archive(tmp_path / 'measurements.json')
    keep_runs.keep_runs(runs, path, ARMS)
    path = keep_runs.kept_path(path)
    fresh = tmp_path / 'new-machine'  # an empty cache
    arms = [ARMS['vit_sam']]
    archive = run_results.load_archive(path)
    todo = study_jobs.plan_jobs(fresh, arms, [1, 2], str(TRAIN_PY), set(archive))
    assert [(j.arm.name, j.seed) for j in todo] == [('vit_sam', 1)]


def test_the_kept_file_goes_only_once_a_report_holds_everything_in_it(tmp_path):
    runs, archive = _study(tmp_path), _archive(tmp_path / 'measurements.json')
    assert not keep_runs.all_reported(archive)  # no such file
    keep_runs.keep_runs(runs, archive, ARMS)
    kept = json.loads(keep_runs.kept_path(archive).read_text())
    assert not keep_runs.all_reported(archive)
    saved = json.loads(archive.read_text())
    saved['runs']['vit_sam'] = kept['runs']['vit_sam']
    saved.update(failed_runs=kept['failed_runs'])
    archive.write_text(json.dumps(saved))
    assert not keep_runs.all_reported(archive)  # the stopped runs' records are not in it yet
    saved.update(stopped_runs=[{'run': 'other-s0'}, *kept['stopped_runs']])
    archive.write_text(json.dumps(saved))
    assert keep_runs.all_reported(archive)


def test_keep_runs_from_the_command_line(tmp_path, capsys):
    runs = _study(tmp_path)
    docs = tmp_path / 'docs'
    (docs / 'reproduction').mkdir(parents=True)
    path = _archive(docs / 'reproduction' / 'measurements.json')
    assert reproduce.main(['--keep-runs', '--runs', str(runs), '--docs', str(docs)]) == 0
    out = capsys.readouterr().out
    assert 'kept: 1 (vit_sam-s2)' in out and 'in flight: 2 (vit_sam-s5, vit_sam-s6)' in out
    assert 'vit_sam' not in json.loads(path.read_text())['runs']
    assert [m['seed'] for m in json.loads(keep_runs.kept_path(path).read_text())['runs']['vit_sam']] == [2]


def test_a_report_of_an_earlier_revision_leaves_out_the_runs_kept_of_a_later_one(tmp_path):
    """The kept file holds the study now training (revision 5's arms and its check): a report of revision 4 reads
    the archive beside it but none of those runs or records (the committed report regenerates as it was)."""
    r5 = next(p for p in plan.PLANS if p.name == '5')
    assert study_jobs.revision_arms(r5) == (*r5.arms, 'vit_x2_check')
    assert study_jobs.revision_arms(next(p for p in plan.PLANS if p.name == '4')) == ('vit_x2', 'vit_sam_x2')
    kept = tmp_path / 'runs_in_progress.json'
    kept.write_text(json.dumps(dict(runs={}, failed_runs={'vit_bsam_x2-s1': {'why': 'x'}, 'vit-s3': {'why': 'y'}},
                                    stopped_runs=[{'run': 'vit_x2_check-s0'}, {'run': 'vit_sam-s1'}])))
    later = set(study_jobs.revision_arms(r5))
    assert reproduce._records([kept], later) == dict(failed_runs={'vit-s3': {'why': 'y'}},
                                                     stopped_runs=[{'run': 'vit_sam-s1'}])
    assert len(reproduce._records([kept])['stopped_runs']) == 2


def test_one_stop_recorded_before_and_after_a_restore_of_the_cache_is_one_stop(tmp_path):
    """keep_runs.py records a stopped run while its folder sits in the cache; the study, started again on a cache whose
    file times are the restore's, records the same stop once more before training it again. Both say the same run
    and epochs: the kept file, and the report's list, name it once (the first record)."""
    runs, archive = _study(tmp_path), _archive(tmp_path / 'measurements.json')
    keep_runs.keep_runs(runs, archive, ARMS)
    folder = runs / 'vit_sam-s4'
    _aged(folder, -7200)  # restored: its times are later than the stop
    study_jobs.record_stopped(runs, folder)
    assert [x['epochs'] for x in study_jobs.stopped_runs(runs) if x['run'] == 'vit_sam-s4'] == [1]
    keep_runs.keep_runs(runs, archive, ARMS)
    kept = json.loads(keep_runs.kept_path(archive).read_text())['stopped_runs']
    assert [(x['run'], x.get('kept')) for x in kept] == [('vit_sam-s4', True), ('vit_sam-s1', None)]
    both = [*kept, *study_jobs.stopped_runs(runs)]
    assert [x['run'] for x in study_jobs.unique_stops(both)] == ['vit_sam-s4', 'vit_sam-s1']
    again = dict(kept[0], epochs=9)  # the same run stopped later, at another epoch: another stop
    assert len(study_jobs.unique_stops([*both, again])) == 3
