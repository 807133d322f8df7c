"""Whether the pass at w + e moves BatchNorm statistics, seen once, for a SAM that was not given the model.

SAM holds the model's buffers through its second pass when it knows the model. Without it, whether that pass moves
them depends on the model (batch norm in training mode with a momentum) and on the caller: davda54/sam's example
sets every BatchNorm's momentum to 0 for that pass. Only the calls themselves tell, so ``BatchNormWatch`` (a torch
function mode entered around one second pass, SAM's first) sees each batch-norm call and records whether any of
them updates running statistics. SAM warns only when one does.

With ``first_step()`` / ``second_step()`` the pass is the caller's, between the two calls, so the watch spans them.
It never outlives its SAM's interest: ``stop()`` (second_step, or cancel_step) leaves it, and if the SAM is dropped
in between (an exception, a test), the watch switches itself off and leaves the mode stack where it is on top.
"""
import weakref
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

__all__ = ['BatchNormWatch']


def _functional(input, running_mean=None, running_var=None, weight=None, bias=None, training=False, momentum=0.1,
                eps=1e-5) -> Tuple[Any, bool, Any]:
    return running_mean, training, momentum


def _aten(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled
          ) -> Tuple[Any, bool, Any]:
    return running_mean, training, momentum


def _sync(input, mean, invstd, running_mean, running_var, momentum, eps, counts) -> Tuple[Any, bool, Any]:
    return running_mean, True, momentum  # SyncBatchNorm's training forward under DDP


# each call that can update running statistics, and how to read (running_mean, training, momentum) from its arguments
_READERS: Dict[Callable[..., Any], Callable[..., Tuple[Any, bool, Any]]] = {
    F.batch_norm: _functional,
    torch.batch_norm: _aten,
    torch.batch_norm_gather_stats_with_counts: _sync,
}


class BatchNormWatch(TorchFunctionMode):
    """Inside it, ``moved`` turns True at the first batch-norm call that updates running statistics (training, with
    running statistics, momentum not 0; a momentum of None is a cumulative average, which updates too)."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = False
        self.active = False

    def __torch_function__(self, func: Callable[..., Any], types: Sequence[type], args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        reader = _READERS.get(func) if self.active and not self.moved else None
        if reader is not None:
            running_mean, training, momentum = reader(*args, **kwargs)
            self.moved = running_mean is not None and bool(training) and momentum != 0
        return func(*args, **kwargs)

    def start(self, owner: Any) -> 'BatchNormWatch':
        """Enter the watch for ``owner`` (a SAM), which stops it after its pass at w + e; stopped if it is dropped."""
        self.__enter__()
        self.active = True
        weakref.finalize(owner, self.stop)
        return self

    def stop(self) -> bool:
        """Leave the watch (off at once; off the mode stack where it is on top); whether a batch-norm call inside it
        updated running statistics."""
        if self.active:
            self.active = False
            stack = _get_current_function_mode_stack()
            if stack and stack[-1] is self:
                self.__exit__(None, None, None)
        return self.moved
