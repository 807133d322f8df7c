"""reproduction/measure_run.py: the convergence rule, every quantity measured from a checkpoint, and what it cost."""
import json
import os
import time

import pytest
import torch
from _reproduction import measure_run, plan, tiny_folder


@pytest.mark.parametrize('curve, expected', [
    ([10, 50, 80, 90, 90.2, 90.4, 90.5, 90.5, 90.6, 90.5], True),  # +0.1 in the last 2 epochs: a plateau
    ([10, 50, 80, 90, 90.2, 90.4, 90.5, 90.5, 91.2, 90.5], False),  # +0.7 over the best before: not yet
    ([10, 20, 30, 40, 50, 60, 70, 80, 90, 95], False),  # still climbing
    ([10.0], False),  # one epoch: nothing to compare with
])
def test_convergence_rule(curve, expected):
    assert measure_run.converged(curve) is expected


def test_measure_reads_every_quantity_from_a_checkpoint(tmp_path, monkeypatch):
    import timm

    import timm_ext  # noqa: F401  (registers the models)

    monkeypatch.setattr(measure_run, 'TRAIN_BATCHES', 1)
    monkeypatch.setattr(measure_run, 'VAL_BATCHES', 1)
    monkeypatch.setattr(measure_run, 'SPECTRUM_MAX_ITER', 3)
    data = tiny_folder(tmp_path / 'data')
    arm = plan.ARM_BY_NAME['vit_cb']
    run = tmp_path / 'run'
    run.mkdir()
    torch.manual_seed(0)
    model = timm.create_model(arm.model, num_classes=10, **arm.model_kwargs)
    torch.save({'state_dict': model.state_dict(), 'arch': arm.model}, run / 'last.pth.tar')
    (run / 'summary.csv').write_text('epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n0,2.0,2.0,10.0,50.0,0.001\n'
                                     '1,1.5,1.5,30.0,70.0,0.0005\n')
    m = measure_run.measure(run, arm, 0, data, data)
    assert m['top1_curve'] == [10.0, 30.0] and m['converged'] is False
    assert len(m['spectrum']) == 1 and len(m['spectrum'][0]) == measure_run.SPECTRUM_TOP_K
    assert 0.0 <= m['nep'] <= 1.0
    assert m['cb_layers'] == [2, 3] and len(m['entropy']) == len(m['cls_entropy']) == 4
    assert set(m['activity']) == {f'blocks.{i}.mlp.act' for i in range(4)}
    assert m['lambda_max'] > 0 and m['noisy_loss'] > 0


@pytest.mark.timm_free
def test_main_records_the_measurements_own_wall_clock_cpu_time_and_cores(tmp_path, monkeypatch):
    import timm_ext.data

    def busy_then_idle(run_dir, arm, seed, data_dir, val_dir):  # 0.3 s of CPU, then 0.3 s of waiting
        c0 = time.process_time()
        while time.process_time() - c0 < 0.3:
            pass
        time.sleep(0.3)
        return dict(arm=arm.name, seed=seed)

    monkeypatch.setattr(measure_run, 'measure', busy_then_idle)
    monkeypatch.setattr(measure_run.torch, 'set_num_threads', lambda n: None)  # this process's threads stay
    monkeypatch.setattr(timm_ext.data, 'digits_image_folder', lambda size: tmp_path / 'digits')
    monkeypatch.setattr(timm_ext.data, 'digits_subset_folder', lambda fraction, size: tmp_path / 'subset')
    assert measure_run.main([str(tmp_path), 'vit', '0']) == 0
    m = json.loads((tmp_path / plan.MEASURE_FILE).read_text())
    assert m['arm'] == 'vit' and m['cores'] == os.cpu_count() and m['cpu']
    # wall-clock counts the wait, CPU time does not
    assert 0.3 <= m['measure_cpu_s'] <= m['measure_wall_s'] - 0.2 and m['measure_wall_s'] >= 0.6
