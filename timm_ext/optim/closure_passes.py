"""SAM's two passes from ``step(closure)``, in either closure convention (``left_gradients``).

* torch's: the closure zeroes the grads, computes and back-propagates the loss, and returns it; it runs at w and
  at w + e. Both calls of a chunk draw the same random numbers (dropout, drop-path): the generators' state is
  taken before the first call and restored, in a fork, for the second, as the paper's JAX code uses one PRNG key
  per step.
* davda54/sam's (and pytorch-optimizer's): the caller ran the backward at w before ``step(closure)``; the closure
  runs once, at w + e, in the random state of the moment (the caller's forward drew its masks already).

With ``no_sync`` (e.g. ``ddp_model.no_sync``) the first pass stays local to the worker, so each worker perturbs
with its own gradient; under m-sharpness both passes of every chunk do, and SAM all-reduces the mean once.
m-sharpness cuts the closure's batch with the ``chunk`` it is handed, so it always runs both passes per chunk.
"""
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, List, Optional, Sequence

import torch

from timm_ext.optim.ddp import NoSync, sync_context
from timm_ext.optim.left_gradients import LeftGradients
from timm_ext.optim.m_sharpness import BatchChunk, check_chunk_sync, mean_loss
from timm_ext.optim.rng import RngState

__all__ = ['ClosurePasses', 'batch_norm_in_graph']


class ClosurePasses:
    """The passes of one update from ``closure`` (the ``Passes`` protocol of ``sam_step``); cut into chunks of
    ``m_sharpness`` images when given. ``first_pass_done``: the caller's backward at w is the first pass."""

    def __init__(self, closure: Callable[..., Any], m_sharpness: Optional[int], no_sync: NoSync,
                 cuda_devices: Sequence[int], params: Sequence[torch.Tensor], left: LeftGradients) -> None:
        self.closure = closure
        self.params = list(params)
        self.left = left
        self.cuda_devices = tuple(cuda_devices)  # the generators a pass over the parameters draws from
        self.chunked = bool(m_sharpness)
        self.chunk = BatchChunk(m_sharpness) if self.chunked else None
        self.no_sync = no_sync
        self.first_pass_done = not self.chunked and left.first_pass_done(self.params)
        self._rng: Optional[RngState] = None

    def _call(self) -> Any:
        with torch.enable_grad():
            return self.closure(self.chunk) if self.chunked else self.closure()

    def plain_pass(self) -> Any:
        """A plain step's one pass (``interval``): the whole batch (``chunk(x, y)`` returns it unchanged); nothing
        when the caller's backward is there already."""
        if self.first_pass_done:
            return None
        if self.chunked:
            self.chunk = BatchChunk(None)
        loss = self._call()
        self.left.check_closure_zeroed(self.params)
        return loss

    def context(self) -> ContextManager:
        if self.chunked:
            check_chunk_sync(self.no_sync)
        return nullcontext()

    def count(self) -> int:
        return self.chunk.count if self.chunked else 1

    def first(self, index: int) -> Any:
        if self.first_pass_done:
            return None
        if self.chunked:
            self.chunk.index = index
        self._rng = RngState.capture(self.cuda_devices)
        with sync_context(self.no_sync):
            loss = self._call()
        if index == 0:
            self.left.check_closure_zeroed(self.params)
        return loss

    def second(self, index: int, scale_loss: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        """The closure scales its own loss (``scaler.scale(loss).backward()``), so ``scale_loss`` is not used."""
        same_masks = self._rng.restored() if self._rng is not None else nullcontext()
        with sync_context(self.no_sync if self.chunked else None), same_masks:
            return self._call()

    def may_move_buffers(self, loss: Any) -> bool:
        """Whether the closure's forward may move module buffers SAM was not given: batch norm in the graph of the
        loss it returned (a loss without a graph cannot tell: True)."""
        return batch_norm_in_graph(loss)

    def result(self, losses: List[Any]) -> Any:
        """The loss at w (m-sharpness: the chunks' mean); None when the first pass was the caller's."""
        return mean_loss(losses) if self.chunked else losses[0]


def batch_norm_in_graph(loss: Any) -> bool:
    """Whether ``loss``'s autograd graph has a batch-norm node (the one layer whose forward updates buffers in
    timm's and torch's models); True when ``loss`` has no graph to look at."""
    node = getattr(loss, 'grad_fn', None)
    if node is None:
        return True
    seen, todo = {node}, [node]
    while todo:
        node = todo.pop()
        if 'batchnorm' in type(node).__name__.lower():
            return True
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                seen.add(child)
                todo.append(child)
    return False
