"""reproduction/extended_report.py: revision 3 in the report, each extended claim beside its 5-seed reading."""
from _reproduction import claims, extended_report, fake_runs, plan, power, run_results

from timm_ext.analysis.stats import paired_difference


def _claim(key, diffs):
    c = next(c for c in plan.CLAIMS if c.key == key)
    d = paired_difference([0.0] * len(diffs), diffs)
    v = claims.verdict(d, c.direction, c.margin) if c.direction != 'unchanged' else None
    return claims.ClaimResult(c, d, v.label if v else claims.unchanged_verdict(d, c.margin)[0],
                              v.agree if v else 0)


def test_cells_and_headline_say_what_revision_3_did_with_each_claim():
    five = {  # v3's 5-seed readings, rounded: what the power analysis saw
        'sam_vit_top1': _claim('sam_vit_top1', [-0.28, 1.39, 0.28, 1.39, 0.28]),
        'sam_gain_half': _claim('sam_gain_half', [-2.5, 1.1, -1.7, 0.8, -1.9]),
        'hessian_small_data_nep': _claim('hessian_small_data_nep', [0.05, -0.05, -0.05, 0.05, -0.05 + 0.0001]),
        'sam_lambda_max': _claim('sam_lambda_max', [-1.0, -2.0, -1.5, -1.2, -1.9]),
    }
    assert [c.label for c in five.values()] == ['inconclusive', 'inconclusive', 'inconclusive', 'reproduced']
    ext = {'sam_vit_top1': _claim('sam_vit_top1', [-0.28, 1.39, 0.28, 1.39, 0.28] + [0.56] * 11)}
    power = extended_report.powers(list(five.values()))
    cells = {k: extended_report.extended_cell(k, c, ext, power) for k, c in five.items()}
    assert cells['sam_vit_top1'] == '16 seeds: +0.58 pt [+0.37 pt, +0.78 pt], 15/16 agree, **reproduced**'
    assert cells['sam_gain_half'].startswith('out of reach: ') and cells['sam_lambda_max'] == 'settled at 5 seeds'
    assert cells['hessian_small_data_nep'].startswith('within reach (') and 'not in revision 3' in cells[
        'hessian_small_data_nep']
    text = extended_report.headline(list(five.values()), ext)
    assert text.startswith('4 claims at 5 seeds: 3 inconclusive, 1 reproduced. With more seeds for the 1 claims '
                           'that the power analysis put within reach (revision 3: 16 seeds, fixed before the runs): '
                           '2 inconclusive, 2 reproduced.')
    assert ('SAM raises the ViT\'s top-1: +0.58 pt [+0.37 pt, +0.78 pt] over 16 seeds, 15/16 agree, **reproduced** '
            '(5 seeds: +0.61 pt [-0.31 pt, +1.54 pt], inconclusive).') in text
    # revision 3.1: the seeds trained again bring the interval inside the margin; the first reading is shown beside
    ext = {'sam_vit_top1': _claim('sam_vit_top1', [-0.28, 1.39, 0.28, 1.39, 0.28] + [0.0] * 11)}
    first = {'sam_vit_top1': _claim('sam_vit_top1', [-0.28, 1.39, 0.28, 1.39, 0.28] + [0.56] * 11)}
    text = extended_report.headline(list(five.values()), ext, first)
    assert ('SAM raises the ViT\'s top-1: +0.19 pt [-0.07 pt, +0.45 pt] over 16 seeds, 4/16 agree, **not reproduced** '
            '(the interval lies inside ±1 pt: a gain that large is ruled out on this data; 5 seeds: +0.61 pt '
            '[-0.31 pt, +1.54 pt], inconclusive; every run at its first schedule, as revision 3 first read it before '
            'revision 3.1 trained the seeds that missed the convergence rule again: +0.58 pt [+0.37 pt, +0.78 pt], '
            'reproduced).') in text


def test_section_gives_the_power_table_the_per_seed_values_and_the_new_runs(tmp_path):
    seeds = list(range(16))
    r = run_results.load_results(fake_runs(tmp_path / 'runs', seeds=seeds), plan.ARMS, seeds)
    five = claims.evaluate({a: ms[:5] for a, ms in r.items()})
    ext = {c.claim.key: c for c in claims.evaluate_extended(r)}
    powers = {c.claim.key: power.claim_power(c.claim.key, [0.1, 0.2, -0.1, 0.3, 0.05], c.claim.margin,
                                             c.claim.direction) for c in five}
    lines = extended_report.extended_section(r, five, ext, powers, 'Revision 3 trained these runs.', ['![x](x.png)'])
    assert lines[0] == '## More seeds where more seeds can settle a claim (revision 3)'
    assert '**SAM raises the ViT\'s top-1** (vit-sam, Sec. 4, Table 2). 5 seeds: +2.00 pt [+2.00 pt, +2.00 pt], ' \
           '5/5 agree, **reproduced**. 16 seeds (fixed at 16): +2.00 pt [+2.00 pt, +2.00 pt], 16/16 agree, ' \
           '**reproduced**.' in lines
    assert '- ViT + AdamW: 97.5 ± 4.8 (' + ', '.join(f'{90.0 + s:.1f}' for s in seeds) + ')' in lines
    assert '| ViT conv stem + AdamW | 5-8 | 96.5 ± 1.3 % | 95.0, 96.0, 97.0, 98.0 | 4/4 |' in lines
    assert 'Revision 3 trained these runs.' in lines and '![x](x.png)' in lines
    assert not any(line.startswith('Runs that miss') for line in lines)
    r['vit_convstem'][6]['converged'] = False  # seed 6 of the conv stem misses the rule: named
    r['vit_convstem'][6]['top1_curve'] = [90.0] * 48 + [91.0] * 12
    lines = extended_report.extended_section(r, five, ext, powers, None, [])
    assert ('Runs that miss the convergence rule at their final schedule (named, not replaced): vit_convstem seed 6 '
            '(+1.0).') in lines
