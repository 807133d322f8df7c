"""SAM's two passes inside timm's unmodified train.py: ``step()`` without a closure.

train.py has already run the first pass (the training task's forward and backward at w), so the gradient is
there; the second pass replays the task's calls of this step, recorded by ``task_recorder``, at w + e under
the same autocast and random state (and loss scale). Under m-sharpness train.py's whole-batch gradient is
not used: each recorded call is cut into chunks, and both passes of every chunk are replayed.

``TaskReplay`` is the recorder a SAM's step driver replays (``sam_step.Replay``), attached by ``task_replay``.
"""
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, List, Optional, Tuple

import torch

from timm_ext.optim.ddp import no_sync_of, sync_context, world_size
from timm_ext.optim.m_sharpness import check_chunk_sync, chunk_count
from timm_ext.optim.rng import RngState
from timm_ext.optim.sam_step import HOW_TO_USE, NoSecondPassError
from timm_ext.optim.task_recorder import RecorderState, TaskCall, TaskRecorder

__all__ = ['ReplayPasses', 'TaskReplay']


class TaskReplay(TaskRecorder):
    """The recorder of one SAM's training task, as its step driver replays it (``sam_step.Replay``)."""

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)

    def passes(self, has_grads: bool, sam_step_due: bool, m_sharpness: Optional[int]) -> 'ReplayPasses':
        """This step's passes from the recorded calls (taken: the record is empty after); a one-line error where
        there is nothing to replay."""
        calls = self.take()
        if not has_grads:
            if calls:
                raise RuntimeError('SAM.step(): the training task ran but no gradients exist; '
                                   'call backward() on its loss before step()')
            raise RuntimeError(f'SAM.step() has no closure, no gradients and no captured training-task call: '
                               f'{HOW_TO_USE}')
        if not sam_step_due:  # a plain step needs no replay
            return ReplayPasses(self, [], None)
        if not calls:
            closed = (' (task capture was turned off because this optimizer was driven by a closure or by '
                      'first_step(), or a newer SAM over the same parameters took its task)'
                      if self.state is RecorderState.CLOSED else '')
            raise NoSecondPassError(
                'SAM.step() without a closure can only re-evaluate the loss inside timm\'s train.py task API, '
                f'but no timm TrainingTask call was captured since the last step{closed}: {HOW_TO_USE}')
        if m_sharpness and _one_local_chunk(calls, m_sharpness):
            m_sharpness = None  # train.py's gradient is already the one chunk's own
        return ReplayPasses(self, calls, m_sharpness)


def _one_local_chunk(calls: List[TaskCall], m_sharpness: int) -> bool:
    """One process and one micro-batch of exactly ``m_sharpness`` images."""
    first = calls[0].args[0] if len(calls) == 1 and calls[0].args else None
    return (world_size() == 1 and isinstance(first, torch.Tensor) and first.dim() > 0
            and first.shape[0] == m_sharpness)


class ReplayPasses:
    """The passes of one update from the recorded calls; per chunk of ``m_sharpness`` images when given.

    Each call's chunks start from the random state the call first ran with (a chunk's two passes draw the
    same masks, chunks draw different ones), inside one fork of the generators, so the replay draws nothing
    from the rest of the run.
    """
    first_pass_done = True

    def __init__(self, recorder: TaskRecorder, calls: List[TaskCall], m_sharpness: Optional[int]) -> None:
        self.recorder = recorder
        self.calls = calls
        self.chunked = bool(m_sharpness)
        self.items: List[Tuple[TaskCall, int, slice]] = []
        self.no_sync = None
        self._rng: Optional[RngState] = None
        if self.chunked:
            task = recorder.task
            if task is None:
                raise RuntimeError('SAM.step(): the training task whose calls were recorded no longer exists')
            self.no_sync = no_sync_of(task)
            check_chunk_sync(self.no_sync)
            self.items = _chunks(calls, m_sharpness)  # checks every batch before anything runs

    def plain_pass(self) -> None:
        """train.py ran it."""

    def context(self) -> ContextManager:
        return torch.random.fork_rng(devices=self.recorder.cuda_devices) if self.chunked else nullcontext()

    def count(self) -> int:
        return len(self.items) if self.chunked else 1

    def first(self, index: int) -> Optional[torch.Tensor]:
        if not self.chunked:
            return None  # train.py's own pass
        call, batch, rows = self.items[index]
        if rows.start == 0 and call.rng is not None:
            call.rng.apply()
        self._rng = RngState.capture(self.recorder.cuda_devices)
        with sync_context(self.no_sync):
            return self.recorder.replay([call.rows(batch, rows)])[0]

    def second(self, index: int, scale_loss: Callable[[torch.Tensor], torch.Tensor]) -> None:
        if not self.chunked:
            self.recorder.replay(self.calls, scale_loss)
            return
        call, batch, rows = self.items[index]
        with sync_context(self.no_sync), self._rng.restored():
            self.recorder.replay([call.rows(batch, rows)])

    def may_move_buffers(self, loss: Any) -> bool:
        """The task's module is SAM's model once the replay is bound; before, nothing is known."""
        return True

    def result(self, losses: List[Any]) -> None:
        """train.py has its own loss."""


def _chunks(calls: List[TaskCall], m_sharpness: int) -> List[Tuple[TaskCall, int, slice]]:
    items = []
    for idx, call in enumerate(calls):
        first = call.args[0] if call.args else None
        if not isinstance(first, torch.Tensor) or first.dim() == 0:
            raise ValueError(f'SAM m_sharpness needs the training task\'s input as a batched tensor, got '
                             f'{type(first).__name__} (NaFlex dict input cannot be split)')
        batch = first.shape[0]
        where = f' (micro-batch {idx + 1} of {len(calls)})' if len(calls) > 1 else ''
        for i in range(chunk_count(batch, m_sharpness, where)):
            items.append((call, batch, slice(i * m_sharpness, (i + 1) * m_sharpness)))
    return items
