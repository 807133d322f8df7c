"""reproduction/step_cost.py: each arm's step time over AdamW's, side by side in one process; its passes per step."""
import json

import pytest
from _reproduction import plan, step_cost, supporting_runs


def test_passes_per_step_follow_each_arms_settings():
    by = {a.name: a for a in plan.R5_ARMS}
    expected = {'vit_esam_x2': 1 + 1 / 3 + 0.5, 'vit_mesa_x2': 4 / 3, 'vit_msam_x2': 1.0, 'vit_looksam_x2': 1.2,
                'vit_interval_x2': 1.1, 'vit_gsam_x2': 2.0, 'vit_bsam_x2': 2.0, 'vit_gcsam_x2': 2.0}
    for name, passes in expected.items():
        assert step_cost.passes(by[name]) == pytest.approx(passes), name
    assert step_cost.passes(supporting_runs.ALL_ARMS_BY_NAME['vit_x2']) == 1.0


@pytest.mark.slow
def test_arms_are_timed_against_adamw_in_one_process(tmp_path, monkeypatch):
    monkeypatch.setattr(step_cost, 'PERIOD', 2)
    arms = step_cost.revision_arms('5')
    assert [a.name for a in arms[:3]] == [plan.R5_ADAMW, plan.R5_SAM, 'vit_esam_x2'] and len(arms) == 14
    rows = step_cost.measure([arms[0], arms[1], arms[4]], repeats=1, warmup=0)  # AdamW, SAM, Momentum-SAM
    assert [r['arm'] for r in rows] == [plan.R5_ADAMW, plan.R5_SAM, 'vit_msam_x2']
    assert rows[0]['ratio'] == 1.0 and all(r['step_s'] > 0 for r in rows)
    with pytest.raises(ValueError, match="AdamW, which must come first; got 'vit_sam_x2'"):
        step_cost.measure(arms[1:2], repeats=1)
    out = tmp_path / 'cost.json'
    monkeypatch.setattr(step_cost, 'revision_arms', lambda name: [arms[0], arms[4]])
    assert step_cost.main(['--repeats', '1', '--output', str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved['revision'] == '5' and saved['batch'] == 16 and [r['arm'] for r in saved['rows']] == [
        plan.R5_ADAMW, 'vit_msam_x2']
    with pytest.raises(SystemExit):
        step_cost.main(['--repeats', '0'])
