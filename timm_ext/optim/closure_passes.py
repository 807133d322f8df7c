"""SAM's two passes from a closure (torch's convention): the closure zeroes the grads, computes and
back-propagates the loss, and returns it.

Both passes of a chunk draw the same random numbers (dropout, drop-path): the generators' state is taken
before the first pass and restored, in a fork, for the second, as the paper's JAX code uses one PRNG key
per step. With ``no_sync`` (e.g. ``ddp_model.no_sync``) the first pass stays local to the worker, so each
worker perturbs with its own gradient; under m-sharpness both passes of every chunk do, and SAM
all-reduces the mean once.
"""
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, List, Optional, Sequence

import torch

from timm_ext.optim.ddp import sync_context
from timm_ext.optim.m_sharpness import BatchChunk, check_chunk_sync, mean_loss
from timm_ext.optim.rng import RngState

__all__ = ['ACCUMULATION', 'ClosurePasses', 'batch_norm_in_graph']

ACCUMULATION = (
    'SAM.step(closure): the closure added to gradients of earlier backward passes without zeroing them, i.e. '
    'gradient accumulation (Lightning accumulate_grad_batches > 1, Accelerate gradient_accumulation_steps > 1), '
    'and SAM can re-evaluate only the closure\'s own batch at w + e: train on the accumulated batch at once, or '
    'call first_step(), replay the window and step() (docs/integrations.md); a closure must call '
    'optimizer.zero_grad()')


class ClosurePasses:
    """The passes of one update from ``closure``; cut into chunks of ``m_sharpness`` images when given."""
    first_pass_done = False

    def __init__(self, closure: Callable[..., Any], m_sharpness: Optional[int],
                 no_sync: Optional[Callable[[], ContextManager]] = None, cuda_devices: Sequence[int] = (),
                 params: Sequence[torch.Tensor] = (), zero_grad_calls: Callable[[], int] = lambda: 0) -> None:
        self.closure = closure
        self.params = list(params)
        self.zero_grad_calls = zero_grad_calls  # how often the optimizer's zero_grad() ran so far
        self.cuda_devices = tuple(cuda_devices)  # the generators a pass over the parameters draws from
        self.chunked = bool(m_sharpness)
        self.chunk = BatchChunk(m_sharpness) if self.chunked else None
        self.no_sync = no_sync
        self._rng: Optional[RngState] = None

    def _call(self) -> Any:
        with torch.enable_grad():
            return self.closure(self.chunk) if self.chunked else self.closure()

    def _first_call(self) -> Any:
        """The closure's first call, refused if it added to gradients it did not zero (accumulation)."""
        before = {p: p.grad for p in self.params if p.grad is not None}
        zeroed = self.zero_grad_calls()
        loss = self._call()
        if before and self.zero_grad_calls() == zeroed and all(p.grad is g for p, g in before.items()):
            raise ValueError(ACCUMULATION)
        return loss

    def plain_pass(self) -> Any:
        """A plain step's one pass: the whole batch (``chunk(x, y)`` returns it unchanged)."""
        if self.chunked:
            self.chunk = BatchChunk(None)
        return self._first_call()

    def context(self) -> ContextManager:
        if self.chunked:
            check_chunk_sync(self.no_sync)
        return nullcontext()

    def count(self) -> int:
        return self.chunk.count if self.chunked else 1

    def first(self, index: int) -> Any:
        if self.chunked:
            self.chunk.index = index
        self._rng = RngState.capture(self.cuda_devices)
        with sync_context(self.no_sync):
            return self._first_call() if index == 0 else self._call()

    def second(self, index: int, scale_loss: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The closure scales its own loss (``scaler.scale(loss).backward()``), so ``scale_loss`` is not used."""
        with sync_context(self.no_sync if self.chunked else None), self._rng.restored():
            self._call()

    def may_move_buffers(self, loss: Any) -> bool:
        """Whether the closure's forward may move module buffers SAM was not given: batch norm in the graph of the
        loss it returned (a loss without a graph cannot tell: True)."""
        return batch_norm_in_graph(loss)

    def result(self, losses: List[Any]) -> Any:
        """The loss at w (m-sharpness: the chunks' mean)."""
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
