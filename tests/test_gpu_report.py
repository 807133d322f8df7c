"""benchmarks/gpu_report.py: the ratio and goal logic on fake timings, the budgeted timing loop, the command line's
errors, and the --smoke run (what CI runs) with every row, finite numbers and evaluated goals."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location('gpu_report', REPO / 'benchmarks' / 'gpu_report.py')
gpu_report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_report)  # a script beside the package; it puts benchmarks/ on sys.path
_gpu_rows = sys.modules['_gpu_rows']
_gpu_timing = sys.modules['_gpu_timing']
Goal, Row = _gpu_rows.Goal, _gpu_rows.Row

EXPECTED_ROWS = {
    'SAM family / AdamW': ['SAM / AdamW step', 'GSAM / AdamW step', 'SAM interval=5 / AdamW step',
                           'LookSAM k=5 / AdamW step', 'SAM extra peak memory', 'SAM state (restore copy + buffers)'],
    **{f'CB: {cb} / {base}': ['train-step throughput', 'inference throughput', 'A/A train (noise floor)',
                              'A/A inference (noise floor)']
       for cb, base in [('vit_small_cb', 'vit_small_patch16_224'), ('vit_base_cb', 'vit_base_patch16_224'),
                        ('vit_small_cbs', 'vit_small_patch16_224')]},
    'AlterNet-50 / pre-act ResNet-50': ['train-step throughput', 'inference throughput'],
    'AlterNet: official / ours': ['train (fwd+bwd) speed-up', 'inference speed-up'],
    'conv-stem ViT-S / patchify ViT-S': ['train-step throughput', 'inference throughput'],
    'HVP / (fwd+bwd)': ['one HVP / one forward+backward'],
}


# ---- ratios and goals on fake timings ----------------------------------------------------------------------------

def test_ratios_on_fake_timings():
    steps = {'adamw': 0.25, 'sam': 0.505, 'cb': 0.101, 'base': 0.1}
    assert _gpu_rows.time_ratio(steps, 'sam', 'adamw') == pytest.approx(2.02)
    assert _gpu_rows.speed_ratio(steps, 'cb', 'base') == pytest.approx(0.1 / 0.101)  # throughput: base time / cb time
    assert _gpu_rows.copies(344e6, 344_000_000) == pytest.approx(1.0)
    assert _gpu_rows.copies(None, 344_000_000) is None


def test_goals_are_evaluated_at_their_bounds():
    at_most, at_least = Goal('<=', 2.02, 'issue 20'), Goal('>=', 0.99, 'issue 20')
    assert at_most.met(2.02) is True and at_most.met(2.021) is False
    assert at_least.met(0.99) is True and at_least.met(0.989) is False
    assert at_most.met(None) is None and at_most.met(float('nan')) is None  # nothing measured: not judged
    assert str(at_most) == '<= 2.02'
    with pytest.raises(ValueError, match=r"Goal op '<': use one of \['<=', '>='\]"):
        Goal('<', 1.0, 'x')


def test_rows_met_and_the_report_verdict():
    sam = Row('SAM', 'SAM / AdamW step', 2.1, goal=Goal('<=', 2.02, 'issue 20'))
    cb = Row('CB', 'train', 1.0, goal=Goal('>=', 0.99, 'issue 20'))
    report_only = Row('AlterNet', 'train', 0.9, claim=1.2)
    memory_on_cpu = Row('SAM', 'peak', None, goal=Goal('<=', 1.01, 'issue 20'))
    assert (sam.met, cb.met, report_only.met, memory_on_cpu.met) == (False, True, None, None)
    assert _gpu_rows.all_met([cb, report_only, memory_on_cpu]) is True
    assert _gpu_rows.all_met([sam, cb]) is False
    assert _gpu_rows.all_met([report_only, memory_on_cpu]) is None
    assert sam.to_json() == dict(measurement='SAM', name='SAM / AdamW step', value=2.1, unit='x',
                                 goal=dict(op='<=', target=2.02, source='issue 20'), met=False, claim=None, note='')


def test_markdown_shows_values_goals_and_verdicts():
    rows = [Row('SAM', 'SAM / AdamW step', 2.1, goal=Goal('<=', 2.02, 'issue 20')),
            Row('SAM', 'peak', None, unit=' param copies', goal=Goal('<=', 1.01, 'issue 20')),
            Row('AlterNet', 'train', 0.9, claim=1.2, note='max |diff| 1e-05')]
    report = dict(device='NVIDIA H100 80GB HBM3', device_type='cuda', torch='2.x', timm='1.x', timm_ext='0.1',
                  amp='bf16', smoke=False, elapsed_s=201.4, budget_s=220.,
                  rows=[r.to_json() for r in rows],
                  measurements=[dict(name='SAM', config='vit_base', status='ok', time_ms={'adamw': 250.0},
                                     peak_mib={'adamw': 20480.0}, reps=5),
                                dict(name='official', config='CIFAR', status='skipped', reason='no --official PATH')])
    text = _gpu_rows.markdown(report)
    assert text.startswith('GPU report: NVIDIA H100 80GB HBM3 (cuda)')
    assert '| SAM | SAM / AdamW step | 2.100x | <= 2.02 | **no** |  |  |' in text
    assert '| SAM | peak | n/a | <= 1.01 | n/a |  |  |' in text
    assert '| AlterNet | train | 0.900x |  | report | 1.20 | max /diff/ 1e-05 |' in text  # a | would split the cell
    assert '| SAM | vit_base | adamw | 250.00 | 20480 | 5 |' in text
    assert '| official | CIFAR | skipped: no --official PATH | | | |' in text
    assert 'mean nothing' not in text


# ---- the budget and the timing loop -------------------------------------------------------------------------------

def test_budget_shares_what_is_left_by_weight():
    budget = _gpu_timing.Budget(100., {'a': 3., 'b': 1.}, start=_gpu_timing.time.perf_counter())
    assert budget.take('a') == pytest.approx(75., abs=0.5)
    assert budget.take('b') == pytest.approx(100., abs=0.5)  # the last one gets all that is left
    spent = _gpu_timing.Budget(10., {'a': 1.}, start=_gpu_timing.time.perf_counter() - 20.)
    assert spent.left() == 0. and spent.take('a') == 0.


def test_interleaved_medians_run_in_turn_between_min_and_max_reps():
    calls = []
    fns = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    medians, reps = _gpu_timing.interleaved_medians(fns, torch.device('cpu'), seconds=0., warmup=1, min_reps=3,
                                                    max_reps=10)
    assert reps == 3 and calls == ['a', 'b'] * 4  # no time left: the minimum, after one warm-up round
    assert set(medians) == {'a', 'b'} and all(m >= 0 for m in medians.values())
    calls.clear()
    _, reps = _gpu_timing.interleaved_medians(fns, torch.device('cpu'), seconds=60., warmup=0, min_reps=2,
                                              max_reps=5)
    assert reps == 5 and len(calls) == 10  # time to spare: the maximum


def test_memory_windows_build_each_candidate_and_warm_it_up():
    built, calls = [], []

    def builder(name):
        def build():
            built.append(name)
            return lambda: calls.append(name)
        return build

    fns, peaks = _gpu_timing.build_in_memory_windows({'a': builder('a'), 'b': builder('b')}, torch.device('cpu'),
                                                     warmup=2)
    assert built == ['a', 'b'] and calls == ['a', 'a', 'b', 'b'] and set(fns) == {'a', 'b'}
    assert peaks == {'a': None, 'b': None}  # no allocator statistics on CPU


# ---- the command line ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('argv, message', [
    (['--device', 'cpu'], 'gpu_report.py: error: --device cpu: the full sizes (ViT-B/16 at batch 256) take hours '
                          'off a GPU; add --smoke for the tiny-size run'),
    (['--smoke', '--device', 'cpu', '--budget-s', '0'],
     'gpu_report.py: error: --budget-s 0: give a positive number of seconds, e.g. 220'),
    (['--smoke', '--device', 'cpu', '--official', '{tmp}'],
     'gpu_report.py: error: --official {tmp}: no models/alternet.py there; give a how-do-vits-work checkout'),
    (['--smoke', '--device', 'cpu', '--out', '{tmp}'],
     'gpu_report.py: error: --out {tmp}: already holds gpu_report.json; give a new folder (nothing is overwritten)'),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, tmp_path, capsys):
    (tmp_path / 'gpu_report.json').write_text('{"mine": 1}')
    with pytest.raises(SystemExit) as exc:
        gpu_report.parse_args([a.format(tmp=tmp_path) for a in argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == message.format(tmp=tmp_path)
    assert (tmp_path / 'gpu_report.json').read_text() == '{"mine": 1}'


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the error given where CUDA is missing')
def test_cuda_device_without_cuda_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_report.parse_args(['--device', 'cuda'])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        'gpu_report.py: error: --device cuda: CUDA is not available here; use --device cpu --smoke')


# ---- the smoke run (CI) -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_smoke_run_reports_every_row_with_finite_numbers_and_judged_goals(tmp_path, capsys):
    out = tmp_path / 'report'
    returned = gpu_report.main(['--smoke', '--device', 'cpu', '--out', str(out)])
    report = json.loads((out / 'gpu_report.json').read_text())
    assert report == json.loads(json.dumps(returned))
    assert report['schema'] == 'timm-ext gpu report 1' and report['smoke'] is True and report['amp'] == 'off'
    assert report['device_type'] == 'cpu' and report['device'] and report['cpus'] >= 1
    assert report['torch'] == torch.__version__
    assert set(report) >= {'timm', 'timm_ext', 'budget_s', 'elapsed_s', 'date', 'measurements', 'rows',
                           'all_goals_met'}
    assert report['argv'] == ['--smoke', '--device', 'cpu', '--out', str(out)]
    assert report['sizes']['img'] == 32 and report['sizes']['batch'] == 4 and report['sizes']['vit']['depth'] == 2
    rows = {}
    for r in report['rows']:
        assert set(r) == {'measurement', 'name', 'value', 'unit', 'goal', 'met', 'claim', 'note'}
        rows.setdefault(r['measurement'], []).append(r)
    assert {m: [r['name'] for r in rs] for m, rs in rows.items()} == EXPECTED_ROWS
    no_value = {('SAM family / AdamW', 'SAM extra peak memory')} | {
        ('AlterNet: official / ours', n) for n in EXPECTED_ROWS['AlterNet: official / ours']}
    for r in report['rows']:
        if (r['measurement'], r['name']) in no_value:  # CUDA-only memory; the official code was not given
            assert r['value'] is None and r['met'] is None
            continue
        assert math.isfinite(r['value']) and r['value'] > 0, r
        if r['goal'] is not None:
            assert isinstance(r['met'], bool), r
            assert r['met'] == ({'<=': r['value'] <= r['goal']['target'],
                                 '>=': r['value'] >= r['goal']['target']}[r['goal']['op']])
        else:
            assert r['met'] is None
    sam_state = rows['SAM family / AdamW'][-1]
    assert sam_state['value'] == 1.0 and sam_state['met'] is True  # one restore copy, no buffers in a ViT
    assert [r['claim'] for r in rows['AlterNet-50 / pre-act ResNet-50']] == [1.2, 1.2]
    measurements = {m['name']: m for m in report['measurements']}
    assert list(measurements) == list(EXPECTED_ROWS)
    for name, m in measurements.items():
        if name == 'AlterNet: official / ours':
            assert m['status'] == 'skipped' and m['reason'] == 'no --official PATH given'
            continue
        assert m['status'] == 'ok' and m['reps'] == 2
        assert m['time_ms'] and all(math.isfinite(t) and t > 0 for t in m['time_ms'].values())
        assert m['peak_mib'] and all(p is None for p in m['peak_mib'].values())  # no allocator peak on CPU
    assert set(measurements['SAM family / AdamW']['time_ms']) == {
        'adamw', 'sam', 'gsam', 'sam interval=5', 'looksam k=5'}
    md = (out / 'gpu_report.md').read_text()
    assert md.startswith('GPU report: ') and 'Smoke sizes check that every measurement runs' in md
    assert md in capsys.readouterr().out  # printed as well as written
