"""reproduction/measure_run.py: the convergence rule, and every quantity measured from a checkpoint."""
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
