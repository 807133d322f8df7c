"""reproduction/long_report.py: revision 4's section."""
from _reproduction import claims, long_report, longer_schedules, plan, run_results, write_run


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
    (long,) = claims.read_revision(plan.PLAN_BY_NAME['4'], r_long)
    (unseen,) = claims.read(r_long, [plan.LONG_CLAIM], without={6})
    lines = long_report.long_section(r_long, long, registered, None, ['vit_x2-s6', 'vit_sam_x2-s6'], unseen)
    text = '\n'.join(lines)
    assert lines[0] == f'## {long_report.LONG_TITLE}'
    assert ('30 of its 32 runs were trained for it, after it was committed; the other 2, at seed 6, are revision '
            '3.1\'s runs at exactly these settings, trained and read before revision 4 was written. By the standard '
            'of [the revisions\' table](#revisions-and-what-each-had-seen) it is **post hoc** (it had seen 6 of the '
            '32 runs it reads') in text
    assert ('16 seeds, 30 runs new and 2 reused: +0.50 pt [+0.50 pt, +0.50 pt], 16/16 agree, **smaller than '
            'claimed** (by the rule before revision 4: reproduced). The 15 seeds revision 4 had not seen (0, 1, 2, 3, '
            '4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15), its new runs alone: +0.50 pt') in text
    assert unseen.n == 15
    assert ('Top-1 gained from 60 to 120 epochs, same seed (the vit-sam paper\'s own test of convergence, its App. H, '
            'shown here, not registered as a claim): ViT + AdamW +1.50 pt [+1.50 pt, +1.50 pt] (16 seeds); ViT + SAM '
            '+0.00 pt [+0.00 pt, +0.00 pt] (16 seeds).') in text
    assert ('Converged (the rule above): ViT + AdamW, 120 epochs 15/16 (seed 3 +0.8), ViT + SAM, 120 epochs 16/16; a '
            'run that misses it is named, not replaced.') in text
    assert 'Revision 4: 30 runs took ' in text and 'of wall-clock time summed over the runs' in text
    assert 'The reused runs, revision 3.1\'s: 2 runs took ' in text
