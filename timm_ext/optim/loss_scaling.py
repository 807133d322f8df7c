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
  off, having computed ``found_inf`` itself). The second pass needs a scaler of its own:
  GradScaler.step hands the optimizer the first pass's scale and inf check only, and the second backward
  runs inside ``step()``, where the caller's scaler never sees it; so it goes through a second
  ``torch.amp.GradScaler`` (scale, ``unscale_``, ``step``, ``update``: GradScaler's own contract), started at
  the first scale the caller's scaler gave and kept by the driver across steps.
"""
import math
from typing import Any, Dict, List, Optional

import torch

from timm_ext.optim.sharded import global_norm
from timm_ext.optim.torch_compat import total_norm

__all__ = ['GradScalerArgument', 'GradScalerAttributes', 'LossScaling', 'NO_SCALING',
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

    def gradient_overflowed(self, params: List[torch.Tensor]) -> bool:
        """Whether the (unscaled) gradient of ``params`` overflowed: a plain step's check."""
        return self.first_overflowed(global_norm([p.grad for p in params], params))

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


class GradScalerAttributes(LossScaling):
    """``GradScaler.step`` set ``grad_scale`` / ``found_inf`` on the optimizer (torch's current contract); the
    second pass goes through ``state['second_pass_scaler']``, a GradScaler of SAM's own (see the module docstring)."""

    def __init__(self, grad_scale: Optional[torch.Tensor], found_inf: torch.Tensor, state: Dict[str, Any]) -> None:
        self.grad_scale = None if grad_scale is None else float(grad_scale)
        self.found_inf = found_inf
        self.state = state

    def unscale_first(self, optimizer: torch.optim.Optimizer) -> None:
        if self.grad_scale is not None:
            grads = _grads(optimizer)
            if grads:
                torch._foreach_mul_(grads, 1.0 / self.grad_scale)

    def first_overflowed(self, norm: float) -> bool:
        return bool(self.found_inf.item()) or not math.isfinite(norm)

    def _second_pass_scaler(self, device_type: str) -> Any:
        scaler = self.state.get('second_pass_scaler')
        if scaler is None:
            init_scale = self.grad_scale if self.grad_scale is not None else 2.0 ** 16  # GradScaler's default
            scaler = self.state['second_pass_scaler'] = torch.amp.GradScaler(device_type, init_scale=init_scale)
        return scaler

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self._second_pass_scaler(loss.device.type).scale(loss)

    def unscale_second(self, base_optimizer: torch.optim.Optimizer) -> bool:
        grads = _grads(base_optimizer)
        scaler = self.state.get('second_pass_scaler')
        if not grads or scaler is None:
            return True
        scaler.unscale_(base_optimizer)
        if math.isfinite(float(total_norm(grads))):
            return True
        scaler.update()  # the inf unscale_ found: the scale backs off, and this update is skipped
        return False

    def step(self, base_optimizer: torch.optim.Optimizer) -> None:
        scaler = self.state.get('second_pass_scaler')
        if scaler is None:
            base_optimizer.step()
            return
        scaler.step(base_optimizer)
        scaler.update()


def scaling_for(optimizer: torch.optim.Optimizer, grad_scaler: Optional[Any], state: Dict[str, Any]) -> LossScaling:
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
