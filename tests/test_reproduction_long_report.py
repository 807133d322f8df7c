"""reproduction/long_report.py: revision 4's section, and the CPU each run was trained on."""
from _reproduction import claims, long_report, longer_schedules, plan, run_results, write_run


def test_cpu_of_names_each_runs_recorded_cpu_and_the_earlier_reports_for_the_rest():
    assert long_report.cpu_of([dict(cpu='Intel(R) Xeon(R) Processor'), dict(cpu='Intel(R) Xeon(R) Processor')]) == \
        'Intel(R) Xeon(R) Processor'
    assert long_report.cpu_of([dict(cpu='Intel(R) Xeon(R) Processor'), dict()]) == \
        'AMD EPYC and Intel(R) Xeon(R) Processor'  # revision 3.1's runs recorded none: its report named AMD EPYC


def test_section_names_the_reused_runs_the_misses_and_the_gain_from_60_to_120_epochs(tmp_path):
    runs = tmp_path / 'runs'
    for arm in (*longer_schedules.LONG_ARMS, plan.ARM_BY_NAME['vit'], plan.ARM_BY_NAME['vit_sam']):
        for seed in plan.LONG_SEEDS:
            write_run(runs, arm, seed, gain=0.84 if (arm.name, seed) == ('vit_x2', 3) else 0.0)
    r_long = run_results.load_results(runs, longer_schedules.LONG_ARMS, list(plan.LONG_SEEDS))
    for m in r_long['vit_x2']:
        m['top1'] += 1.5  # the plain ViT gains 1.5 points from 60 to 120 epochs, SAM nothing
    registered = run_results.load_results(runs, [plan.ARM_BY_NAME['vit'], plan.ARM_BY_NAME['vit_sam']],
                                          list(plan.LONG_SEEDS))
    (long,) = claims.evaluate_long(r_long)
    lines = long_report.long_section(r_long, long, registered, None, 2, ['vit_x2-s6', 'vit_sam_x2-s6'])
    text = '\n'.join(lines)
    assert lines[0] == f'## {long_report.LONG_TITLE}'
    assert ('At seed 6 revision 3.1 trained these runs at exactly these settings; they are reused (2 runs), and the '
            'other 30 were trained for revision 4.') in text
    assert ('16 seeds: +0.50 pt [+0.50 pt, +0.50 pt], 16/16 agree, **smaller than claimed** (by the rule before '
            'revision 4: reproduced).') in text
    assert ('Top-1 gained from 60 to 120 epochs, same seed (the vit-sam paper\'s own test of convergence, its App. H, '
            'shown here, not registered as a claim): ViT + AdamW +1.50 pt [+1.50 pt, +1.50 pt] (16 seeds); ViT + SAM '
            '+0.00 pt [+0.00 pt, +0.00 pt] (16 seeds).') in text
    assert 'Runs that miss it (named, not replaced), with how many points their last 20% of epochs gained: ' \
           'vit_x2 seed 3 (+0.8).' in text
    assert 'Revision 4 trained 30 runs in ' in text and 'the 2 reused runs took ' in text
