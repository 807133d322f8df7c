"""Capture and replay of timm training-task calls, so SAM works inside timm's unmodified train.py.

timm's train.py (task API, timm >= 1.0.23) runs ``loss = task(input, target)['loss']`` under its
autocast context, back-propagates, and calls ``optimizer.step()`` (or ``loss_scaler(...)``, which
calls ``GradScaler.step(optimizer)``) without a closure. SAM needs a second forward-backward at the
perturbed weights, so each SAM optimizer keeps a :class:`TaskRecorder` that remembers the task's
calls since the last step and re-runs them.

How the task is found, and what it costs:

* Nothing is installed until a SAM optimizer exists: a process without SAM pays nothing.
* Creating a SAM installs one global ``nn.Module`` forward hook that looks for the first
  ``timm.task.TrainingTask`` whose trainable module owns the optimizer's parameters. On that first
  call it registers a forward hook on that task only and removes the global hook, so afterwards
  the cost is one small hook call per task call. Using ``step(closure)`` or ``first_step()``
  removes the global hook too (such loops never need a replay).
* Calls are recorded only with grad enabled and not during a replay; the record (the input and
  target tensors, the autocast state) is dropped at every SAM step, so nothing is held across
  steps. With gradient accumulation the record holds the window's micro-batches until the step.
"""
import warnings
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn

__all__ = ['TaskCall', 'TaskRecorder']


@dataclass
class TaskCall:
    """One call of the training task: its arguments and the autocast state it ran under."""
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any] = field(default_factory=dict)
    device_type: str = 'cpu'
    autocast_enabled: bool = False
    autocast_dtype: Optional[torch.dtype] = None
    autocast_cache: bool = True

    @classmethod
    def capture(cls, args: Tuple[Any, ...], kwargs: Dict[str, Any], device_type: str) -> 'TaskCall':
        return cls(
            args=tuple(args),
            kwargs=dict(kwargs),
            device_type=device_type,
            autocast_enabled=torch.is_autocast_enabled(device_type),
            autocast_dtype=torch.get_autocast_dtype(device_type),
            autocast_cache=torch.is_autocast_cache_enabled(),
        )

    def autocast(self):
        """The same autocast state as the original call (a disabled context when it had none)."""
        return torch.autocast(
            self.device_type, dtype=self.autocast_dtype, enabled=self.autocast_enabled,
            cache_enabled=self.autocast_cache)


class TaskRecorder:
    """Remembers the training task's calls since the last SAM step and replays them."""

    def __init__(self, param_source: Callable[[], Iterable[torch.Tensor]]) -> None:
        self._param_source = param_source
        self.task: Optional[nn.Module] = None
        self.calls: List[TaskCall] = []
        self.replaying = False
        self._device_type = 'cpu'
        self._handle = None
        self._warned_dict_input = False

    def owns(self, task: nn.Module) -> bool:
        """Whether ``task``'s trainable module holds any of the optimizer's parameters."""
        ids = {id(p) for p in self._param_source()}
        module = task.get_trainable_module() if hasattr(task, 'get_trainable_module') else task
        return any(id(p) in ids for p in module.parameters())

    def bind(self, task: nn.Module) -> None:
        """Record every later call of ``task`` (through a forward hook on that task only)."""
        self.unbind()
        self.task = task
        param = next(iter(self._param_source()), None)
        self._device_type = param.device.type if param is not None else 'cpu'
        self_ref = weakref.ref(self)

        def _record_hook(module, args, kwargs, output):
            recorder = self_ref()
            if recorder is not None:
                recorder.record(args, kwargs)

        self._handle = task.register_forward_hook(_record_hook, with_kwargs=True)
        weakref.finalize(self, self._handle.remove)

    def unbind(self) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle = None
        self.task = None
        self.calls = []

    def record(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if self.replaying or not torch.is_grad_enabled():
            return
        self.calls.append(TaskCall.capture(args, kwargs, self._device_type))

    def take(self) -> List[TaskCall]:
        """The calls since the last step; the record is emptied (nothing is kept across steps)."""
        calls, self.calls = self.calls, []
        return calls

    def trainable_module(self) -> Optional[nn.Module]:
        if self.task is None:
            return None
        return self.task.get_trainable_module() if hasattr(self.task, 'get_trainable_module') else self.task

    def replay(self, calls: List[TaskCall], grad_scaler: Optional[Any] = None) -> None:
        """Forward and backward every call again, as train.py did the first time.

        train.py divides each micro-batch loss by the number of micro-batches of the accumulation
        window (which is the number of calls since the last step) and runs all but the last
        micro-batch inside ``task.no_sync()``; the replay does the same, so under DDP the second
        pass gradient is all-reduced once, over the whole window.
        """
        task = self.task
        num_calls = len(calls)
        if not self._warned_dict_input and any(call.args and isinstance(call.args[0], dict) for call in calls):
            self._warned_dict_input = True
            warnings.warn(
                'SAM replays the training task, but train.py\'s NaFlex path scales the loss outside the task '
                '(--naflex-loss-scale, and per-rank scaling under DDP), which the replay cannot see: use '
                '--naflex-loss-scale none on a single process, or a closure in a custom loop', stacklevel=2)
        self.replaying = True
        try:
            for idx, call in enumerate(calls):
                sync_ctx = task.no_sync() if idx < num_calls - 1 and hasattr(task, 'no_sync') else nullcontext()
                with sync_ctx, torch.enable_grad():
                    with call.autocast():
                        loss = task(*call.args, **call.kwargs)['loss']
                    if num_calls > 1:
                        loss = loss / num_calls
                    if grad_scaler is not None:
                        loss = grad_scaler.scale(loss)
                    loss.backward()
        finally:
            self.replaying = False


# ---- finding the task: one global hook, only while a SAM optimizer still looks for its task ----

_waiting: 'weakref.WeakSet[TaskRecorder]' = weakref.WeakSet()
_global_handle = None
_task_class: Optional[type] = None


def watch(recorder: TaskRecorder) -> None:
    """Start looking for the timm TrainingTask that owns ``recorder``'s parameters."""
    global _global_handle, _task_class
    if _task_class is None:
        from timm.task import TrainingTask  # imported only once a SAM optimizer exists
        _task_class = TrainingTask
    _waiting.add(recorder)
    if _global_handle is None:
        _global_handle = torch.nn.modules.module.register_module_forward_hook(_find_task_hook, with_kwargs=True)


def unwatch(recorder: TaskRecorder) -> None:
    """Stop looking for a task for ``recorder`` (removes the global hook once nobody looks)."""
    _waiting.discard(recorder)
    _remove_global_hook_if_idle()


def is_watching() -> bool:
    """Whether the global task-finding hook is installed (for tests and debugging)."""
    return _global_handle is not None


def _remove_global_hook_if_idle() -> None:
    global _global_handle
    if _global_handle is not None and len(_waiting) == 0:
        _global_handle.remove()
        _global_handle = None


def _find_task_hook(module, args, kwargs, output) -> None:
    if isinstance(module, _task_class):
        for recorder in list(_waiting):
            if recorder.owns(module):
                recorder.bind(module)
                recorder.record(args, kwargs)  # this first call ran before the task's own hook existed
                _waiting.discard(recorder)
    _remove_global_hook_if_idle()
