"""SAM over timm's training-task API: ``optimizer.step()`` with no closure replays the task's calls at w + e.

timm's train.py (timm >= 1.0.23) runs ``loss = task(input, target)['loss']``, back-propagates and calls
``optimizer.step()``: SAM cannot ask it for a second pass, so it records the task's calls of the current step
(``task_recorder``) and replays them. Opting in is one call, made for you inside timm's train.py
(``timm_ext.launch.train_py_hooks``, on every optimizer timm's factory builds there), and yours in a loop of
your own::

    task = ClassificationTask(model, criterion)
    optimizer = create_optimizer_v2(model, 'samadamw', lr=1e-3)
    replay_timm_task(optimizer, task)
    for x, y in loader:
        task(x, y)['loss'].backward()
        optimizer.step()
        optimizer.zero_grad()

Given the task, nothing in timm is touched (a forward pre-hook on that one task). Without it (train.py builds its
task after the optimizer), ``timm.task.TrainingTask.__call__`` is wrapped until the first task that owns the
optimizer's parameters is called, then restored (``task_finder``). Building a SAM does neither.
"""
from typing import Any, Optional

import torch
import torch.nn as nn

from timm_ext.optim.replay_passes import TaskReplay
from timm_ext.optim.sam import SAM

__all__ = ['replay_timm_task', 'sams_in']


def sams_in(optimizer: Any) -> list:
    """The SAM optimizers in ``optimizer``: itself, or the ones wrappers hold (timm's Lookahead, Accelerate's)."""
    found, seen = [], set()
    todo = [optimizer]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, SAM):
            found.append(current)
        elif isinstance(current, torch.optim.Optimizer) or hasattr(current, 'optimizer'):
            todo += [getattr(current, name, None) for name in ('base_optimizer', '_base_optimizer', 'optimizer')]
    return found


def replay_timm_task(optimizer: Any, task: Optional[nn.Module] = None) -> None:
    """Let ``optimizer.step()`` (no closure) replay ``task``'s calls at w + e, once per SAM in ``optimizer``.

    ``task``: the ``timm.task.TrainingTask`` whose trainable module holds the optimizer's parameters; None to take
    the first such task that is called (timm's ``TrainingTask.__call__`` is wrapped until then). A model the
    optimizer was not given becomes the task's trainable module (BatchNorm buffers held, AGC's head left out).
    Calling it again replaces the earlier replay; a closure or ``first_step()`` later turns it off.
    """
    sams = sams_in(optimizer)
    if not sams:
        raise ValueError(f'replay_timm_task needs a SAM-family optimizer (SAM, GSAM, LookSAM, or one wrapping it), '
                         f'got {type(optimizer).__name__}')
    if task is not None and not isinstance(task, nn.Module):
        raise ValueError(f'replay_timm_task: task must be a timm.task.TrainingTask (an nn.Module), '
                         f'got {type(task).__name__}')
    for sam in sams:
        replay = TaskReplay(sam)
        if task is not None and not replay.owns(task):
            sam.attach_replay(None)
            module = type(replay.trainable_module_of(task)).__name__
            raise ValueError(f'replay_timm_task: the {type(task).__name__}\'s trainable module ({module}) holds none '
                             f'of the optimizer\'s parameters: give the task built over the model the optimizer trains')
        sam.attach_replay(replay)  # the one attached before closes
        if task is None:
            replay.start()
        else:
            replay.bind(task)
