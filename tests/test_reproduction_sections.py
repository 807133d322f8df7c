"""reproduction/sections.py: each revision's section of its own (revision 3's claims at more seeds, revision 4's pair
at 120 epochs), and the dispatch by revision name."""

import pytest
from _reproduction import claims, fake_runs, longer_schedules, plan, power, run_results, sections, write_run

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


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
    lines = sections.one_schedule_section(r_long, long, registered, None, ['vit_x2-s6', 'vit_sam_x2-s6'], unseen)
    text = '\n'.join(lines)
    assert lines[0] == f'## {sections.ONE_SCHEDULE_TITLE}'
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


def test_section_gives_the_power_table_the_per_seed_values_and_the_new_runs(tmp_path):
    seeds = list(range(16))
    r = run_results.load_results(fake_runs(tmp_path / 'runs', seeds=seeds), plan.ARMS, seeds)
    five = claims.read({a: ms[:5] for a, ms in r.items()}, plan.CLAIMS)
    ext = {c.claim.key: c for c in claims.read_revision(plan.PLAN_BY_NAME['3'], r)}
    powers = {c.claim.key: power.claim_power(c.claim.key, [0.1, 0.2, -0.1, 0.3, 0.05], c.claim.margin,
                                             c.claim.direction) for c in five}
    lines = sections.more_seeds_section(r, five, ext, powers, 'Revision 3 trained these runs.', ['![x](x.png)'])
    assert lines[0] == '## More seeds where more seeds can settle a claim (revision 3)'
    assert '**SAM raises the ViT\'s top-1** (vit-sam, Sec. 4, Table 2). 5 seeds: +2.00 pt [+2.00 pt, +2.00 pt], ' \
           '5/5 agree, **reproduced**. 16 seeds (fixed at 16), as registered: +2.00 pt [+2.00 pt, +2.00 pt], ' \
           '16/16 agree, **reproduced**.' in lines
    assert '- ViT + AdamW: 97.5 ± 4.8 (' + ', '.join(f'{90.0 + s:.1f}' for s in seeds) + ')' in lines
    assert '| ViT conv stem + AdamW | 5-8 | 96.5 ± 1.3 % | 95.0, 96.0, 97.0, 98.0 | 4/4 |' in lines
    assert 'Revision 3 trained these runs.' in lines and '![x](x.png)' in lines
    assert not any(line.startswith('Runs that miss') for line in lines)
    r['vit_convstem'][6]['converged'] = False  # seed 6 of the conv stem misses the rule: named
    r['vit_convstem'][6]['top1_curve'] = [90.0] * 48 + [91.0] * 12
    lines = sections.more_seeds_section(r, five, ext, powers, None, [])
    assert ('Runs that miss the convergence rule, with how many points their last 20% of epochs gained (named, not '
            'replaced: the registered readings read them as they are): vit_convstem seed 6 (+1.0).') in lines


def test_each_revision_with_a_section_of_its_own_is_found_by_name():
    assert set(sections.SECTIONS) == {'3', '4', '5'} and set(sections.SECTIONS) <= {p.name for p in plan.PLANS}
    lines = ['## x (revision 5)', '']
    assert sections.revision_sections(['2', '5'], dict(cost_gain=lines)) == lines
    assert sections.revision_sections(['2', '2.4'], {}) == []
