"""SAM's second pass inside timm's unmodified train.py: ``step()`` without a closure.

train.py has already run the first pass (the training task's forward and backward at w), so the gradient is
there; the second pass replays the task's calls of this step, recorded by ``task_recorder``, at w + e under
the same autocast and random state (and loss scale). Under m-sharpness train.py's whole-batch gradient is
not used: each recorded call is cut into chunks, and both passes of every chunk are replayed
(``m_sharpness.chunked_update`` over ``ReplayChunks``).

``TaskReplay`` is the recorder ``replay_timm_task`` attaches to a SAM (``SAM.attach_replay``); ``SAM.step()`` asks
it for this step's calls and replays them.
"""
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ContextManager, List, Optional, Tuple

import torch

from timm_ext.optim.ddp import no_sync_of, sync_context, world_size
from timm_ext.optim.m_sharpness import check_chunk_sync, chunk_count, chunked_update
from timm_ext.optim.rng import RngState
from timm_ext.optim.sam_errors import HOW_TO_USE, NoSecondPassError
from timm_ext.optim.task_recorder import RecorderState, TaskCall, TaskRecorder

if TYPE_CHECKING:
    from timm_ext.optim.loss_scaling import LossScaling
    from timm_ext.optim.sam import SAM

__all__ = ['ReplayChunks', 'TaskReplay', 'per_sample_losses']


class TaskReplay(TaskRecorder):
    """The recorder of one SAM's training task, as ``SAM.step()`` replays it."""

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)

    def take_calls(self, has_grads: bool, sam_step_due: bool) -> List[TaskCall]:
        """This step's recorded calls (taken: the record is empty after); a one-line error where there is nothing
        to replay."""
        calls = self.take()
        if not has_grads:
            if calls:
                raise RuntimeError('SAM.step(): the training task ran but no gradients exist; '
                                   'call backward() on its loss before step()')
            raise RuntimeError(f'SAM.step() has no closure, no gradients and no captured training-task call: '
                               f'{HOW_TO_USE}')
        if sam_step_due and not calls:
            closed = (' (task capture was turned off because this optimizer was driven by a closure or by '
                      'first_step(), or a newer SAM over the same parameters took its task)'
                      if self.state is RecorderState.CLOSED else '')
            raise NoSecondPassError(
                'SAM.step() without a closure can only re-evaluate the loss inside timm\'s train.py task API, '
                f'but no timm TrainingTask call was captured since the last step{closed}: {HOW_TO_USE}')
        return calls

    def replay_selected(self, calls: List[TaskCall], scale: Optional[Callable[[Any], Any]]) -> List[torch.Tensor]:
        """The pass at w + e on the rows the optimizer's ``sample_selector`` (ESAM) chooses from each call's
        per-sample losses at w (the logits the task returned) and at w + e (one forward without gradient)."""
        select = self._optimizer_ref().sample_selector
        task = self.task
        criterion = getattr(task, 'criterion', None)
        chosen = []
        for call in calls:
            if criterion is None or call.output is None or len(call.args) < 2:
                raise ValueError(f'ESAM data_fraction < 1 needs a task called as task(input, target) with a '
                                 f'criterion and logits in its output (timm\'s ClassificationTask), got '
                                 f'{type(task).__name__}: use data_fraction=1 with it')
            x, target = call.args[0], call.args[1]
            with torch.no_grad(), call.autocast(), call.random_state():  # the first pass's masks, at w + e
                after = task(*call.args, **call.kwargs)['output']
            before, after = (per_sample_losses(criterion, logits, target) for logits in (call.output, after))
            rows = select(before, after)
            chosen.append(dataclasses.replace(call.rows(x.shape[0], rows), rng=call.rng))
        return self.replay(chosen, scale)

    @staticmethod
    def is_one_chunk(calls: List[TaskCall], m_sharpness: int) -> bool:
        """One process and one micro-batch of exactly ``m_sharpness`` images: train.py's gradient is the chunk's."""
        first = calls[0].args[0] if len(calls) == 1 and calls[0].args else None
        return (world_size() == 1 and isinstance(first, torch.Tensor) and first.dim() > 0
                and first.shape[0] == m_sharpness)

    def chunked_step(self, sam: 'SAM', calls: List[TaskCall], scaling: Optional['LossScaling']) -> None:
        """The m-sharpness update over the recorded calls, each cut into chunks."""
        chunked_update(sam, ReplayChunks(self, calls, sam.settings.m_sharpness), scaling)


class ReplayChunks:
    """The passes of each chunk of the recorded calls (``m_sharpness.ChunkPasses``).

    Each call's chunks start from the random state the call first ran with (a chunk's two passes draw the
    same masks, chunks draw different ones), inside one fork of the generators, so the replay draws nothing
    from the rest of the run.
    """

    def __init__(self, recorder: TaskRecorder, calls: List[TaskCall], m_sharpness: int) -> None:
        task = recorder.task
        if task is None:
            raise RuntimeError('SAM.step(): the training task whose calls were recorded no longer exists')
        self.recorder = recorder
        self.no_sync = no_sync_of(task)
        check_chunk_sync(self.no_sync)
        self.items = _chunks(calls, m_sharpness)  # checks every batch before anything runs
        self._rng: Optional[RngState] = None

    def context(self) -> ContextManager:
        return torch.random.fork_rng(devices=self.recorder.cuda_devices)

    def count(self) -> int:
        return len(self.items)

    def first(self, index: int) -> torch.Tensor:
        call, batch, rows = self.items[index]
        if rows.start == 0 and call.rng is not None:
            call.rng.apply()
        self._rng = RngState.capture(self.recorder.cuda_devices)
        with sync_context(self.no_sync):
            return self.recorder.replay([call.rows(batch, rows)])[0]

    def second(self, index: int) -> None:
        call, batch, rows = self.items[index]
        with sync_context(self.no_sync), self._rng.restored():
            self.recorder.replay([call.rows(batch, rows)])


def per_sample_losses(criterion: Callable[..., torch.Tensor], logits: torch.Tensor,
                      target: torch.Tensor) -> torch.Tensor:
    """Each sample's loss under the task's criterion (any timm loss that averages over the batch: one row each)."""
    return torch.stack([criterion(logits[i:i + 1].float(), target[i:i + 1]).detach() for i in range(len(logits))])


def _chunks(calls: List[TaskCall], m_sharpness: int) -> List[Tuple[TaskCall, int, slice]]:
    items = []
    for idx, call in enumerate(calls):
        first: Any = call.args[0] if call.args else None
        if not isinstance(first, torch.Tensor) or first.dim() == 0:
            raise ValueError(f'SAM m_sharpness needs the training task\'s input as a batched tensor, got '
                             f'{type(first).__name__} (NaFlex dict input cannot be split)')
        batch = first.shape[0]
        where = f' (micro-batch {idx + 1} of {len(calls)})' if len(calls) > 1 else ''
        for i in range(chunk_count(batch, m_sharpness, where)):
            items.append((call, batch, slice(i * m_sharpness, (i + 1) * m_sharpness)))
    return items
