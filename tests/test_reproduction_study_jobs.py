"""reproduction/study_jobs.py: train.py arguments per arm, the plan of what is cached, running the jobs with the
demo's runner (train, then measure, in one lane; a failed command stops its job only) and the CPU time they took."""
import json
import os
import sys

import pytest
from _reproduction import TRAIN_PY, fake_runs, longer_schedules, measure_run, plan, study_jobs, tiny_folder
from conftest import require_timm_script


def test_every_arm_is_a_valid_train_py_command(tmp_path):
    from timm_ext.launch.build_command import build_train_command

    require_timm_script(TRAIN_PY)
    data = tiny_folder(tmp_path / 'data')
    for arm in plan.ARMS + longer_schedules.EXTENSION_ARMS:  # revision 2.4's schedules too
        args = study_jobs.train_args(arm, data, tmp_path / 'runs', seed=2)
        assert args.count('--seed') == 1 and args[args.index('--seed') + 1] == '2'
        assert args[args.index('--experiment') + 1] == f'{arm.name}-s2'
        assert args[args.index('--lr') + 1] == f'{arm.lr:g}'
        assert args[args.index('--epochs') + 1] == str(round(arm.schedule / arm.fraction))
        argv = build_train_command(args, timm_train=TRAIN_PY).argv  # checked against train.py's own parser
        assert argv[argv.index('--model') + 1] == arm.model


def test_plan_reuses_cached_runs(tmp_path, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = fake_runs(tmp_path / 'runs', seeds=(0,))
    os.remove(runs / 'vit_sam-s0' / measure_run.MEASURE_FILE)  # trained, not measured
    arms = [plan.ARM_BY_NAME[n] for n in ('vit', 'vit_sam')]
    jobs = study_jobs.plan_jobs(runs, arms, [0, 1], timm_train=str(TRAIN_PY))
    keys = {j.key: len(j.commands) for j in jobs}
    assert keys == {'vit_sam-s0': 1, 'vit-s1': 2, 'vit_sam-s1': 2}  # vit-s0 is cached
    assert jobs[0].commands[0][-3:] == [str(runs / 'vit_sam-s0'), 'vit_sam', '0']


def test_archived_runs_are_not_trained_again_and_revision_3_goes_seed_by_seed(tmp_path, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = tmp_path / 'runs'
    arms = [plan.ARM_BY_NAME[n] for n in ('vit', 'vit_sam', 'vit_cb')]
    archived = {(a.name, s) for a in arms for s in plan.SEEDS} | {('vit', 5)}
    assert study_jobs.plan_jobs(runs, arms, list(plan.SEEDS), str(TRAIN_PY), archived) == []
    (runs / 'vit-s3').mkdir(parents=True)  # begun in the cache (an interrupted run): trained again, not read back
    assert [j.key for j in study_jobs.plan_jobs(runs, arms, list(plan.SEEDS), str(TRAIN_PY), archived)] == ['vit-s3']
    rev3 = plan.PLAN_BY_NAME['3']
    jobs = study_jobs.revision_jobs(rev3, runs, str(TRAIN_PY), {k: {} for k in archived}, {a.name for a in arms})
    # seeds 5-15 of the ViT pair (CB has no extended claim), seed by seed; vit-s5 is archived
    assert [j.key for j in jobs][:5] == ['vit_sam-s5', 'vit-s6', 'vit_sam-s6', 'vit-s7', 'vit_sam-s7']
    assert len(jobs) == 2 * 11 - 1 and jobs[-1].key == 'vit_sam-s15' and all(j.trains for j in jobs)


def test_revision_4_trains_the_pair_at_120_epochs_for_every_seed_but_the_reused_ones(tmp_path, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    reused = {(a.name, s) for a in longer_schedules.LONG_ARMS for s in plan.LONG_REUSED}
    jobs = study_jobs.revision_jobs(plan.PLAN_BY_NAME['4'], tmp_path / 'runs', str(TRAIN_PY), {k: {} for k in reused})
    assert len(jobs) == 26 and [j.key for j in jobs][:3] == ['vit_x2-s0', 'vit_sam_x2-s0', 'vit_x2-s1']
    assert not any(j.seed in plan.LONG_REUSED for j in jobs) and all(j.trains for j in jobs)
    argv = jobs[1].commands[0]
    assert argv[argv.index('--epochs') + 1] == '120' and argv[argv.index('--opt') + 1] == 'samadamw'
    assert argv[argv.index('--experiment') + 1] == 'vit_sam_x2-s0'


def test_run_jobs_runs_each_jobs_commands_in_order_and_names_the_failed_ones(tmp_path):
    arm = plan.ARM_BY_NAME['vit']
    ok_dir, bad_dir = tmp_path / 'runs' / 'vit-s0', tmp_path / 'runs' / 'vit-s1'
    write = 'import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True); ' \
            'p.write_text(p.read_text() + sys.argv[2] if p.exists() else sys.argv[2])'
    ok_dir.mkdir(parents=True)
    (ok_dir / 'order').write_text('stale,')  # an unfinished run: removed before its train command
    ok = study_jobs.StudyJob(arm, 0, ok_dir, [[sys.executable, '-c', write, str(ok_dir / 'order'), 'train,'],
                                              [sys.executable, '-c', write, str(ok_dir / 'order'), 'measure']], 1.0)
    bad = study_jobs.StudyJob(arm, 1, bad_dir, [[sys.executable, '-c', 'raise SystemExit(3)'],
                                                [sys.executable, '-c', write, str(bad_dir / 'order'), 'never']], 1.0)
    lines = []
    with pytest.raises(RuntimeError, match=r'^1 run\(s\) failed: vit-s1; their logs are in '):
        study_jobs.run_jobs([ok, bad], tmp_path / 'runs', lanes=2, log=lines.append)
    assert (ok_dir / 'order').read_text() == 'train,measure'  # the second command ran after the first
    assert not (bad_dir / 'order').exists()  # a failed command stops its job
    assert any('vit-s0: done' in line for line in lines) and any('vit-s1: FAILED' in line for line in lines)


def test_run_jobs_records_the_cpu_time_of_trained_and_measured_runs_only(tmp_path):
    arm = plan.ARM_BY_NAME['vit']
    runs = tmp_path / 'runs'
    # each command: 0.3 s of CPU, then a file in the run's folder (train.py's, then the measurement's)
    burn = 'import pathlib, sys, time; c = time.process_time()\nwhile time.process_time() - c < 0.3: pass\n' \
           'p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True); p.write_text("x")'
    trained, again, fresh, failed = runs / 'vit-s0', runs / 'vit-s1', runs / 'vit-s2', runs / 'vit-s3'
    for d in (again, fresh):
        d.mkdir(parents=True)
    earlier = json.dumps(dict(cpu_s=99.0, lanes=4, cores=8))
    (again / plan.CPU_FILE).write_text(earlier)  # from when it was trained
    jobs = [study_jobs.StudyJob(arm, 0, trained, [[sys.executable, '-c', burn, str(trained / 'summary.csv')],
                                                  [sys.executable, '-c', burn, str(trained / 'm.json')]], 1.0),
            study_jobs.StudyJob(arm, 1, again, [[sys.executable, '-c', burn, str(again / 'm.json')]], 0.1),
            study_jobs.StudyJob(arm, 2, fresh, [[sys.executable, '-c', burn, str(fresh / 'm.json')]], 0.1),
            study_jobs.StudyJob(arm, 3, failed, [[sys.executable, '-c', burn, str(failed / 'summary.csv')],
                                                 [sys.executable, '-c', 'raise SystemExit(3)']], 1.0)]
    with pytest.raises(RuntimeError, match=r'^1 run\(s\) failed: vit-s3;'):
        study_jobs.run_jobs(jobs, runs, lanes=2, log=lambda line: None)
    cpu = json.loads((trained / plan.CPU_FILE).read_text())
    assert set(cpu) == {'cpu_s', 'lanes', 'cores'} and cpu['lanes'] == 2 and cpu['cores'] == os.cpu_count()
    if hasattr(os, 'wait4'):  # the OS reports a child's CPU time: both commands', training and measuring
        assert cpu['cpu_s'] >= 0.6 and cpu['cpu_s'] == round(cpu['cpu_s'], 1)
    else:
        assert cpu['cpu_s'] is None
    assert not (trained / (plan.CPU_FILE + '.tmp')).exists()
    assert (failed / 'summary.csv').is_file() and not (failed / plan.CPU_FILE).exists()  # trained, measuring failed
    # measuring again: its CPU time leaves the training out, so the earlier file stays and none is made
    assert (again / plan.CPU_FILE).read_text() == earlier and not (fresh / plan.CPU_FILE).exists()
    assert (again / 'm.json').is_file() and (fresh / 'm.json').is_file()


def _finished(runs, arm, seed, top1, cpu_s=600.0):
    folder = runs / f'{arm}-s{seed}'
    folder.mkdir(parents=True)
    (folder / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1\n'
                                        + ''.join(f'{e},1,1,{top1}\n' for e in range(120)))
    (folder / 'last.pth.tar').write_text('')
    (folder / measure_run.MEASURE_FILE).write_text(json.dumps(dict(top1=top1)))
    (folder / plan.CPU_FILE).write_text(json.dumps(dict(cpu_s=cpu_s, lanes=2, cores=2)))


def test_a_failed_run_is_recorded_with_why_and_not_trained_again(tmp_path, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = tmp_path / 'runs'
    (runs / 'vit-s0').mkdir(parents=True)
    (runs / 'vit-s0.log').write_text('epoch 3\nRuntimeError: loss is nan\n')
    study_jobs.record_failed(runs / 'vit-s0', runs / 'vit-s0.log', 1, 12.34)
    rec = json.loads((runs / 'vit-s0' / study_jobs.FAILED_FILE).read_text())
    assert rec['why'] == 'exit code 1: epoch 3 | RuntimeError: loss is nan' and rec['cpu_s'] == 12.3
    jobs = study_jobs.plan_jobs(runs, [plan.ARM_BY_NAME['vit']], [0, 1], str(TRAIN_PY))
    assert [j.key for j in jobs] == ['vit-s1']
    # a run stopped unfinished is trained again, and the stop is recorded first
    (runs / 'vit-s1').mkdir()
    (runs / 'vit-s1' / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1\n0,1,1,50\n1,1,1,60\n')
    study_jobs.record_stopped(runs, runs / 'vit-s1')
    [stop] = study_jobs.stopped_runs(runs)
    assert stop['run'] == 'vit-s1' and stop['epochs'] == 2 and stop['why'].startswith('stopped')


def test_revision_5_goes_from_its_check_and_pilot_to_the_seeds_its_rule_gives(tmp_path, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    rev, runs = plan.PLAN_BY_NAME['5'], tmp_path / 'runs'
    archive = {(a, s): dict(top1=97.0 + (a == plan.R5_SAM)) for a in (plan.R5_ADAMW, plan.R5_SAM)
               for s in plan.LONG_SEEDS}
    jobs = study_jobs.revision_jobs(rev, runs, str(TRAIN_PY), archive)
    assert [j.key for j in jobs][:3] == ['vit_x2_check-s0', 'vit_esam_x2-s0', 'vit_mesa_x2-s0']
    assert len(jobs) == 1 + 12 * 3 and study_jobs.pilot_decisions(rev, runs, archive) is None
    kept = {**archive, ('vit_x2_check', 0): {}, ('vit_esam_x2', 0): {}}  # read back (keep_runs): not trained again
    assert [j.key for j in study_jobs.revision_jobs(rev, runs, str(TRAIN_PY), kept)][:2] == ['vit_mesa_x2-s0',
                                                                                          'vit_msam_x2-s0']
    _finished(runs, 'vit_x2_check', 0, 97.0)
    for i, arm in enumerate(rev.arms):
        for seed in rev.seeds:
            # SAM's top-1 + a spread of 0.28 pt; the fourth arm (LookSAM) does not learn at seed 1
            _finished(runs, arm, seed, 10.0 if (i == 3 and seed == 1) else 98.0 + 0.28 * ((seed + i) % 3 - 1))
    decisions = study_jobs.pilot_decisions(rev, runs, archive)
    by = {d.key: d for d in decisions}
    assert [d.key for d in decisions] == list(rev.claims)
    assert by['r5_looksam'].status == 'dropped' and 'seed 1: top-1 10.0 < 50' in by['r5_looksam'].why
    spent = (1 + 36) * 10.0  # 600 s each
    assert sum(d.cpu_min for d in decisions) <= plan.R5_BUDGET_CPU_MIN - spent
    read = [d for d in decisions if d.status == 'read']
    assert read and read[0].key == 'r5_esam'  # the cheap variants first
    jobs = study_jobs.revision_jobs(rev, runs, str(TRAIN_PY), archive)
    more = {plan.CLAIM_BY_KEY[d.key].b: d.n for d in read}
    assert sorted(j.key for j in jobs) == sorted(f'{a}-s{s}' for a, n in more.items() for s in range(3, n))
    assert [j.seed for j in jobs] == sorted(j.seed for j in jobs)  # seed by seed


def test_one_planner_serves_every_revision_from_its_data_each_run_once(tmp_path, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs, arms = tmp_path / 'runs', [plan.ARM_BY_NAME[n] for n in ('vit', 'vit_sam')]
    jobs = study_jobs.study_jobs(plan.PLANS, runs, arms, plan.SEEDS, str(TRAIN_PY), {}, {'vit', 'vit_sam'})
    keys = [j.key for j in jobs]
    assert len(keys) == len(set(keys))  # revisions 2 and 2.1 both name the ViT pair at seeds 0-4: planned once
    assert keys[:10] == [f'{a}-s{s}' for s in plan.SEEDS for a in ('vit', 'vit_sam')]
    assert 'vit_sam-s15' in keys and 'vit_x2-s0' in keys and 'vit_sam_x2-s15' in keys  # revisions 3 and 4
    assert not any(k.startswith('vit_esam') for k in keys)  # revision 5's arms are not among those chosen
    every = study_jobs.study_jobs(plan.PLANS, runs, arms, plan.SEEDS, str(TRAIN_PY), {})
    assert 'vit_x2_check-s0' in [j.key for j in every] and 'vit_bsam_x2-s2' in [j.key for j in every]
    unknown = plan.RevisionPlan('9', 'Revision 9 (a test)', seed_rule='guess')
    with pytest.raises(ValueError, match="seed rule 'guess', which the planner does not know"):
        study_jobs.revision_jobs(unknown, runs, str(TRAIN_PY), {})
    assert study_jobs.regroup_jobs(plan.PLANS, runs, ['vit'], plan.SEEDS, str(TRAIN_PY)) == []  # nothing measured
