"""How a SAM optimizer finds timm's training task inside train.py: the one class attribute ``timm_ext.optim``
changes (the other reach beyond its arguments, reading the factory's frame, is ``sam_factory.model_given_to_factory``).

``TrainingTask.__call__`` (class attribute of ``timm.task.TrainingTask``) is swapped for a function that
offers each called task to the SAM optimizers still looking for theirs (``TaskFinder``). Installed when the
first SAM starts looking, i.e. when one is created; undone, the class restored exactly (the attribute
deleted again, or its own ``__call__`` put back), as soon as no SAM is looking any more: all found their
task, were driven another way, or were garbage-collected. Tasks of other classes, plain modules and torch's
global module hooks are never touched (a global hook would make every later ``torch.compile`` warn).
"""
import weakref
from typing import Any, Callable, Dict, Optional

import torch.nn as nn

__all__ = ['TaskFinder', 'finder']


class TaskFinder:
    """Offers every called ``TrainingTask`` to the waiting recorders, through the class's ``__call__``.

    A waiting recorder has ``serial`` (newest wins), ``owns(task)`` and ``bind(task)``; it is held weakly.
    """

    def __init__(self) -> None:
        self._waiting: Dict[int, weakref.ref] = {}
        self._task_class: Optional[type] = None
        self._call: Optional[Callable] = None  # what TrainingTask.__call__ was before the wrapper
        self._own_call: Any = None  # TrainingTask.__dict__['__call__'] before the wrapper (usually absent)

    def wait(self, recorder: Any) -> None:
        serial = recorder.serial
        self._waiting[serial] = weakref.ref(recorder, lambda _: self._forget(serial))
        self._install()

    def stop(self, recorder: Any) -> None:
        self._forget(recorder.serial)

    def _forget(self, serial: int) -> None:
        self._waiting.pop(serial, None)
        if not self._waiting:
            self._uninstall()

    def offer(self, task: nn.Module) -> None:
        """Bind ``task`` to the waiting recorders that own it, newest first (older ones sharing its
        parameters are stale and close)."""
        recorders = [ref() for ref in list(self._waiting.values())]
        for recorder in sorted((r for r in recorders if r is not None), key=lambda r: -r.serial):
            if recorder.owns(task):
                recorder.bind(task)

    def original_call(self) -> Callable:
        return self._call or nn.Module.__call__

    def _install(self) -> None:
        if self._call is not None:
            return
        if self._task_class is None:
            try:
                from timm.task import TrainingTask  # imported only once a SAM optimizer exists
            except ImportError:  # timm without the task API: nothing to look for
                return
            self._task_class = TrainingTask
        cls = self._task_class
        self._own_call = cls.__dict__.get('__call__')
        self._call = cls.__call__
        cls.__call__ = _offer_then_call

    def _uninstall(self) -> None:
        if self._call is None:
            return
        cls = self._task_class
        if cls.__dict__.get('__call__') is _offer_then_call:
            if self._own_call is None:
                del cls.__call__
            else:
                cls.__call__ = self._own_call
        self._call = None
        self._own_call = None


def _offer_then_call(task: nn.Module, *args: Any, **kwargs: Any) -> Any:
    call = finder.original_call()
    finder.offer(task)  # a recorder that binds here records this very call (its pre-hook runs next)
    return call(task, *args, **kwargs)


finder = TaskFinder()
