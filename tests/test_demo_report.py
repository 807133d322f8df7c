"""timm_ext.demo.report: the results table, one line per piece (small gaps called noise) and the plot."""
import pytest

from timm_ext.demo.report import NOISE_POINTS, RunResult, contributions, format_table, plot_curves

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)

# --- the report -------------------------------------------------------------------------------------------

def _result(name, top1, loss=1.25, pieces=(), wall=10.0):
    return RunResult(
        name=name, label=name.upper(), pieces=list(pieces), epochs=[1, 2], train_loss=[2.3, loss],
        eval_loss=[2.2, loss - 0.1], eval_top1=[20.0, top1], wall_s=wall, train_images=100, folder=f'/x/{name}')


def test_table_has_every_run_and_the_measured_values():
    table = format_table([_result('a', 55.5), _result('b', 40.0, 1.5)])
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[2] == '| A | 2 | 55.5 % | 55.5 % | 1.250 | 1.150 | 10 s | 20 |'
    assert lines[3].startswith('| B | 2 | 40.0 % | 40.0 % | 1.500 |')


def test_contributions_name_each_piece_and_call_small_gaps_noise():
    runs = [_result('vit', 50.0), _result('full', 90.0, pieces=('conv stem', 'CB', 'SAM'), wall=30),
            _result('no_stem', 60.0, pieces=('CB', 'SAM')), _result('no_cb', 91.0, pieces=('conv stem', 'SAM')),
            _result('no_sam', 95.0, pieces=('conv stem', 'CB'))]
    lines = contributions(runs, val_images=400)
    assert lines == [
        'conv stem + CB + SAM together: +40.0 points (FULL 90.0 % vs VIT 50.0 %, 160 of 400 validation images), '
        'helps here; wall time 30 s vs 10 s',
        'conv stem: +30.0 points (FULL 90.0 % vs NO_STEM 60.0 %, 120 of 400 validation images), helps here; '
        'wall time 30 s vs 10 s',
        f'CB: -1.0 points (FULL 90.0 % vs NO_CB 91.0 %, 4 of 400 validation images), within the noise of one seed '
        f'(under {NOISE_POINTS:g} points); wall time 30 s vs 10 s',
        'SAM: -5.0 points (FULL 90.0 % vs NO_SAM 95.0 %, 20 of 400 validation images), costs accuracy here; '
        'wall time 30 s vs 10 s',
    ]
    # the quick demo has only the first comparison
    assert contributions(runs[:2], 400) == lines[:1]


def test_plot_is_written(tmp_path):
    pytest.importorskip('matplotlib')
    path = plot_curves([_result('a', 55.5)], tmp_path / 'curves.png')
    assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
