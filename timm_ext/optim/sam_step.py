"""``SAM.step()``: who runs the two passes, above the SAM core and on its public methods only.

One update, whoever evaluates the loss:

    passes.first(i)         the gradient at w        (a closure; train.py's own backward, replayed per chunk)
    sam.ascend()            to w + e
    passes.second(i)        the gradient at w + e    (the closure again; the training task replayed)
    sam.descend()           back to w, the gradient adjusted (GSAM)
    sam.apply_descent()     the base optimizer's step (LookSAM observes it)

once, or once per chunk of ``m_sharpness`` images with the chunks' mean applied. The passes come from
``closure_passes`` (``step(closure)``) or ``replay_passes`` (``step()`` after timm's training task, attached by
``task_replay``). A framework that cannot give SAM an exact update is refused in one line by the checks its
integration module registered (``framework_checks``). Installed as ``SAM.driver`` by ``timm_ext.optim``.
"""
from typing import Any, Callable, List, Optional

import torch

from timm_ext.optim.closure_passes import ClosurePasses
from timm_ext.optim.ddp import all_reduce_mean, world_size
from timm_ext.optim.framework_checks import closure_problem, stepless_problem
from timm_ext.optim.loss_scaling import NO_SCALING, LossScaling, scaling_for
from timm_ext.optim.m_sharpness import GradientSum, refuse_loss_scaling
from timm_ext.optim.replay_passes import HOW_TO_USE, replay_passes
from timm_ext.optim.rng import cuda_devices_of
from timm_ext.optim.sam import SAM
from timm_ext.optim.sharded import global_norm, refuse_sharded_chunks

__all__ = ['HOW_TO_USE', 'run_step']

FINISH_ONLY = ('SAM.step() after first_step() finishes the update as second_step() does: call it without a '
               'closure, and with an fp16 GradScaler call sam.second_step(grad_scaler=scaler) yourself (a wrapper '
               'hiding step\'s grad_scaler argument, e.g. Accelerate\'s, cannot hand SAM the second pass\'s scale); '
               'the weights are back at w')


def run_step(sam: SAM, closure: Optional[Callable[..., Any]], grad_scaler: Optional[Any],
             no_sync: Optional[Callable[[], Any]]) -> Optional[Any]:
    """``SAM.step(closure, grad_scaler, no_sync)``: see its docstring."""
    if sam.perturbed:  # after first_step() and your second backward (a framework's step())
        if closure is not None or getattr(sam, 'found_inf', None) is not None:
            sam.cancel_step()
            raise RuntimeError(FINISH_ONLY)
        sam.second_step(grad_scaler=grad_scaler)
        return None
    scaling = scaling_for(sam, grad_scaler, sam.driver_state)
    params = [p for group in sam.param_groups for p in group['params']]
    if closure is not None:
        problem = closure_problem(closure, sam)
        if problem:
            raise ValueError(problem)
        if sam.replay is not None:
            sam.replay.close()  # a closure loop never needs the training task's replay
        passes = ClosurePasses(closure, sam.settings.m_sharpness, no_sync, cuda_devices_of(params), params,
                               lambda: sam.zero_grad_calls)
    elif no_sync is not None:
        raise ValueError('SAM.step(no_sync=...) needs a closure (the first pass is train.py\'s own)')
    elif (problem := stepless_problem(sam)) is not None:
        raise ValueError(problem)
    elif (sam.replay is None or not sam.replay.calls) and not sam.params_with_grad():
        return None  # no gradient anywhere: nothing to step, as for any torch optimizer
    elif (sam.replay is None or not sam.replay.calls) and _zero_gradient(params):
        # g = 0: e = 0, the pass at w + e is the one at w (torch.distributed.checkpoint steps on zero gradients
        # to create the optimizer's state)
        sam.plain_step(scaling)
        return None
    else:
        passes = replay_passes(sam.replay, bool(sam.params_with_grad()), sam.sam_step_due, sam.settings.m_sharpness)
    if not sam.sam_step_due:
        loss = passes.plain_pass()
        sam.plain_step(scaling)
        return loss
    if passes.chunked:
        refuse_sharded_chunks(sam.settings.m_sharpness, params)
        refuse_loss_scaling(scaling is not NO_SCALING)
    return passes.result(_sam_update(sam, passes, scaling))


def _zero_gradient(params: List[torch.Tensor]) -> bool:
    """Every parameter has a gradient and all of them are zero."""
    return bool(params) and all(p.grad is not None for p in params) and global_norm(
        [p.grad for p in params], params) == 0


def _sam_update(sam: SAM, passes: Any, scaling: LossScaling) -> List[Any]:
    """The passes of one SAM update: per chunk (one without m-sharpness) the gradient at w, the gradient at
    w + e, back to w; then the (mean) second-pass gradient is applied. Weights and buffers are back at w
    whatever fails in between."""
    descent, clean = GradientSum(), GradientSum()
    losses = []
    with passes.context():
        try:
            if passes.first_pass_done or passes.chunked:  # buffers as before SAM's own passes
                sam.hold_buffers(warn_unknown_model=False)
            index = 0
            while index == 0 or index < passes.count():
                if passes.chunked:
                    sam.zero_grad()  # each chunk's own gradient (train.py's whole-batch one is not used)
                losses.append(passes.first(index))
                sam.ascend(scaling, warn_unknown_model=_may_move_buffers(sam, passes, losses[0]))
                sam.zero_grad()
                if not sam.update_skipped:  # an fp16 overflow in the first pass: no second one
                    passes.second(index, scaling.scale)
                descend = sam.descend(scaling)
                if passes.chunked:
                    descent.add(sam.params_with_grad())
                    clean.add_values(sam.clean_gradients())
                index += 1
        except BaseException:
            sam.cancel_step()
            raise
    sam.release_buffers()
    clean_grads = sam.clean_gradients()
    if passes.chunked:  # the mean over the chunks, then over the workers (one all-reduce each)
        descent.write_mean_to_grads()
        clean_grads = clean.mean()
        if world_size() > 1:
            all_reduce_mean([p.grad for p in sam.params_with_grad()])
            all_reduce_mean(list(clean_grads.values()))
    sam.apply_descent(descend, scaling, clean_grads)
    return losses


def _may_move_buffers(sam: SAM, passes: Any, loss: Any) -> bool:
    """Whether an unknown model is worth a warning: the passes may move buffers SAM cannot hold (asked once)."""
    if sam.model is not None:
        return True
    known = sam.driver_state.get('may_move_buffers')
    if known is None:
        known = sam.driver_state['may_move_buffers'] = passes.may_move_buffers(loss)
    return known
