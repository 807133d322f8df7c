"""The record of timm training-task calls that SAM replays inside timm's unmodified train.py.

timm's train.py (task API, timm >= 1.0.23) runs ``loss = task(input, target)['loss']`` under its
autocast context, back-propagates, and calls ``optimizer.step()`` (or ``loss_scaler(...)``, which
calls ``GradScaler.step(optimizer)``) without a closure. SAM needs a second forward-backward at the
perturbed weights, so each SAM optimizer owns a :class:`TaskRecorder` that remembers the task's
calls of the current step and re-runs them.

A recorder has four states, and every reference it holds is dropped in one place per transition:

* ``UNBOUND``: just created; holds nothing.
* ``WAITING``: looking for the ``timm.task.TrainingTask`` whose trainable module owns the optimizer's
  parameters. While at least one recorder waits, ``TrainingTask.__call__`` is wrapped by a function
  that offers each called task to the waiting recorders (``timm_ext.optim.task_finder``, which says what
  it touches and when it is undone).
* ``BOUND``: a forward pre-hook on that one task records each call made with grad enabled: its
  arguments, autocast state and random-generator state (so the replay draws the same dropout and
  drop-path masks). The record holds one accumulation window: it is handed over at every SAM step,
  and emptied when a call starts a new window (the optimizer's gradients are all ``None``, as after
  ``zero_grad()``), so even a recorder whose optimizer never steps holds one window at most.
  The task is held weakly; if it is collected the recorder waits again.
* ``CLOSED``: final. No hook, no record, no task. Reached when the optimizer is driven by a closure
  or by ``first_step()``/``second_step()`` (those never need a replay), when a newer SAM over the
  same parameters binds to the same task (the older optimizer is stale), or when the optimizer
  is garbage-collected.
"""
import dataclasses
import enum
import itertools
import warnings
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from timm_ext.optim.m_sharpness import slice_batch
from timm_ext.optim.rng import RngState, cuda_devices_of
from timm_ext.optim.task_finder import finder

__all__ = ['RecorderState', 'TaskCall', 'TaskRecorder']


@dataclass
class TaskCall:
    """One call of the training task: its arguments and the autocast and RNG state it ran under."""
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any] = field(default_factory=dict)
    rng: Optional[RngState] = None
    device_type: str = 'cpu'
    autocast_enabled: bool = False
    autocast_dtype: Optional[torch.dtype] = None
    autocast_cache: bool = True
    output: Optional[torch.Tensor] = None  # the task's output (logits), kept for a sample selector (ESAM)

    @classmethod
    def capture(
            cls,
            args: Tuple[Any, ...],
            kwargs: Dict[str, Any],
            device_type: str,
            cuda_devices: Tuple[int, ...] = (),
    ) -> 'TaskCall':
        return cls(
            args=tuple(args),
            kwargs=dict(kwargs),
            rng=RngState.capture(cuda_devices),
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

    def random_state(self):
        """The random generators as they were when the original call started."""
        return self.rng.restored() if self.rng is not None else nullcontext()

    def rows(self, batch_size: int, part: slice) -> 'TaskCall':
        """This call on rows ``part`` of its batch (every argument batched along dim 0 is cut), run in the
        random state of the moment (m-sharpness: the caller sets it)."""
        args = slice_batch(self.args, batch_size, part)
        keys = list(self.kwargs)
        values = slice_batch([self.kwargs[k] for k in keys], batch_size, part)
        return dataclasses.replace(self, args=args, kwargs=dict(zip(keys, values)), rng=None)


class RecorderState(enum.Enum):
    UNBOUND = 'unbound'
    WAITING = 'waiting'
    BOUND = 'bound'
    CLOSED = 'closed'


_serials = itertools.count()


class TaskRecorder:
    """Records the training task's calls of the current step for one optimizer, and replays them."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer_ref = weakref.ref(optimizer)  # never keeps the optimizer alive
        self.serial = next(_serials)  # creation order: the newest recorder wins a task
        self.state = RecorderState.UNBOUND
        self.calls: List[TaskCall] = []
        self.replaying = False
        self._task_ref: Optional[weakref.ref] = None
        self._handle = None
        self._output_handle = None
        self._device_type = 'cpu'
        self.cuda_devices: Tuple[int, ...] = ()
        self._warned_dict_input = False
        self._given_model: Optional[nn.Module] = None  # the task's module this recorder made the optimizer's model

    def __repr__(self) -> str:
        return f'TaskRecorder(state={self.state.value}, calls={len(self.calls)})'

    # ---- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """UNBOUND -> WAITING: look for the task that owns the optimizer's parameters."""
        if self.state is RecorderState.UNBOUND:
            self.state = RecorderState.WAITING
            finder.wait(self)

    def bind(self, task: nn.Module) -> None:
        """UNBOUND or WAITING -> BOUND: record every later call of ``task`` (a forward pre-hook on that task only);
        the optimizer's model, if it was given none, is the task's trainable module."""
        if not self.claim(task, _bound):
            return
        params = self._params()
        self._device_type = params[0].device.type if params else 'cpu'
        self.cuda_devices = tuple(cuda_devices_of(params))
        self_ref = weakref.ref(self)

        def _record_hook(module, args, kwargs):
            recorder = self_ref()
            if recorder is not None:
                recorder.record(args, kwargs)
            return None

        def _output_hook(module, args, kwargs, output):
            recorder = self_ref()
            if recorder is not None:
                recorder.record_output(output)
            return None

        self._handle = task.register_forward_pre_hook(_record_hook, with_kwargs=True)
        weakref.finalize(self, self._handle.remove)  # a collected optimizer leaves no hook behind
        optimizer = self._optimizer_ref()
        if optimizer is not None and type(optimizer).sample_selector is not None:  # ESAM reads the first-pass logits
            self._output_handle = task.register_forward_hook(_output_hook, with_kwargs=True)
            weakref.finalize(self, self._output_handle.remove)
        self.state = RecorderState.BOUND
        _bound.add(self)
        if optimizer is not None and (optimizer.model is None or optimizer.model is self._given_model):
            self._given_model = _trainable_module(task)  # BatchNorm buffers held, AGC's head left out
            optimizer.set_model(self._given_model)

    def claim(self, task: nn.Module, bound: 'weakref.WeakSet') -> bool:
        """Stop waiting and hold ``task`` (weakly: if it is collected the recorder waits again); False, and closed,
        if a newer recorder in ``bound`` over the same parameters already holds it (this one is stale); an older one
        is closed. Not BOUND yet: the caller installs its hook first."""
        if self.state not in (RecorderState.UNBOUND, RecorderState.WAITING):
            return False
        finder.stop(self)
        for other in list(bound):
            if other is not self and other.task is task and other._shares_params(self):
                if other.serial > self.serial:  # a newer optimizer already owns this task: this one is stale
                    self.close()
                    return False
                other.close()
        self_ref = weakref.ref(self)

        def _task_collected(_):
            recorder = self_ref()
            if recorder is not None:
                recorder._lose_task()

        self._task_ref = weakref.ref(task, _task_collected)
        return True

    def close(self) -> None:
        """Any state -> CLOSED: remove the hook, drop the record and the task; never records again."""
        if self.state is RecorderState.WAITING:
            finder.stop(self)
        self._release_task()
        self.state = RecorderState.CLOSED

    def _lose_task(self) -> None:
        """BOUND -> WAITING when the task is garbage-collected (a new task may take its place)."""
        if self.state is RecorderState.BOUND:
            self._release_task()
            self.state = RecorderState.WAITING
            finder.wait(self)

    def _release_task(self) -> None:
        for handle in (self._handle, self._output_handle):
            if handle is not None:
                handle.remove()
        self._handle = self._output_handle = None
        self._task_ref = None
        self.calls = []
        _bound.discard(self)

    # ---- what it knows -----------------------------------------------------------------------------

    @property
    def task(self) -> Optional[nn.Module]:
        return self._task_ref() if self._task_ref is not None else None

    def _params(self) -> List[torch.Tensor]:
        optimizer = self._optimizer_ref()
        if optimizer is None:
            return []
        return [p for group in optimizer.base_optimizer.param_groups for p in group['params']]

    def _shares_params(self, other: 'TaskRecorder') -> bool:
        ids = {id(p) for p in self._params()}
        return any(id(p) in ids for p in other._params())

    def owns(self, task: nn.Module) -> bool:
        """Whether ``task``'s trainable module holds any of the optimizer's parameters."""
        ids = {id(p) for p in self._params()}
        return any(id(p) in ids for p in _trainable_module(task).parameters())

    @staticmethod
    def trainable_module_of(task: nn.Module) -> nn.Module:
        return _trainable_module(task)

    # ---- recording and replay ----------------------------------------------------------------------

    def record(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if self.state is not RecorderState.BOUND or self.replaying or not torch.is_grad_enabled():
            return
        if not any(p.grad is not None for p in self._params()):
            self.calls = []  # a new accumulation window: the previous one was stepped (or abandoned)
        self.calls.append(TaskCall.capture(args, kwargs, self._device_type, self.cuda_devices))

    def record_output(self, output: Any) -> None:
        """The logits of the call just recorded (a task's output dict's ``output``), for a sample selector."""
        if self.calls and not self.replaying and torch.is_grad_enabled() and isinstance(output, dict):
            logits = output.get('output')
            self.calls[-1].output = logits.detach() if isinstance(logits, torch.Tensor) else None

    def take(self) -> List[TaskCall]:
        """The calls of this step; the record is emptied (nothing is kept across steps)."""
        calls, self.calls = self.calls, []
        return calls

    def replay(
            self,
            calls: List[TaskCall],
            scale_loss: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ) -> List[torch.Tensor]:
        """Forward and backward every call again, as train.py did the first time; returns the losses.

        train.py divides each micro-batch loss by the number of micro-batches of the accumulation
        window (which is the number of calls of this step) and runs all but the last micro-batch
        inside ``task.no_sync()``; the replay does the same, so under DDP the second-pass gradient
        is all-reduced once, over the whole window. Each call runs with the random generators as
        they were at its first run (same dropout / drop-path masks; a call cut by ``TaskCall.rows``
        runs in the current random state), and ``scale_loss`` applies the fp16 loss scale, if any.
        The replay itself is never recorded.
        """
        task = self.task
        if task is None:
            raise RuntimeError('SAM.step(): the training task whose calls were recorded no longer exists')
        if not self._warned_dict_input and any(call.args and isinstance(call.args[0], dict) for call in calls):
            self._warn_dict_input()
        num_calls = len(calls)
        losses = []
        self.replaying = True
        try:
            for idx, call in enumerate(calls):
                no_sync = task.no_sync if idx < num_calls - 1 and hasattr(task, 'no_sync') else None
                with no_sync() if no_sync is not None else nullcontext(), torch.enable_grad(), call.random_state():
                    with call.autocast():
                        loss = task(*call.args, **call.kwargs)['loss']
                    if num_calls > 1:
                        loss = loss / num_calls
                    (scale_loss(loss) if scale_loss is not None else loss).backward()
                losses.append(loss.detach())
        finally:
            self.replaying = False
        return losses

    def _warn_dict_input(self) -> None:
        self._warned_dict_input = True
        warnings.warn(
            'SAM replays the training task, but train.py\'s NaFlex path scales the loss outside the task '
            '(--naflex-loss-scale, and per-rank scaling under DDP), which the replay cannot see: use '
            '--naflex-loss-scale none on a single process, or a closure in a custom loop', stacklevel=3)


# where timm 1.0.23's tasks (no get_trainable_module yet) hold the module they train: FeatureDistillationTask's
# trainable_module (student and projection), LogitDistillationTask's student, ClassificationTask's model
_TIMM_1_0_23_TRAINABLE = ('trainable_module', 'student', 'model')


def _trainable_module(task: nn.Module) -> nn.Module:
    """The module of ``task`` that owns its trainable parameters: ``get_trainable_module()`` on timm >= 1.0.24, the
    attribute that holds it on timm 1.0.23 (its tasks also hold a teacher or a criterion); the task itself else."""
    getter = getattr(task, 'get_trainable_module', None)
    if getter is not None:
        module = getter()
    else:
        module = next((m for m in (getattr(task, n, None) for n in _TIMM_1_0_23_TRAINABLE)
                       if isinstance(m, nn.Module)), None)
    return module if module is not None else task


_bound: 'weakref.WeakSet[TaskRecorder]' = weakref.WeakSet()
