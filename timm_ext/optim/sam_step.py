"""``SAM.step()``: the passes of one update, and what a step keeps for the next.

One update, whoever evaluates the loss:

    passes.first(i)        the gradient at w         (the closure; or your backward / train.py's, already done)
    sam.ascend()           to w + e
    passes.second(i)       the gradient at w + e     (the closure again; or timm's training task replayed)
    sam.descend()          back to w, the gradient adjusted (GSAM)
    sam.apply_descent()    the base optimizer's step (LookSAM observes it)

once, or once per chunk of ``m_sharpness`` images with the chunks' mean applied. ``SAM.step`` calls
``StepDriver.step`` (each SAM holds one); from there to the base optimizer's ``step`` is this file and ``sam.py``.
The passes follow the ``Passes`` protocol: ``closure_passes`` for ``step(closure)`` (torch's closure convention or
davda54/sam's, told apart by ``left_gradients``), or a ``Replay`` of timm's training task that ``replay_timm_task``
attached (``replay_passes``, above this file). A framework setting that cannot give SAM an exact update is refused
in one line by the checks its integration module registered (``framework_checks``).
"""
from typing import Any, Callable, ContextManager, Dict, List, Optional, Protocol

import torch

from timm_ext.optim.closure_passes import ClosurePasses
from timm_ext.optim.ddp import NoSync, all_reduce_mean, world_size
from timm_ext.optim.framework_checks import closure_problem, stepless_problem
from timm_ext.optim.left_gradients import LeftGradients
from timm_ext.optim.loss_scaling import NO_SCALING, LossScaling, SecondPassScaler, scaling_for
from timm_ext.optim.m_sharpness import GradientSum, refuse_loss_scaling
from timm_ext.optim.rng import cuda_devices_of
from timm_ext.optim.sharded import global_norm, refuse_sharded_chunks

__all__ = ['HOW_TO_USE', 'NoSecondPassError', 'Passes', 'Replay', 'StepDriver']

HOW_TO_USE = (
    'pass a closure (optimizer.step(closure)), call first_step() and second_step() around your second '
    'forward-backward, train with timm\'s train.py (task API, timm >= 1.0.23), where SAM replays the task, '
    'call timm_ext.optim.replay_timm_task(optimizer, task) once in your own loop over a timm training task, '
    'or use timm_ext.integrations.hf_trainer.SAMTrainer in the Hugging Face Trainer')
FINISH_ONLY = ('SAM.step() after first_step() finishes the update as second_step() does: call it without a '
               'closure, and with an fp16 GradScaler call sam.second_step(grad_scaler=scaler) yourself (a wrapper '
               'hiding step\'s grad_scaler argument, e.g. Accelerate\'s, cannot hand SAM the second pass\'s scale); '
               'the weights are back at w')


class NoSecondPassError(RuntimeError):
    """``step()`` has gradients but no way to evaluate the loss at w + e (no closure, no training task replayed):
    SAM refuses rather than take a plain base-optimizer step that would silently not be SAM."""


class Passes(Protocol):
    """One update's forward-backward passes, per chunk (one chunk without m-sharpness)."""
    chunked: bool  # m-sharpness: each chunk ascends with its own gradient, the chunks' mean is applied
    first_pass_done: bool  # the gradient at w is there before step() (train.py's backward, davda54's loop)

    def count(self) -> int:
        """How many chunks (known after the first pass of the first one)."""

    def context(self) -> ContextManager:
        """Around all the passes of the update."""

    def plain_pass(self) -> Any:
        """A plain step's one pass (``interval``); returns its loss, if it ran one."""

    def first(self, index: int) -> Any:
        """The gradient at w of chunk ``index`` (nothing to do when ``first_pass_done``); returns the loss."""

    def second(self, index: int, scale_loss: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        """The gradient at w + e of chunk ``index``, its loss scaled by ``scale_loss`` (fp16)."""

    def may_move_buffers(self, loss: Any) -> bool:
        """Whether the passes may move module buffers (worth a warning when SAM has no model), given a loss."""

    def result(self, losses: List[Any]) -> Any:
        """What ``step()`` returns, given each chunk's first-pass loss."""


class Replay(Protocol):
    """timm's training task, recorded so that ``step()`` without a closure can run the second pass."""

    @property
    def has_calls(self) -> bool:
        """Whether task calls were recorded since the last step."""

    def passes(self, has_grads: bool, sam_step_due: bool, m_sharpness: Optional[int]) -> Passes:
        """This step's passes over the recorded calls (a one-line error where there is nothing to replay)."""

    def close(self) -> None:
        """Stop recording, for good."""


class StepDriver:
    """Runs ``SAM.step()`` for one SAM, and keeps what a step leaves for the next: the training task's replay,
    the fp16 second-pass scaler, whether the passes may move buffers, and the gradients the last step left."""

    def __init__(self, params: List[torch.Tensor]) -> None:
        self.replay: Optional[Replay] = None
        self.second_pass = SecondPassScaler()
        self.left = LeftGradients(params)
        self._moves_buffers: Optional[bool] = None  # whether the passes may move buffers SAM cannot hold

    def attach_replay(self, replay: Optional[Replay]) -> None:
        """``step()`` without a closure replays ``replay`` (the one attached before closes)."""
        self.close_replay()
        self.replay = replay

    def close_replay(self) -> None:
        """A closure or first_step() drives this SAM: the training task's replay is never needed."""
        if self.replay is not None:
            self.replay.close()

    def state_dict(self) -> Dict[str, Any]:
        state = self.second_pass.state_dict()
        return {} if state is None else {'second_pass_scaler': state}

    def load_state_dict(self, entry: Dict[str, Any]) -> None:
        self.second_pass.load_state_dict(entry.get('second_pass_scaler'))

    def step(self, sam: Any, closure: Optional[Callable[..., Any]], grad_scaler: Optional[Any],
             no_sync: NoSync) -> Optional[Any]:
        """``SAM.step(closure, grad_scaler, no_sync)`` for ``sam`` (SAM or its family; its public methods only)."""
        if sam.perturbed:  # after first_step() and your second backward (a framework's step())
            if closure is not None or getattr(sam, 'found_inf', None) is not None:
                sam.cancel_step()
                raise RuntimeError(FINISH_ONLY)
            sam.second_step(grad_scaler=grad_scaler)
            return None
        scaling = scaling_for(sam, grad_scaler, self.second_pass)
        params = [p for group in sam.param_groups for p in group['params']]
        passes: Optional[Passes] = None
        if closure is not None:
            problem = closure_problem(closure, sam)
            if problem:
                raise ValueError(problem)
            self.close_replay()
            passes = ClosurePasses(closure, sam.settings.m_sharpness, no_sync, cuda_devices_of(params), params,
                                   self.left)
        elif no_sync is not None:
            raise ValueError('SAM.step(no_sync=...) needs a closure (the first pass is train.py\'s own)')
        elif (problem := stepless_problem(sam)) is not None:
            raise ValueError(problem)
        elif self.replay is None or not self.replay.has_calls:
            if not sam.params_with_grad():
                return None  # no gradient anywhere: nothing to step, as for any torch optimizer
            if _zero_gradient(params) or not sam.sam_step_due:
                # g = 0: e = 0, the pass at w + e is the one at w (torch.distributed.checkpoint steps on zero
                # gradients to create the optimizer's state); a plain step (interval) needs no second pass
                sam.plain_step(scaling)
                self.left.record(params)
                return None
        if passes is None:
            if self.replay is None:
                raise NoSecondPassError('SAM.step() without a closure can only re-evaluate the loss by replaying a '
                                        f'timm training task, and none was attached to this optimizer: {HOW_TO_USE}')
            passes = self.replay.passes(bool(sam.params_with_grad()), sam.sam_step_due, sam.settings.m_sharpness)
        if not sam.sam_step_due:
            loss = passes.plain_pass()
            sam.plain_step(scaling)
        else:
            if passes.chunked:
                refuse_sharded_chunks(sam.settings.m_sharpness, params)
                refuse_loss_scaling(scaling is not NO_SCALING)
            loss = passes.result(self._update(sam, passes, scaling))
        self.left.record(params)
        return loss

    def _update(self, sam: Any, passes: Passes, scaling: LossScaling) -> List[Any]:
        """The passes of one SAM update: per chunk (one without m-sharpness) the gradient at w, the gradient at
        w + e, back to w; then the (mean) second-pass gradient is applied. Weights and buffers are back at w
        whatever fails in between."""
        descent, clean = GradientSum(), GradientSum()
        losses, second_loss = [], None
        with passes.context():
            try:
                if passes.first_pass_done or passes.chunked:  # buffers as before SAM's own passes
                    sam.hold_buffers()
                index = 0
                while index == 0 or index < passes.count():
                    if passes.chunked:
                        sam.zero_grad()  # each chunk's own gradient (the whole batch's is not used)
                    losses.append(passes.first(index))
                    if not passes.first_pass_done and self._may_move_buffers(sam, passes, losses[0]):
                        sam.warn_unknown_model()
                    sam.ascend(scaling)
                    sam.zero_grad()
                    if not sam.update_skipped:  # an fp16 overflow in the first pass: no second one
                        second_loss = passes.second(index, scaling.scale)
                    descend = sam.descend(scaling)
                    if passes.chunked:
                        descent.add(sam.params_with_grad())
                        clean.add_values(sam.clean_gradients())
                    index += 1
            except BaseException:
                sam.cancel_step()
                raise
        sam.release_buffers()
        if passes.first_pass_done and self._may_move_buffers(sam, passes, second_loss):
            sam.warn_unknown_model()  # told by the closure's loss at w + e (the first pass was the caller's)
        clean_grads = sam.clean_gradients()
        if passes.chunked:  # the mean over the chunks, then over the workers (one all-reduce each)
            descent.write_mean_to_grads()
            clean_grads = clean.mean()
            if world_size() > 1:
                all_reduce_mean([p.grad for p in sam.params_with_grad()])
                all_reduce_mean(list(clean_grads.values()))
        sam.apply_descent(descend, scaling, clean_grads)
        return losses

    def _may_move_buffers(self, sam: Any, passes: Passes, loss: Any) -> bool:
        """Whether SAM without a model is worth a warning: the passes may move buffers it cannot hold (asked once)."""
        if sam.model is not None:
            return False
        if self._moves_buffers is None:
            self._moves_buffers = passes.may_move_buffers(loss)
        return self._moves_buffers


def _zero_gradient(params: List[torch.Tensor]) -> bool:
    """Every parameter has a gradient and all of them are zero."""
    return bool(params) and all(p.grad is not None for p in params) and global_norm(
        [p.grad for p in params], params) == 0

