"""fp16 loss scaling for SAM's two passes, on both of torch's ``GradScaler`` contracts.

``GradScaler.step(optimizer)`` treats an optimizer with ``_step_supports_amp_scaling = True`` in one
of two ways:

* **scaler argument** (deprecated by torch, still its choice while ``step`` declares a
  ``grad_scaler`` parameter): the scaler passes itself as ``step(grad_scaler=scaler)``. SAM unscales
  the first-pass gradient through it, scales the second loss with it, and steps the base optimizer
  through ``scaler.step``, so an overflow in either pass skips the update and backs the scale off.
  Custom loops use the same path with ``sam.step(closure, grad_scaler=scaler)``.
* **attributes** (torch's current contract): the scaler sets ``optimizer.grad_scale`` (the scale,
  or None when the gradient was already unscaled, e.g. by train.py before its clipping) and
  ``optimizer.found_inf`` before calling ``step()``, and deletes them afterwards. SAM unscales the
  first-pass gradient with ``grad_scale`` and skips the update on ``found_inf`` (the scaler backs
  off, having computed ``found_inf`` itself). The second pass is SAM's own: its loss is scaled by
  the last scale the scaler gave times a back-off factor that SAM halves on a second-pass
  overflow (that update is skipped) and doubles back after 2000 clean second passes, as
  ``GradScaler`` does with its own scale, since the scaler cannot learn about that pass.
"""
import math
from typing import Any, List, Optional

import torch

from timm_ext.optim.torch_compat import total_norm

__all__ = ['GradScalerArgument', 'GradScalerAttributes', 'LossScaling', 'NO_SCALING', 'SecondPassScale',
           'explicit_scaling', 'scaling_for']


def _grads(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    return [p.grad for group in optimizer.param_groups for p in group['params'] if p.grad is not None]


def _unscale_once(grad_scaler: Any, optimizer: torch.optim.Optimizer) -> None:
    """``grad_scaler.unscale_(optimizer)`` unless it was already called this iteration (train.py does
    before clipping)."""
    try:
        grad_scaler.unscale_(optimizer)
    except RuntimeError as e:
        if 'already been called' not in str(e):
            raise


class LossScaling:
    """No loss scaling (bf16, fp32): the base of the fp16 strategies below."""

    def unscale_first(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring the first-pass gradient of ``optimizer``'s parameters to its true scale."""

    def first_overflowed(self, norm: float) -> bool:
        """Whether the first pass overflowed (the update is then skipped), given the gradient norm."""
        return False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The second-pass loss to back-propagate."""
        return loss

    def unscale_second(self, base_optimizer: torch.optim.Optimizer) -> bool:
        """Unscale the second-pass gradient; False when the update must be skipped."""
        return True

    def step(self, base_optimizer: torch.optim.Optimizer) -> None:
        base_optimizer.step()


NO_SCALING = LossScaling()


class GradScalerArgument(LossScaling):
    """The scaler itself is at hand (``step(grad_scaler=...)``, ``first_step(grad_scaler=...)``)."""

    def __init__(self, grad_scaler: Any) -> None:
        self.grad_scaler = grad_scaler

    def unscale_first(self, optimizer: torch.optim.Optimizer) -> None:
        _unscale_once(self.grad_scaler, optimizer)

    def first_overflowed(self, norm: float) -> bool:
        return not math.isfinite(norm)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.grad_scaler.scale(loss)

    def unscale_second(self, base_optimizer: torch.optim.Optimizer) -> bool:
        _unscale_once(self.grad_scaler, base_optimizer)
        return True  # scaler.step(base) skips an overflowed update and tells update() to back off

    def step(self, base_optimizer: torch.optim.Optimizer) -> None:
        self.grad_scaler.step(base_optimizer)


class SecondPassScale:
    """SAM's loss scale for the second pass under the attribute contract (kept across steps)."""
    growth_interval = 2000

    def __init__(self, init_scale: float = 2.0 ** 16) -> None:
        self.last_scale = init_scale  # the scaler's latest scale (GradScaler's default before the first one)
        self.backoff = 1.0
        self.clean_steps = 0

    @property
    def scale(self) -> float:
        return self.last_scale * self.backoff

    def update(self, finite: bool) -> None:
        if not finite:
            self.backoff *= 0.5
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval and self.backoff < 1.0:
            self.backoff = min(1.0, self.backoff * 2.0)
            self.clean_steps = 0


class GradScalerAttributes(LossScaling):
    """``GradScaler.step`` set ``grad_scale`` / ``found_inf`` on the optimizer (torch's current contract)."""

    def __init__(self, grad_scale: Optional[torch.Tensor], found_inf: torch.Tensor, state: SecondPassScale) -> None:
        self.grad_scale = None if grad_scale is None else float(grad_scale)
        self.found_inf = found_inf
        self.state = state
        self._second_scale = 1.0

    def unscale_first(self, optimizer: torch.optim.Optimizer) -> None:
        if self.grad_scale is not None:
            self.state.last_scale = self.grad_scale
            grads = _grads(optimizer)
            if grads:
                torch._foreach_mul_(grads, 1.0 / self.grad_scale)

    def first_overflowed(self, norm: float) -> bool:
        return bool(self.found_inf.item()) or not math.isfinite(norm)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        self._second_scale = self.state.scale
        return loss * self._second_scale

    def unscale_second(self, base_optimizer: torch.optim.Optimizer) -> bool:
        grads = _grads(base_optimizer)
        if not grads:
            return True
        torch._foreach_mul_(grads, 1.0 / self._second_scale)
        finite = math.isfinite(float(total_norm(grads)))
        self.state.update(finite)
        return finite


def scaling_for(optimizer: torch.optim.Optimizer, grad_scaler: Optional[Any], state: SecondPassScale) -> LossScaling:
    """``step()``'s loss scaling: the scaler passed in, else the attributes ``GradScaler.step`` set, else none."""
    if grad_scaler is not None:
        return GradScalerArgument(grad_scaler)
    found_inf = getattr(optimizer, 'found_inf', None)
    if found_inf is not None:
        return GradScalerAttributes(getattr(optimizer, 'grad_scale', None), found_inf, state)
    return NO_SCALING


def explicit_scaling(grad_scaler: Optional[Any]) -> LossScaling:
    """``first_step``/``second_step``'s loss scaling (a bool here is a misplaced ``zero_grad``)."""
    if isinstance(grad_scaler, bool):
        raise TypeError(f'SAM got grad_scaler={grad_scaler!r}: pass zero_grad= by keyword, '
                        f'grad_scaler= takes a torch.amp.GradScaler or None')
    return GradScalerArgument(grad_scaler) if grad_scaler is not None else NO_SCALING
