"""Capture/replay of timm training-task calls: opted in by ``replay_timm_task`` (building a SAM touches nothing),
bound at once to a given task or found lazily, no global hook, explicit lifecycle, no leaks, replays faithfully."""
import copy
import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings
import weakref
from pathlib import Path
from typing import Dict

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask, TrainingTask

from timm_ext.optim import GSAM, SAM, LookSAM, replay_timm_task
from timm_ext.optim.task_recorder import RecorderState

REPO = Path(__file__).resolve().parents[1]
_TASK_CALL = TrainingTask.__call__  # before any SAM exists: what the class must be restored to
_OWN_CALL = TrainingTask.__dict__.get('__call__')  # the class's own attribute (usually absent: nn.Module's)


def _model():
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))


def _batch(n=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _watching():
    """Whether TrainingTask.__call__ is wrapped to find a task (replay_timm_task without a task)."""
    return TrainingTask.__call__ is not _TASK_CALL


def _class_untouched():
    return TrainingTask.__call__ is _TASK_CALL and TrainingTask.__dict__.get('__call__') is _OWN_CALL


def _no_sam_alive():
    gc.collect()
    return not _watching() and _class_untouched()


def _call_is_held(task, seed=1, grad=True):
    """Whether anything still references the batch of one task call (forward and backward) once it returns."""
    x, y = _batch()
    x_ref = weakref.ref(x)
    with torch.set_grad_enabled(grad):
        out = task(x, y)['loss']
    if grad:
        out.backward()
    del x, y, out
    gc.collect()
    return x_ref() is not None


def _forwards(model):
    """A list that grows by one entry per forward of ``model`` (the user's own hook)."""
    counts = []
    model.register_forward_hook(lambda m, i, o: counts.append(i[0].shape[0]))
    return counts


def _no_global_module_hooks():
    module = torch.nn.modules.module
    names = [n for n in dir(module) if n.startswith('_global_') and n.endswith(('hooks', 'hooks_with_kwargs',
                                                                                 'hooks_always_called'))]
    assert '_global_forward_hooks' in names and '_global_forward_pre_hooks' in names
    return all(len(getattr(module, n)) == 0 for n in names)


@pytest.mark.timm_free
def test_nothing_installed_without_sam():
    assert _no_sam_alive()
    assert _no_global_module_hooks()


def test_task_class_is_wrapped_only_until_the_task_is_found():
    assert _no_sam_alive()
    model = _model()
    other = ClassificationTask(_model(), nn.CrossEntropyLoss(), verbose=False)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    assert not _watching() and _class_untouched()  # building it watches nothing
    replay_timm_task(opt)  # no task given: the first called task that owns the parameters
    assert _watching() and TrainingTask.__call__ is not _TASK_CALL
    assert not _call_is_held(other)  # a task that does not own the optimizer's parameters is ignored
    assert _watching()
    forwards = _forwards(model)
    task(*_batch())['loss'].backward()
    assert not _watching() and _class_untouched()  # the class is as it was
    assert not _call_is_held(other)  # still ignored: the hook is on the found task only
    task.zero_grad()
    task(*_batch())['loss'].backward()
    opt.step()  # the one call of this window is replayed
    assert forwards == [8, 8, 8]
    assert _no_global_module_hooks()  # at no point


def test_recorder_lifecycle():
    model = _model()
    x, y = _batch()
    x_ref = weakref.ref(x)
    older = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    newer = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    assert not _watching()
    replay_timm_task(older)
    replay_timm_task(newer)
    assert _watching()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    forwards = _forwards(model)
    task(x, y)['loss'].backward()
    # both own the task: the newer one binds and replays, the older one is stale and records nothing
    assert not _watching()
    with pytest.raises(RuntimeError, match='captured since the last step .*a newer SAM over the same parameters took'):
        older.step()
    newer.step()
    assert forwards == [8, 8]
    del task, x, y
    gc.collect()  # a collected task: the batch is dropped and the SAM waits for a new task
    assert x_ref() is None and _watching()
    newer_ref = weakref.ref(newer)
    del newer
    assert newer_ref() is None and _no_sam_alive()  # the stale one waits for nothing
    assert not _call_is_held(ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False))  # closed is final


@pytest.mark.slow
def test_closure_or_explicit_use_closes_the_recorder():
    assert _no_sam_alive()
    model = _model()
    x, y = _batch()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    replay_timm_task(opt)
    assert _watching()
    opt.step(lambda: F.cross_entropy(model(x), y).backward())
    assert _no_sam_alive() and not _call_is_held(task)
    assert opt.replay.state is RecorderState.CLOSED
    opt2 = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    replay_timm_task(opt2)
    assert _watching()
    F.cross_entropy(model(x), y).backward()
    opt2.first_step()
    assert _no_sam_alive()
    F.cross_entropy(model(x), y).backward()
    opt2.second_step()
    assert not _call_is_held(task)
    task(x, y)['loss'].backward()
    with pytest.raises(RuntimeError, match='task capture was turned off'):
        opt2.step()


@pytest.mark.timm_free
def test_a_collected_waiting_sam_restores_the_task_class():
    assert _no_sam_alive()
    opt = SAM(torch.optim.SGD(_model().parameters(), lr=0.1))
    replay_timm_task(opt)
    assert _watching() and TrainingTask.__call__ is not _TASK_CALL
    del opt
    gc.collect()
    assert not _watching() and _class_untouched()


_BUILDERS = {
    'SAM': lambda model: SAM(torch.optim.SGD(model.parameters(), lr=0.1)),
    'GSAM': lambda model: GSAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model),
    'LookSAM': lambda model: LookSAM(torch.optim.SGD(model.parameters(), lr=0.1), interval=2),
    'samadamw': lambda model: create_optimizer_v2(model, 'samadamw', lr=0.1),
    'gsamadamw': lambda model: create_optimizer_v2(model, 'gsamadamw', lr=0.1),
    'looksamadamw': lambda model: create_optimizer_v2(model, 'looksamadamw', lr=0.1),
}


@pytest.mark.parametrize('build', list(_BUILDERS))
def test_building_a_sam_leaves_timm_untouched_and_step_asks_for_replay_timm_task(build):
    """The replay is opt-in: no SAM, however built, patches TrainingTask or starts watching; a task loop that did
    not opt in is refused in one line naming replay_timm_task, before anything moves."""
    assert _no_sam_alive()
    model = _model()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = _BUILDERS[build](model)
    assert not _watching() and _class_untouched() and opt.replay is None
    assert _no_global_module_hooks()
    forwards = _forwards(model)
    w0 = [p.detach().clone() for p in model.parameters()]
    task(*_batch())['loss'].backward()
    assert not _watching() and _class_untouched() and opt.replay is None  # a call binds nothing
    with pytest.raises(RuntimeError, match=r'replay_timm_task'):
        opt.step()
    assert forwards == [8] and all(torch.equal(a, p) for a, p in zip(w0, model.parameters()))


def test_a_given_task_binds_at_once_without_wrapping_the_class():
    assert _no_sam_alive()
    model = _model()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    replay_timm_task(opt, task)
    assert opt.replay.state is RecorderState.BOUND and opt.replay.task is task  # before any call
    assert not _watching() and _class_untouched() and _no_global_module_hooks()
    forwards = _forwards(model)
    w0 = [p.detach().clone() for p in model.parameters()]
    task(*_batch())['loss'].backward()
    opt.step()  # the first call is recorded and replayed
    assert forwards == [8, 8]
    assert not all(torch.equal(a, p) for a, p in zip(w0, model.parameters()))
    assert not _watching() and _class_untouched()
    # a task over other parameters is refused, and the optimizer keeps no replay
    other = ClassificationTask(_model(), nn.CrossEntropyLoss(), verbose=False)
    opt2 = SAM(torch.optim.SGD(_model().parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r'holds none of the optimizer\'s parameters'):
        replay_timm_task(opt2, other)
    assert opt2.replay is None and not _watching() and not _call_is_held(other)


@pytest.mark.parametrize('given', [False, True], ids=['found', 'given'])
def test_a_sam_without_a_model_gets_the_tasks_trainable_module(given):
    """Once bound, the task's trainable module is SAM's model: its BatchNorm statistics keep train.py's first-pass
    values (no 'SAM does not know the model' warning); a model SAM was given is kept."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 3))
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    assert opt.model is None
    replay_timm_task(opt, task if given else None)
    assert opt.model is (model if given else None)  # the finder binds at the task's first call
    x, y = _batch()
    reference = copy.deepcopy(model)
    reference(x)  # train.py's one forward at w
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='SAM does not know the model')
        task(x, y)['loss'].backward()
        assert opt.model is model
        opt.step()
    assert model[1].num_batches_tracked.item() == 1
    assert torch.equal(model[1].running_mean, reference[1].running_mean)
    assert torch.equal(model[1].running_var, reference[1].running_var)
    own = nn.Sequential(model)  # a model of its own, over the same parameters
    kept = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=own)
    replay_timm_task(kept, task)
    assert kept.model is own


def test_a_distillation_tasks_trainable_module_is_the_student(tmp_path):
    """timm's LogitDistillationTask holds a teacher beside the student: SAM's model is the student, on timm 1.0.23
    too, whose tasks have no get_trainable_module (the task holds it as ``student``). Built the way each release
    takes a teacher: 1.0.23 builds it from a model name and a checkpoint file, later releases also take a module."""
    import inspect

    import timm
    from timm.task import LogitDistillationTask
    from timm.task.distillation import DistillationTeacher

    torch.manual_seed(0)
    student, teacher = (timm.create_model('test_resnet', num_classes=3) for _ in range(2))
    if 'teacher_model' in inspect.signature(LogitDistillationTask).parameters:
        task = LogitDistillationTask(student, teacher, nn.CrossEntropyLoss(), verbose=False)
    else:
        torch.save(teacher.state_dict(), tmp_path / 'teacher.pth')
        teacher = DistillationTeacher('test_resnet', 3, pretrained_path=str(tmp_path / 'teacher.pth'),
                                      device=torch.device('cpu'))
        task = LogitDistillationTask(student, teacher, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(student.parameters(), lr=0.1))
    replay_timm_task(opt, task)
    assert opt.model is student


def test_a_lookahead_wrapped_sam_replays():
    model = _model()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = create_optimizer_v2(model, 'lookahead_samsgd', lr=0.1)
    replay_timm_task(opt, task)
    forwards = _forwards(model)
    task(*_batch())['loss'].backward()
    opt.step()
    assert forwards == [8, 8]


_COMPILE_AFTER_SAM = textwrap.dedent("""
    import json, warnings
    import torch, torch.nn as nn, torch.nn.functional as F
    import timm_ext
    from timm.optim import create_optimizer_v2
    from timm.task import ClassificationTask
    from timm_ext.optim import replay_timm_task

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 2))
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay = create_optimizer_v2(model, 'samsgd', lr=0.1)  # found the task, replayed it
    replay_timm_task(replay)
    for _ in range(2):
        task(x, y)['loss'].backward()
        replay.step()
        replay.zero_grad()
    closure = create_optimizer_v2(model, 'samadamw', lr=0.1)  # closure route
    replay_timm_task(closure)
    closure.step(lambda: F.cross_entropy(model(x), y).backward())
    waiting = create_optimizer_v2(nn.Linear(2, 2), 'asamsgd', lr=0.1)  # still looking for its task
    replay_timm_task(waiting)
    bound = create_optimizer_v2(model, 'gsamsgd', lr=0.1)  # given its task: bound at once
    replay_timm_task(bound, task)
    del replay, closure
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        torch.compile(nn.Linear(4, 4), backend='eager')(torch.randn(2, 4))
    print('WARNINGS=' + json.dumps([str(w.message) for w in caught]))
""")


@pytest.mark.slow
def test_torch_compile_after_sam_warns_about_no_global_hook():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]),
               OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', _COMPILE_AFTER_SAM], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('WARNINGS=')][-1]
    hook_warnings = [w for w in json.loads(line[len('WARNINGS='):]) if 'global hooks' in w]
    assert hook_warnings == []


@pytest.mark.parametrize('given', [False, True], ids=['found', 'given'])
def test_record_is_dropped_at_step_and_nothing_leaks(given):
    model = _model()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    replay_timm_task(opt, task if given else None)
    x, y = _batch()
    x_ref = weakref.ref(x)
    forwards = _forwards(model)
    task(x, y)['loss'].backward()
    assert not _call_is_held(task, grad=False)  # no-grad calls (e.g. evaluation through the task) are not recorded
    opt.step()
    assert forwards == [8, 8, 8]  # the first pass, the no-grad call, one replay (of the recorded call only)
    del x, y
    gc.collect()
    assert x_ref() is None  # the replay itself was not recorded either
    opt.zero_grad()
    opt_ref = weakref.ref(opt)
    del opt
    assert opt_ref() is None  # nothing keeps the optimizer alive, not even a reference cycle
    assert not _call_is_held(task)  # and its hook went with it
    assert _no_sam_alive()


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
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3, model=model)
        if mode == 'task':
            task = _WeightedTask(model)
            replay_timm_task(opt, task)
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
    replay_timm_task(opt, task)
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
    replay_timm_task(opt, task)
    x, y = _batch()
    task({'patches': x}, y)['loss'].backward()
    with pytest.warns(UserWarning, match=r'--naflex-loss-scale none on a single process'):
        opt.step()
