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
  the first scale the caller's scaler gave, kept by SAM across steps (``SecondPassScaler``) and saved
  in the optimizer's state dict, so a resumed run continues with the scale it had.

SAM makes one only when ``step()`` is handed a scaler (None means fp32 or bf16, and nothing here runs).
"""
import math
from typing import Any, Dict, List, Optional

import torch

from timm_ext.optim.sam_functional import total_norm
from timm_ext.optim.sharded import global_norm

__all__ = ['GradScalerArgument', 'GradScalerAttributes', 'LossScaling', 'SecondPassScaler',
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
    """The points where fp16 loss scaling enters SAM's update (no-ops here: the base of the two contracts below)."""

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

    def step_scaler(self) -> Optional[Any]:
        """The ``GradScaler`` whose ``step(base_optimizer)`` runs the base step (it skips an overflowed one), or
        None: the base optimizer steps by itself."""
        return None

    def after_step(self) -> None:
        """After the base step (a scaler of SAM's own updates its scale)."""


class SecondPassScaler:
    """The ``GradScaler`` of SAM's own for the second pass under torch's attribute contract: made at the first
    fp16 step, kept across steps, and saved and loaded with the optimizer (a state loaded before it exists is
    applied when it is made)."""

    def __init__(self) -> None:
        self.scaler: Optional[Any] = None
        self._loaded: Optional[Dict[str, Any]] = None

    def get(self, device_type: str, init_scale: float) -> Any:
        if self.scaler is None:
            self.scaler = torch.amp.GradScaler(device_type, init_scale=init_scale)
            if self._loaded is not None:
                self.scaler.load_state_dict(self._loaded)
                self._loaded = None
        return self.scaler

    def state_dict(self) -> Optional[Dict[str, Any]]:
        return self.scaler.state_dict() if self.scaler is not None else self._loaded

    def entry(self) -> Dict[str, Any]:
        """What SAM's state-dict entry keeps of it: ``second_pass_scaler``, once there is one."""
        state = self.state_dict()
        return {} if state is None else {'second_pass_scaler': state}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        """A checkpoint's scaler state (checked by ``sam_checkpoint``), or None: no scaler until the next fp16 step."""
        if self.scaler is not None and state is not None:
            self.scaler.load_state_dict(state)
        else:
            self.scaler, self._loaded = None, (dict(state) if state is not None else None)


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

    def step_scaler(self) -> Optional[Any]:
        return self.grad_scaler  # the caller's: its step skips an overflowed update and update() backs off


class GradScalerAttributes(LossScaling):
    """``GradScaler.step`` set ``grad_scale`` / ``found_inf`` on the optimizer (torch's current contract); the
    second pass goes through ``second_pass``, a GradScaler of SAM's own (see the module docstring)."""

    def __init__(self, grad_scale: Optional[torch.Tensor], found_inf: torch.Tensor,
                 second_pass: SecondPassScaler) -> None:
        self.grad_scale = None if grad_scale is None else float(grad_scale)
        self.found_inf = found_inf
        self.second_pass = second_pass

    def unscale_first(self, optimizer: torch.optim.Optimizer) -> None:
        if self.grad_scale is not None:
            grads = _grads(optimizer)
            if grads:
                torch._foreach_mul_(grads, 1.0 / self.grad_scale)

    def first_overflowed(self, norm: float) -> bool:
        return bool(self.found_inf.item()) or not math.isfinite(norm)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        init_scale = self.grad_scale if self.grad_scale is not None else 2.0 ** 16  # GradScaler's default
        return self.second_pass.get(loss.device.type, init_scale).scale(loss)

    def unscale_second(self, base_optimizer: torch.optim.Optimizer) -> bool:
        grads = _grads(base_optimizer)
        scaler = self.second_pass.scaler
        if not grads or scaler is None:
            return True
        scaler.unscale_(base_optimizer)
        if math.isfinite(float(total_norm(grads))):
            return True
        scaler.update()  # the inf unscale_ found: the scale backs off, and this update is skipped
        return False

    def step_scaler(self) -> Optional[Any]:
        return self.second_pass.scaler  # None when the second pass was not scaled (nothing to skip)

    def after_step(self) -> None:
        if self.second_pass.scaler is not None:
            self.second_pass.scaler.update()


def scaling_for(optimizer: torch.optim.Optimizer, grad_scaler: Optional[Any],
                second_pass: SecondPassScaler) -> Optional[LossScaling]:
    """``step()``'s loss scaling: the scaler passed in, else the attributes ``GradScaler.step`` set, else none."""
    if grad_scaler is not None:
        return GradScalerArgument(grad_scaler)
    found_inf = getattr(optimizer, 'found_inf', None)
    if found_inf is not None:
        return GradScalerAttributes(getattr(optimizer, 'grad_scale', None), found_inf, second_pass)
    return None


def explicit_scaling(grad_scaler: Optional[Any]) -> Optional[LossScaling]:
    """``first_step``/``second_step``'s loss scaling (a bool here is a misplaced ``zero_grad``)."""
    if isinstance(grad_scaler, bool):
        raise TypeError(f'SAM got grad_scaler={grad_scaler!r}: pass zero_grad= by keyword, '
                        f'grad_scaler= takes a torch.amp.GradScaler or None')
    return GradScalerArgument(grad_scaler) if grad_scaler is not None else None
