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
    assert snap.held
    model(torch.randn(2, 3, 8, 8) * 5)
    assert not torch.equal(model[1].running_mean, before['1.running_mean'])
    snap.restore()
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert model[2].num_batches_tracked.item() == 1
    assert not snap.held
    snap.capture(model)  # same layout again (the copy storage is reused): a second round is exact too
    after = {k: v.clone() for k, v in model.state_dict().items() if k in before}
    model(torch.randn(2, 3, 8, 8) * 3)
    snap.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in after.items())


def test_restore_without_capture_and_module_without_buffers_are_no_ops():
    model = nn.BatchNorm1d(3)
    snap = BufferSnapshot()

    def stats():
        return [b.clone() for b in model.buffers()]

    model(torch.randn(4, 3))
    first = stats()
    snap.restore()  # never captured: must not write anything (e.g. empty or stale copies)
    assert all(torch.equal(a, b) for a, b in zip(stats(), first))

    snap.capture(model)
    model(torch.randn(4, 3) * 3)
    snap.restore()
    assert all(torch.equal(a, b) for a, b in zip(stats(), first))
    model(torch.randn(4, 3) + 5)
    third = stats()
    snap.restore()  # the capture was used up by the previous restore: this one must not go back to `first`
    assert all(torch.equal(a, b) for a, b in zip(stats(), third)) and model.num_batches_tracked.item() == 2

    snap.capture(None)  # no module (SAM without a model) and a module without buffers: nothing to keep
    model(torch.randn(4, 3))
    snap.restore()
    assert model.num_batches_tracked.item() == 3
    linear = nn.Linear(2, 2)
    weight = linear.weight.detach().clone()
    snap.capture(linear)
    snap.restore()
    assert not snap.held and torch.equal(linear.weight, weight)
