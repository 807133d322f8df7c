"""reproduction/reproduce.py: the plan printed with its ETA, --report-only refusals, the doublings, the report."""
import json
import os

import pytest
from _reproduction import TRAIN_PY, fake_run, fake_runs, keep_runs, measure_run, plan, reproduce, write_run
from conftest import require_timm_script


def test_report_only_refuses_when_runs_are_missing(tmp_path, monkeypatch, capsys):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = fake_runs(tmp_path / 'runs', seeds=(0,))
    os.remove(runs / 'vit_sam-s0' / measure_run.MEASURE_FILE)  # trained, not measured
    with pytest.raises(SystemExit):
        reproduce.main(['--runs', str(runs), '--arms', 'vit', 'vit_sam', '--seeds', '0', '1', '--report-only',
                        '--timm-train', str(TRAIN_PY), '--no-archive'])
    err = capsys.readouterr()
    lines = {line.split()[0]: line for line in err.out.splitlines()[1:3]}
    assert lines['vit'].endswith('60 epochs: train 1, measure only 0, cached 1')
    assert lines['vit_sam'].endswith('60 epochs: train 1, measure only 1, cached 0')
    assert 'ETA:' in err.out
    assert ('--report-only: 3 run(s) are not trained or measured in ' in err.err
            and '(first: vit_sam-s0)' in err.err)


def test_unknown_arm_is_one_line(capsys):
    with pytest.raises(SystemExit):
        reproduce.main(['--arms', 'vit', 'vitt', '--dry-run'])
    assert "unknown arm 'vitt': choose from " in capsys.readouterr().err


def test_report_only_refuses_while_the_lr_sweep_pair_must_train_again(tmp_path, monkeypatch, capsys):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = fake_runs(tmp_path / 'runs', seeds=(0,))
    a, b = plan.EXTENDED_PAIRS[0]
    write_run(runs, plan.ARM_BY_NAME[b], 0, gain=1.1)  # the conv stem misses the rule
    with pytest.raises(SystemExit):
        reproduce.main(['--runs', str(runs), '--arms', a, b, '--seeds', '0', '--report-only',
                        '--timm-train', str(TRAIN_PY), '--no-archive'])
    err = capsys.readouterr()
    assert 'trains both again at twice the schedule (revision 2.4; up to 2 times)' in err.out
    assert (f'the plan is cached; first 2 run(s) at a longer schedule (revisions 2.4 and 3.1: {a}_x2-s0, '
            f'{b}_x2-s0)') in err.out
    assert '--report-only: 2 run(s) are not trained or measured in ' in err.err and f'(first: {a}_x2-s0)' in err.err


def test_main_trains_the_pair_again_then_writes_the_report(tmp_path, monkeypatch, capsys):
    pytest.importorskip('matplotlib')
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    runs = fake_runs(tmp_path / 'runs', seeds=(0, 1))
    a, b = plan.EXTENDED_PAIRS[0]
    write_run(runs, plan.ARM_BY_NAME[a], 0, gain=0.9)
    batches = []

    def fake_run_jobs(jobs, runs_dir, lanes, log=None):  # train and measure: a converged run per job
        batches.append([j.key for j in jobs])
        for job in jobs:
            write_run(runs_dir, job.arm, job.seed, gain=0.0)

    monkeypatch.setattr(reproduce, 'run_jobs', fake_run_jobs)
    assert reproduce.main(['--runs', str(runs), '--arms', a, b, '--seeds', '0', '1', '--docs', str(tmp_path / 'docs'),
                           '--timm-train', str(TRAIN_PY)]) == 0
    assert batches == [[], [f'{a}_x2-s0', f'{b}_x2-s0']]  # nothing else to train, then one doubling
    assert f'2 run(s) at twice the schedule, where a run of a seed\'s group missed the convergence rule: {a}_x2-s0, ' \
           f'{b}_x2-s0' in capsys.readouterr().out
    text = (tmp_path / 'docs' / 'reproduction.md').read_text()
    # seed 0 read first at its first schedule, revision 2.4's reading of it at twice the schedule beside
    assert '| 0.0015 | 1 | 60 |' in text and f'{a} seed 0: 60 epochs (+0.9) -> 120 (+0.0)' in text
    assert 'trained 2 of the 6 runs it reads' in text


def test_default_plan_reads_the_archive_and_adds_revision_3s_seeds(tmp_path, monkeypatch, capsys):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    archive = tmp_path / 'docs' / 'reproduction' / 'measurements.json'
    archive.parent.mkdir(parents=True)
    archive.write_text(json.dumps(dict(runs={name: [fake_run(plan.ARM_BY_NAME[name], s) for s in range(6)]
                                             for name in ('vit', 'vit_sam', 'vit_cb')})))
    argv = ['--runs', str(tmp_path / 'runs'), '--arms', 'vit', 'vit_sam', 'vit_cb', '--docs', str(tmp_path / 'docs'),
            '--timm-train', str(TRAIN_PY), '--dry-run']
    assert reproduce.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ('reproduction study: 3 arms (0 of them supporting runs) x 5 seeds, and revision 3\'s extra seeds '
                      'for 4 claims = 37 train.py runs')
    assert out[1].endswith('60 epochs: train 10, measure only 0, cached 0, archived 6 (seeds 5-15: revision 3)')
    assert out[3].endswith('60 epochs: train 0, measure only 0, cached 0, archived 5')  # CB: seeds 0-4 only
    # revision 4: the ViT pair at 120 epochs for all 16 seeds (no revision-3.1 run in this archive to reuse)
    assert ('revision 4: vit_x2 / vit_sam_x2 (120 epochs) at seeds 0-15: train 32 runs, measure only 0, read back 0 '
            'pairs; a run that misses the convergence rule is named, not trained again') in out
    kept = archive.with_name(keep_runs.KEPT_FILE)  # runs kept beside it while a study trains are read back too
    kept.write_text(json.dumps(dict(runs={'vit': [fake_run(plan.ARM_BY_NAME['vit'], s) for s in (6, 7)]})))
    assert reproduce.main(argv) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith('train 8, measure only 0, cached 0, archived 8 (seeds '
                                                            '5-15: revision 3)')
    kept.unlink()
    assert reproduce.main(argv + ['--no-archive']) == 0  # every run trained
    assert capsys.readouterr().out.splitlines()[3].endswith('60 epochs: train 5, measure only 0, cached 0')
    archive.write_text('{}')
    with pytest.raises(SystemExit):
        reproduce.main(argv)
    assert "cannot read the archived runs in " in capsys.readouterr().err
