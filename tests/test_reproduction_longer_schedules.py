"""reproduction/longer_schedules.py: revision 2.4, the lr sweep's pair trained again at twice the schedule."""
import json

import pytest
from _reproduction import (
    fake_runs,
    longer_schedules,
    plan,
    report,
    report_tables,
    run_results,
    supporting_runs,
    write_run,
)


def test_lr_sweep_pair_trains_again_at_twice_the_schedule_until_both_runs_converge(tmp_path):
    pytest.importorskip('matplotlib')
    runs = fake_runs(tmp_path / 'runs')
    a, b = (plan.ARM_BY_NAME[n] for n in plan.EXTENDED_PAIRS[0])
    names, seeds = [x.name for x in supporting_runs.ALL_ARMS], [0, 1, 2]
    assert longer_schedules.pending(runs, names, seeds) == []  # every run converged
    write_run(runs, a, 2, gain=0.84)  # patchify seed 2 misses the rule at 60 epochs
    todo = longer_schedules.pending(runs, names, seeds)
    assert [(arm.name, arm.epochs, seed) for arm, seed in todo] == [(f'{a.name}_x2', 120, 2),
                                                                      (f'{b.name}_x2', 120, 2)]
    # a pair runs only when both of its arms are in the study
    assert longer_schedules.pending(runs, [a.name], seeds) == []
    for arm, seed in todo:
        write_run(runs, arm, seed, gain=0.28)  # both converge at 120 epochs
    assert longer_schedules.pending(runs, names, seeds) == []
    assert longer_schedules.tried(runs, a.name, 2) == [runs / f'{a.name}-s2', runs / f'{a.name}_x2-s2']
    assert longer_schedules.tried(runs, a.name, 1) == [runs / f'{a.name}-s1']
    r = run_results.load_results(runs, supporting_runs.ALL_ARMS, seeds)
    assert [len(m['top1_curve']) for m in r[a.name]] == [60, 60, 120] and r[a.name][2]['converged']
    assert [x['run'] for x in r[b.name][2]['replaced']] == [f'{b.name}-s2']  # the partner trains again too
    path = report.write_report(runs, supporting_runs.ALL_ARMS, seeds, tmp_path / 'docs',
                               'python reproduction/reproduce.py', wall_s=30.0, trained=2)
    text = path.read_text()
    # revision 2.4 was written after a run it reads again missed the rule: every run at its first schedule is read
    # first, the runs at twice the schedule beside (issue 57)
    assert f'| {a.label} | `{a.model}` | adamw | 0.0015 | 1 | 60 | ' in text and '3 (seed 2 +0.8)' in text
    assert '| 1.5e-3 | 60 |' in text and '| 1.5e-3, revision 2.4 (sensitivity reading) | 60 (seed 2: 120) |' in text
    assert (f'with each run\'s gain in its last 20% of epochs: {a.name} seed 2: 60 epochs (+0.8) -> 120 '
            f'(+0.3); {b.name} seed 2: 60 epochs (+70.0) -> 120 (+0.3).') in text
    assert 'trained 2 of the 65 runs it reads' in text  # 21 arms x 3 seeds in the tables, 2 replaced
    saved = json.loads((tmp_path / 'docs' / 'reproduction' / 'measurements.json').read_text())
    assert saved['runs'][a.name][2]['replaced'][0]['top1_curve'][-1] == pytest.approx(90.84)
    # still missing at 120 and at 240 epochs: no third doubling, and the 240-epoch run is named as not converged
    write_run(runs, longer_schedules.doubled(a, 1), 2, gain=1.5)
    todo = longer_schedules.pending(runs, names, seeds)
    assert [(arm.name, arm.epochs) for arm, _ in todo] == [(f'{a.name}_x4', 240), (f'{b.name}_x4', 240)]
    for arm, seed in todo:
        write_run(runs, arm, seed, gain=2.0 if arm.name.startswith(a.name + '_') else 0.0)
    assert longer_schedules.pending(runs, names, seeds) == []
    r = run_results.load_results(runs, supporting_runs.ALL_ARMS, seeds)
    assert len(r[a.name][2]['top1_curve']) == 240 and not r[a.name][2]['converged']
    lines = '\n'.join(report_tables.not_converged(run_results.first_schedules(r), r, plan.ARMS))
    assert f'{a.name} seed 2 (+0.8)' in lines
    assert f'{a.name} seed 2: 60 epochs (+0.8), 120 epochs (+1.5) -> 240 (+2.0)' in lines


def test_revision_3_1_trains_every_vit_arm_of_a_new_seed_again_where_one_of_them_misses_the_rule(tmp_path):
    runs = fake_runs(tmp_path / 'runs', seeds=plan.SEEDS)
    for arm in plan.ARMS:
        for seed in plan.extended_seeds(arm.name):
            write_run(runs, arm, seed)
    vit, sam, stem = (plan.ARM_BY_NAME[n] for n in plan.EXTENDED_GROUP)
    names, seeds = [a.name for a in supporting_runs.ALL_ARMS], range(16)
    assert longer_schedules.pending(runs, names, seeds) == []
    write_run(runs, vit, 3, gain=0.84)  # seeds 0-4 are v3's: no rule extends the plain ViT there
    write_run(runs, sam, 12, gain=0.84)  # seed 12 is not read by the conv stem claim (9 seeds): no conv stem run
    assert longer_schedules.group_of('vit', 3) is None and longer_schedules.group_of('resnet', 6) is None
    assert longer_schedules.group_of('vit_sam', 6) == ('vit', 'vit_sam', 'vit_convstem')
    assert longer_schedules.group_of('vit', 12) == ('vit', 'vit_sam')
    todo = longer_schedules.pending(runs, names, seeds)
    assert [(a.name, a.epochs, s) for a, s in todo] == [('vit_x2', 120, 12), ('vit_sam_x2', 120, 12)]
    write_run(runs, stem, 6, gain=1.0)  # the conv stem misses at seed 6: the three arms train again
    todo = longer_schedules.pending(runs, names, seeds)
    assert [(a.name, s) for a, s in todo] == [('vit_x2', 6), ('vit_sam_x2', 6), ('vit_convstem_x2', 6),
                                              ('vit_x2', 12), ('vit_sam_x2', 12)]
    # a group is extended only where all its arms are in the study
    assert [s for _, s in longer_schedules.pending(runs, ['vit', 'vit_sam'], seeds)] == [12, 12]
    for arm, seed in todo:
        write_run(runs, arm, seed, gain=0.28 if seed == 6 else 0.0)
    assert longer_schedules.pending(runs, names, seeds) == []
    assert longer_schedules.tried(runs, 'vit', 6) == [runs / 'vit-s6', runs / 'vit_x2-s6']
    assert longer_schedules.tried(runs, 'vit_convstem', 12) == [runs / 'vit_convstem-s12']  # not trained there
    assert longer_schedules.tried(runs, 'resnet', 12) == [runs / 'resnet-s12']
    assert longer_schedules.tried(runs, 'vit', 3) == [runs / 'vit-s3']
    seeds_of = {a.name: (*plan.SEEDS, *plan.extended_seeds(a.name)) for a in plan.ARMS if plan.extended_seeds(a.name)}
    r = run_results.load_results(runs, [a for a in plan.ARMS if a.name in seeds_of], plan.SEEDS, seeds_of=seeds_of)
    assert len(r['vit'][6]['top1_curve']) == 120 and len(r['vit_convstem'][6]['top1_curve']) == 120
    assert len(r['vit'][3]['top1_curve']) == 60 and not r['vit'][3]['converged']  # named, not trained again
    first = run_results.first_schedules(r)
    assert [len(first[n][12]['top1_curve']) for n in ('vit', 'vit_sam')] == [60, 60]
    assert [x['run'] for x in run_results.longer_runs(r['vit_sam'])] == ['vit_sam_x2-s6', 'vit_sam_x2-s12']
