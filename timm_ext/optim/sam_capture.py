"""SAM inside timm's unmodified train.py: ``step()`` without a closure replays the training task's calls of
this step at w + e (the calls are recorded by ``timm_ext.optim.task_capture``)."""
from timm_ext.optim.loss_scaling import LossScaling
from timm_ext.optim.task_capture import RecorderState

__all__ = ['HOW_TO_USE', 'TaskReplayStep']

HOW_TO_USE = (
    'pass a closure (optimizer.step(closure)), call first_step() and second_step() around your second '
    'forward-backward, or train with timm\'s train.py (task API, timm >= 1.0.23), where SAM replays the task')


class TaskReplayStep:
    """The part of :class:`timm_ext.optim.SAM` that steps without a closure (train.py's route)."""

    def _replay_step(self, scaling: LossScaling) -> None:
        calls = self.recorder.take()
        if not self._has_grads():
            if calls:
                raise RuntimeError('SAM.step(): the training task ran but no gradients exist; '
                                   'call backward() on its loss before step()')
            raise RuntimeError(f'SAM.step() has no closure, no gradients and no captured training-task call: '
                               f'{HOW_TO_USE}')
        if not self.sam_step_due:  # a plain step needs no replay
            self._plain_step(scaling)
            return
        if not calls:
            closed = (' (task capture was turned off because this optimizer was driven by a closure or by '
                      'first_step(), or a newer SAM over the same parameters took its task)'
                      if self.recorder.state is RecorderState.CLOSED else '')
            raise RuntimeError(
                'SAM.step() without a closure can only re-evaluate the loss inside timm\'s train.py task API, '
                f'but no timm TrainingTask call was captured since the last step{closed}: {HOW_TO_USE}')
        if self.settings.m_sharpness and not self._one_local_chunk(calls):
            self._chunked_replay_step(calls, scaling)
            return
        self._first_step(scaling)
        with self._restore_on_error():
            if not self._skip:
                self.recorder.replay(calls, scaling.scale)
        self._second_step(scaling)
