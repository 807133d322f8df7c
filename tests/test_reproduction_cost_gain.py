"""reproduction/cost_gain.py: revision 5 read back (its pilot, the rule's seeds, failed runs), gain and share against
the reused pair, the Pareto front, and the section's table and plot."""
import json

import pytest
from _reproduction import cost_gain, fake_run, plan, supporting_runs, write_run

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def _pair(gain_sam=1.0):
    adamw = [dict(fake_run(supporting_runs.ALL_ARMS_BY_NAME['vit_x2'], s), top1=97.0) for s in plan.LONG_SEEDS]
    sam = [dict(fake_run(supporting_runs.ALL_ARMS_BY_NAME['vit_sam_x2'], s), top1=97.0 + gain_sam)
           for s in plan.LONG_SEEDS]
    return {plan.R5_ADAMW: adamw, plan.R5_SAM: sam}


def _run(runs, arm, seed, top1, cpu_s=600.0):
    d = write_run(runs, arm, seed)
    m = json.loads((d / 'timm_ext_measurements.json').read_text())
    m['top1'] = top1
    (d / 'timm_ext_measurements.json').write_text(json.dumps(m))
    (d / plan.CPU_FILE).write_text(json.dumps(dict(cpu_s=cpu_s, lanes=2, cores=2)))


def _pilot(runs, top1, skip=''):
    """The check and every arm's pilot run in the cache, each arm's top-1 ``top1(arm index, seed)``."""
    arms = {a.name: a for a in plan.R5_ARMS}
    _run(runs, plan.R5_CHECK[0], 0, 97.0)
    for i, name in enumerate(plan.PLAN_BY_NAME['5'].arms):
        for seed in plan.R5_PILOT_SEEDS:
            if f'{name}-s{seed}' != skip:
                _run(runs, arms[name], seed, top1(i, seed))
    return arms


def test_gain_share_and_the_pareto_front():
    pair = _pair()
    arm = [dict(seed=s, top1=97.5 + 0.1 * s) for s in (0, 1, 2)]
    g = cost_gain.gain(arm, pair[plan.R5_ADAMW])
    assert g.n == 3 and g.mean == pytest.approx(0.6)
    assert cost_gain.share(arm, pair[plan.R5_ADAMW], pair[plan.R5_SAM]) == pytest.approx(0.6)
    pts = [('a', 1.0, 0.0, -1, 1, True), ('b', 1.1, 0.5, 0, 1, True), ('c', 2.0, 0.4, 0, 1, True),
           ('d', 2.0, 0.9, 0, 1, False)]
    assert cost_gain.pareto(pts) == ['a', 'b', 'd']  # c costs as much as d and gains less


def test_revision_5_is_read_back_at_the_seeds_its_rule_gives_failed_runs_named(tmp_path):
    rev, runs, pair = plan.PLAN_BY_NAME['5'], tmp_path / 'runs', _pair()
    arms = _pilot(runs, lambda i, seed: 98.0 + 0.28 * ((seed + i) % 3 - 1), skip='vit_bsam_x2-s1')  # it failed
    failed = {'vit_bsam_x2-s1': dict(why='exit code 1: loss is nan', cpu_s=30.0)}
    r, failed_out, decisions, read = cost_gain.load_revision(rev, runs, None, pair, failed)
    by = {d.key: d for d in decisions}
    assert by['r5_bsam'].status == 'dropped' and 'seed 1: exit code 1: loss is nan' in by['r5_bsam'].why
    assert failed_out == failed and 'vit_bsam_x2' in r and [m['seed'] for m in r['vit_bsam_x2']] == [0, 2]
    # the claims the rule reads need their extra seeds: not trained here, so none is read yet, and none is read short
    assert read == {} and any(d.status == 'read' for d in decisions)
    first = next(d for d in decisions if d.status == 'read')
    arm = arms[plan.CLAIM_BY_KEY[first.key].b]
    for seed in range(3, first.n):
        _run(runs, arm, seed, 98.0)
    r, _, decisions, read = cost_gain.load_revision(rev, runs, None, pair, failed)
    assert list(read) == [first.key] and read[first.key].n == first.n == len(r[arm.name])
    assert read[first.key].claim.a == plan.R5_SAM  # against SAM, paired by seed


def test_the_section_tabulates_every_arm_and_draws_the_plot(tmp_path):
    pytest.importorskip('matplotlib', reason='the plot needs matplotlib (pip install "timm-ext[demo]")')
    rev, runs, pair = plan.PLAN_BY_NAME['5'], tmp_path / 'runs', _pair()
    _pilot(runs, lambda i, seed: 97.5 + 0.28 * ((seed + i) % 3))
    r, failed, decisions, read = cost_gain.load_revision(rev, runs, None, pair, {})
    labels = {**{a.name: a.label for a in plan.R5_ARMS}, plan.R5_ADAMW: 'ViT + AdamW', plan.R5_SAM: 'ViT + SAM'}
    cost = dict(rows=[dict(arm=n, passes=1.0, ratio=1.0 + 0.1 * i, ratio_cpu=1.0)
                      for i, n in enumerate((plan.R5_ADAMW, plan.R5_SAM, *rev.arms))])
    stopped = [dict(run='vit_esam_x2-s0', epochs=40, last_written='2026-12-02 14:00:00', why='stopped')]
    lines = cost_gain.cost_gain_section(rev, r, pair[plan.R5_ADAMW], pair[plan.R5_SAM], labels, decisions, read,
                                        cost, {}, stopped, ('registered', 'why'), tmp_path / 'figs', 'figs')
    text = '\n'.join(lines)
    assert lines[0] == f'## {cost_gain.TITLE}' and '**registered** (why)' in text
    table = [x for x in lines if x.startswith('| ViT + ')]
    assert len(table) == 2 + 12 and table[0].startswith('| ViT + AdamW | 1.00 | 1.00; 1.00 | 16 |')
    # no claim is read at its pilot's 3 seeds: out of reach, dropped, or waiting for the seeds its rule gave it
    waiting = ('out of reach: ', 'dropped: ', 'not read: its rule gave it')
    assert all(any(x in row for x in waiting) for row in table[2:])
    assert 'the reused runs are what this machine trains' not in text  # the check's curve differs from the reused one
    assert 'each pair below spans two machines' in text
    assert (tmp_path / 'figs' / 'cost_gain.png').is_file() and 'On the Pareto front' in text
    assert 'vit_esam_x2-s0 after 40 epochs (2026-12-02 14:00:00 UTC)' in text


def test_an_arm_the_pilot_dropped_is_neither_drawn_nor_on_the_front(tmp_path):
    pytest.importorskip('matplotlib', reason='the plot needs matplotlib (pip install "timm-ext[demo]")')
    rev, runs, pair = plan.PLAN_BY_NAME['5'], tmp_path / 'runs', _pair()
    looksam = rev.arms.index('vit_looksam_x2')
    _pilot(runs, lambda i, seed: 10.0 if i == looksam else 97.5 + 0.28 * ((seed + i) % 3))  # at chance: dropped
    r, failed, decisions, read = cost_gain.load_revision(rev, runs, None, pair, {})
    labels = {**{a.name: a.label for a in plan.R5_ARMS}, plan.R5_ADAMW: 'ViT + AdamW', plan.R5_SAM: 'ViT + SAM'}
    # LookSAM the cheapest: were it drawn, no arm could beat its cost and it would sit on the front
    cost = dict(rows=[dict(arm=n, passes=1.0, ratio=0.5 if n == 'vit_looksam_x2' else 1.0 + 0.1 * i, ratio_cpu=1.0)
                      for i, n in enumerate((plan.R5_ADAMW, plan.R5_SAM, *rev.arms))])
    lines = cost_gain.cost_gain_section(rev, r, pair[plan.R5_ADAMW], pair[plan.R5_SAM], labels, decisions, read,
                                        cost, {}, [], ('registered', 'why'), tmp_path / 'figs', 'figs')
    [front] = [x for x in lines if x.startswith('On the Pareto front')]
    head, _, tail = front.partition('Not drawn')
    assert 'LookSAM' not in head and head.count('ViT + ') >= 1
    assert tail.startswith(', and not on the front: the arms the pilot dropped') and 'ViT + LookSAM (k 5) -87.' in tail
    assert any(x.startswith('| ViT + LookSAM (k 5) |') and 'dropped: ' in x for x in lines)  # still in the table


def test_the_plot_labels_close_points_without_overlap_and_shares_one_label_at_one_gain():
    """Revision 5's variants at about 2x AdamW's cost sit within a few hundredths of each other: every label is
    readable (no two overlap), and points of one mean gain side by side share one label."""
    pytest.importorskip('matplotlib')
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    pts = [('ViT + GSAM', 1.92, 0.93), ('ViT + ESAM', 1.95, 0.37), ('ViT + SAM-ON', 1.95, 0.65),
           ('ViT + WSAM', 1.97, 0.65), ('ViT + GC-SAM', 2.02, 0.65), ('ViT + ASAM', 1.99, 1.21),
           ('ViT + SAM', 1.80, 0.94)]
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    ax.plot([p[1] for p in pts], [p[2] for p in pts], 'o')
    ax.set_ylim(-3, 4)
    cost_gain._place_labels(fig, ax, pts)
    renderer = fig.canvas.get_renderer()
    texts = {t.get_text(): t for t in ax.texts}
    assert sorted(texts) == ['ASAM', 'ESAM', 'GSAM', 'SAM', 'SAM-ON, WSAM, GC-SAM']
    for t in texts.values():
        t.update_positions(renderer)
    boxes = [Text.get_window_extent(t, renderer) for t in texts.values()]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)
