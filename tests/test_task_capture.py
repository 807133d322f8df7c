"""Capture/replay of timm training-task calls: found lazily, cheap, no leaks, replays faithfully."""
import gc
import weakref
from typing import Dict

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.task import ClassificationTask, TrainingTask

from timm_ext.optim import SAM, task_capture


def _model():
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))


def _batch(n=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _no_sam_alive():
    gc.collect()
    nn.Identity()(torch.zeros(1))  # any forward lets a left-over global hook notice nobody waits
    return not task_capture.is_watching()


def test_nothing_installed_without_sam():
    assert _no_sam_alive()
    assert not torch.nn.modules.module._global_forward_hooks


def test_global_hook_only_until_the_task_is_found():
    assert _no_sam_alive()
    model = _model()
    other = ClassificationTask(_model(), nn.CrossEntropyLoss(), verbose=False)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    assert task_capture.is_watching()
    other(*_batch())  # a task that does not own the optimizer's parameters is ignored
    assert task_capture.is_watching() and opt.recorder.task is None
    task(*_batch())
    assert not task_capture.is_watching() and opt.recorder.task is task
    assert len(opt.recorder.calls) == 1 and len(task._forward_hooks) == 1 and not other._forward_hooks


def test_closure_or_explicit_use_removes_global_hook():
    assert _no_sam_alive()
    model = _model()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    opt.step(lambda: F.cross_entropy(model(x), y).backward())
    assert not task_capture.is_watching()


def test_record_is_dropped_at_step_and_nothing_leaks():
    model = _model()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = _batch()
    x_ref = weakref.ref(x)
    task(x, y)['loss'].backward()
    with torch.no_grad():
        task(x, y)  # no-grad calls (e.g. evaluation through the task) are not recorded
    assert len(opt.recorder.calls) == 1
    opt.step()
    assert opt.recorder.calls == []  # the replay itself was not recorded either
    del x, y
    gc.collect()
    assert x_ref() is None
    opt_ref = weakref.ref(opt)
    del opt
    gc.collect()
    assert opt_ref() is None  # the task's hook does not keep the optimizer alive
    task(*_batch())  # and is harmless afterwards


class _WeightedTask(TrainingTask):
    """A task with a keyword argument, to check that kwargs are replayed."""

    def __init__(self, model):
        super().__init__(verbose=False)
        self.trainable_module = model

    def forward(self, input, target, weight=None) -> Dict[str, torch.Tensor]:
        out = self.trainable_module(input)
        return {'loss': F.cross_entropy(out, target, weight=weight), 'output': out}


def test_kwargs_are_replayed():
    x, y = _batch()
    weight = torch.tensor([1.0, 5.0, 0.1])
    results = []
    for mode in ('task', 'closure'):
        torch.manual_seed(0)
        model = _model()
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3)
        if mode == 'task':
            task = _WeightedTask(model)
            task(x, y, weight=weight)['loss'].backward()
            opt.step()
        else:
            def closure(opt=opt, model=model):
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y, weight=weight)
                loss.backward()
                return loss
            opt.step(closure)
        results.append([p.detach() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_accumulation_window_replays_each_micro_batch_once():
    model = _model()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    counts = []
    model.register_forward_hook(lambda m, i, o: counts.append(i[0].shape[0]))
    x, y = _batch(9)
    for xs, ys in zip(x.split(3), y.split(3)):
        (task(xs, ys)['loss'] / 3).backward()
    opt.step()
    assert counts == [3] * 6


class _DictInputTask(TrainingTask):
    """NaFlex-style input (a dict of patches), as train.py's NaFlex loader produces."""

    def __init__(self, model):
        super().__init__(verbose=False)
        self.trainable_module = model

    def forward(self, input, target) -> Dict[str, torch.Tensor]:
        out = self.trainable_module(input['patches'])
        return {'loss': F.cross_entropy(out, target), 'output': out}


def test_naflex_dict_input_warns_about_loss_scaling_outside_the_task():
    model = _model()
    task = _DictInputTask(model)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = _batch()
    task({'patches': x}, y)['loss'].backward()
    with pytest.warns(UserWarning, match=r'--naflex-loss-scale none on a single process'):
        opt.step()
