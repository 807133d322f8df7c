"""BufferSnapshot: puts BatchNorm statistics (and every other buffer) back bit-exactly."""
import torch
import torch.nn as nn

from timm_ext.optim.module_buffers import BufferSnapshot


def test_restores_running_stats_and_num_batches_tracked():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4, momentum=None))
    model(torch.randn(2, 3, 8, 8))
    before = {k: v.clone() for k, v in model.state_dict().items() if 'running' in k or 'num_batches' in k}
    snap = BufferSnapshot()
    snap.capture(model)
    copies = list(snap._copies)
    model(torch.randn(2, 3, 8, 8) * 5)
    assert not torch.equal(model[1].running_mean, before['1.running_mean'])
    snap.restore()
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert model[2].num_batches_tracked.item() == 1
    snap.capture(model)  # same layout: the copy storage is reused
    assert all(a is b for a, b in zip(copies, snap._copies))


def test_restore_without_capture_and_module_without_buffers_are_no_ops():
    snap = BufferSnapshot()
    snap.restore()
    snap.capture(None)
    snap.restore()
    snap.capture(nn.Linear(2, 2))
    snap.restore()
