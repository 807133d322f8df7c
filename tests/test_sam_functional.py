"""sam_functional: the paper's arithmetic over tensor lists, and the copies of a model's buffers that put BatchNorm
statistics (and every other buffer) back bit-exactly after SAM's second pass."""

import pytest
import torch
import torch.nn as nn

from timm_ext.optim.sam_functional import hold_buffers_, restore_buffers_

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def test_restores_running_stats_and_num_batches_tracked():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4, momentum=None))
    model(torch.randn(2, 3, 8, 8))
    before = {k: v.clone() for k, v in model.state_dict().items() if 'running' in k or 'num_batches' in k}
    copies = {}
    held = hold_buffers_(model, copies)
    model(torch.randn(2, 3, 8, 8) * 5)
    assert not torch.equal(model[1].running_mean, before['1.running_mean'])
    restore_buffers_(held, copies)
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert model[2].num_batches_tracked.item() == 1
    storage = [c.data_ptr() for c in copies.values()]
    held = hold_buffers_(model, copies)  # same buffers again: the copies are reused, and a second round is exact
    assert [c.data_ptr() for c in copies.values()] == storage
    after = {k: v.clone() for k, v in model.state_dict().items() if k in before}
    model(torch.randn(2, 3, 8, 8) * 3)
    restore_buffers_(held, copies)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in after.items())


def test_no_module_no_buffers_and_a_module_whose_buffers_changed():
    copies = {}
    assert hold_buffers_(None, copies) == [] and copies == {}  # SAM without a model: nothing to keep
    restore_buffers_([], copies)
    linear = nn.Linear(2, 2)
    weight = linear.weight.detach().clone()
    assert hold_buffers_(linear, copies) == []
    restore_buffers_([], copies)
    assert torch.equal(linear.weight, weight)
    bn = nn.BatchNorm1d(3)
    hold_buffers_(bn, copies)
    bn.running_mean = torch.zeros(3)  # a new tensor (as model.to() may make): the old copies are dropped
    held = hold_buffers_(bn, copies)
    assert len(copies) == 3 and all(b in copies for b in held) and held[0] is bn.running_mean
