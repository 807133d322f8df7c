"""reproduction/sam_variants_digits.py's table: every optimizer against AdamW paired by seed (no training here)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_script():
    """The script imports ``digits_32px`` from beside itself, as it does when run as ``python reproduction/...``."""
    folder = str(REPO / 'reproduction')
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location('sam_variants_digits', Path(folder, 'sam_variants_digits.py'))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


sam_variants_digits = _load_script()


def _row(variant, seed, top1, loss=2.0, wall=60.0):
    return dict(variant=variant, label=variant, seed=seed, top1=top1, train_loss=loss, wall_s=wall, epochs=4)


def test_table_compares_every_variant_with_adamw_paired_by_seed():
    results = [
        _row('adamw', 0, 90.0, 1.5, 60.0), _row('adamw', 1, 92.0, 1.6, 62.0), _row('adamw', 2, 91.0, 1.7, 64.0),
        # SAM's seeds out of order: the pairing goes by seed, not by position. Diffs 1, 3, 1.5.
        _row('sam', 2, 92.5), _row('sam', 0, 91.0), _row('sam', 1, 95.0),
        _row('gsam', 0, 92.0), _row('gsam', 1, 94.0), _row('gsam', 2, 93.0),          # +2 on every seed
        _row('looksam', 0, 89.0), _row('looksam', 1, 91.0), _row('looksam', 2, 90.0),  # -1 on every seed
        _row('interval_sam', 0, 80.0),                                                  # one seed: no interval
    ]
    lines = sam_variants_digits.table(results).splitlines()
    assert lines[0] == ('| optimizer | top-1 (%) | top-1 - AdamW, 95 % CI | beats AdamW? | final train loss '
                        '| wall time (s) | seeds |')
    rows = {line.split(' | ')[0].lstrip('| '): line for line in lines[2:]}
    assert rows['AdamW'] == '| AdamW | 91.0 ± 1.0 | (reference) |  | 1.60 ± 0.10 | 62 ± 2 | 3 |'
    # diffs 1, 3, 1.5: mean 1.83, sd sqrt(13/12), t(0.975, 2) = 4.3027 -> 1.83 ± 2.59
    assert rows['SAM (rho 0.05)'] == ('| SAM (rho 0.05) | 92.8 ± 2.0 | +1.8 pt [-0.8 pt, +4.4 pt] '
                                      '| inconclusive (3/3 seeds agree) | 2.00 ± 0.00 | 60 ± 0 | 3 |')
    assert ('| 93.0 ± 1.0 | +2.0 pt [+2.0 pt, +2.0 pt] | reproduced (3/3 seeds agree) |'
            in rows['GSAM (rho 0.05 -> 0, alpha 0.4)'])
    assert ('| 90.0 ± 1.0 | -1.0 pt [-1.0 pt, -1.0 pt] | the opposite (0/3 seeds agree) |'
            in rows['LookSAM, k 5 (rho 0.05, alpha 0.7)'])
    assert rows['SAM, interval 5 (rho 0.25)'] == ('| SAM, interval 5 (rho 0.25) | 80.0 | n/a (AdamW on < 2 of the '
                                                  'same seeds) |  | 2.00 | 60 | 1 |')
    assert len(lines) == 2 + 5


def test_table_without_adamw_has_no_differences():
    lines = sam_variants_digits.table([_row('sam', 0, 50.0), _row('sam', 1, 52.0)]).splitlines()
    assert lines[2] == ('| SAM (rho 0.05) | 51.0 ± 1.4 | n/a (AdamW on < 2 of the same seeds) |  | 2.00 ± 0.00 '
                        '| 60 ± 0 | 2 |')


def test_main_trains_seed_by_seed_with_the_shared_runner_and_writes_the_table(tmp_path, monkeypatch, capsys):
    """train.py replaced by a process that writes one epoch's summary.csv: the rest is the real runner."""
    pytest.importorskip('sklearn', reason='the digits data needs scikit-learn (pip install "timm-ext[demo]")')
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    made = []

    def fake_train_jobs(runs, output, timm_train=None):
        made.extend(runs)
        top1 = {'adamw': 90.0, 'sam': 92.0}
        code = ('import os, sys; os.makedirs(sys.argv[1]); open(os.path.join(sys.argv[1], "summary.csv"), "w")'
                '.write("epoch,train_loss,eval_loss,eval_top1\\n0,1.5,1.4," + sys.argv[2] + "\\n")')
        return [run.job([sys.executable, '-c', code, str(output / run.name),
                         str(top1[run.opt.replace('samadamw', 'sam')] + int(run.name[-1]))], output) for run in runs]

    monkeypatch.setattr(sam_variants_digits, 'train_jobs', fake_train_jobs)
    out = tmp_path / 'out'
    sam_variants_digits.main(['--epochs', '1', '--seeds', '0', '1', '--only', 'adamw', 'sam', '--output', str(out)])
    assert [r.name for r in made] == ['adamw_seed0', 'sam_seed0', 'adamw_seed1', 'sam_seed1']  # seeds outermost
    assert made[0].settings[-2:] == ('--seed', '0') and made[0].model_kwargs == sam_variants_digits.VIT
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(':')[0].strip() for line in lines[:4]] == ['adamw seed 0', 'sam seed 0', 'adamw seed 1',
                                                                  'sam seed 1']
    assert lines[1].startswith('           sam seed 0: top-1 92.0 %, train loss 1.500, ')
    results = json.loads((out / 'results.json').read_text())
    assert [(r['variant'], r['seed'], r['top1']) for r in results] == [('adamw', 0, 90.0), ('sam', 0, 92.0),
                                                                       ('adamw', 1, 91.0), ('sam', 1, 93.0)]
    table = (out / 'table.md').read_text()
    assert '| SAM (rho 0.05) | 92.5 ± 0.7 | +2.0 pt [+2.0 pt, +2.0 pt] | reproduced (2/2 seeds agree) |' in table
