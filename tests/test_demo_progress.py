"""timm_ext.demo.progress: the progress bar's text and the ETA of the remaining work laid out on the lanes."""
from pathlib import Path

import pytest

from timm_ext.demo.jobs import Job
from timm_ext.demo.progress import Progress, format_eta

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def _job(name, epochs=2, cost=1.0, tmp=Path('/x')):
    return Job(name, ['true'], tmp / f'{name}.log', tmp / name / 'summary.csv', epochs, cost)


def _progress(lanes=2):
    return Progress([_job('a', 4, 2.0), _job('b', 4, 1.0), _job('c', 4, 1.0)], lanes)


def test_eta_lays_the_remaining_work_out_on_the_lanes():
    progress = _progress()
    progress.started.update(a=0.0, b=0.0)
    assert progress.eta(12.0) is None  # no epoch finished yet: no pace, no ETA
    # b: 5 s of start-up, then 10 s an epoch (1 unit); a (2 units an epoch) ends its first epoch at 25 s
    progress.epoch_done('b', 1, 15.0)
    progress.epoch_done('b', 2, 25.0)
    progress.epoch_done('a', 1, 25.0)
    assert progress.pace() == pytest.approx((10.0, 5.0))
    # at 30 s: a has 6 units left (60 s) less the 5 s into its epoch: 55 s; b 2 units less 5 s: 15 s;
    # then c (start-up + 4 units: 45 s) goes on b's core: 60 s
    assert progress.eta(30.0) == pytest.approx(60.0)
    progress.finished['b'] = 45.0
    progress.started['c'] = 45.0
    assert progress.eta(45.0) == pytest.approx(max(60 - 20.0, 5 + 40.0))


def test_eta_before_a_second_epoch_counts_start_up_in_the_pace():
    progress = _progress(lanes=1)
    progress.started.update(a=0.0)
    progress.epoch_done('a', 1, 30.0)  # 2 units in 30 s, start-up included: 15 s a unit, no separate start-up
    assert progress.pace() == pytest.approx((15.0, 0.0))
    # one core: a's 6 units (90 s) less the 10 s into its epoch, then b and c (4 units each) in a row
    assert progress.eta(40.0) == pytest.approx(80.0 + 60.0 + 60.0)


def test_progress_text_names_the_eta_and_the_running_runs():
    progress = Progress([_job('vit', 4), _job('full', 4, 2.0)], lanes=2)
    assert progress.total_epochs == 8
    progress.started.update(full=100.0, vit=100.0)
    assert progress.postfix(105.0) == 'ETA --:--, training: full 0/4, vit 0/4'
    progress.epoch_done('vit', 1, 110.0)
    progress.epoch_done('vit', 2, 115.0)
    progress.finished['vit'] = 120.0  # not realistic (2 of 4 epochs) but shows that finished runs leave the list
    assert progress.done_epochs == 2
    # vit: 5 s a unit after 5 s of start-up; full: start-up + 8 units = 45 s from its start, 30 s left at 115 s
    assert progress.postfix(115.0) == 'ETA 0:30, training: full 0/4'
    assert format_eta(3725.4) == 'ETA 62:05' and format_eta(None) == 'ETA --:--'
