""" MESA: Memory-Efficient Sharpness-Aware training, around any timm/torch optimizer

Paper: 'Sharpness-Aware Training for Free' (Du et al., NeurIPS 2022), https://arxiv.org/abs/2205.14083; official
code: github.com/AngusDujw/SAF (``MESA_train.py``, a fork of timm 0.5.0's train.py).

MESA replaces SAM's second forward-backward with a distillation from an exponential moving average (EMA) of the
model's own weights: the training loss gets

    kl_weight * T^2 * KL( softmax(z_ema / T) || softmax(z / T) )

where z are the model's logits on the batch and z_ema those of the EMA copy on the same inputs (no gradient; the
copy in eval mode, as timm's ModelEmaV2 that MESA_train.py uses), the KL summed over classes and averaged over the
batch. One extra forward without gradient per step: about 1.3 passes where SAM takes 2. SAF, the paper's other
method, keeps every sample's logits from past epochs instead: that needs sample indices from the loader (timm's
yields none) and a buffer of (dataset size x classes) logits, so it is not built here.

Two shapes:

* ``MESALoss`` in a loop of your own: ``loss = criterion(z, y) + mesa(x, z)``, backward, ``optimizer.step()``,
  ``mesa.update()``. Its EMA is timm's ``ModelEmaV3`` (fixed decay, no warm-up: ModelEmaV2's update).
* ``MESA`` (``mesa<base>`` in timm's factory; ``mesa_optimizer``) for timm's unmodified train.py: the optimizer
  adds the term to the loss timm's training task returns and updates the EMA after each step.

What is ours: ``start_step`` counts optimizer updates (MESA_train.py's ``--kl_start_epoch`` counts epochs: give
epochs x updates per epoch), and the EMA is the optimizer's own, not train.py's ``--model-ema`` one.
"""
import math
import numbers
from typing import Any, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.utils import ModelEmaV3, unwrap_model

__all__ = ['MESALoss', 'MESA_EMA_DECAY', 'MESA_KL_WEIGHT', 'MESA_SETTINGS', 'MESA_TEMPERATURE', 'check_mesa_entry',
           'check_mesa_settings', 'mesa_kl']

MESA_KL_WEIGHT = 0.8  # SAF's run.sh (ImageNet); MESA_train.py's own default is 0.3
MESA_TEMPERATURE = 5.0  # MESA_train.py
MESA_EMA_DECAY = 0.9998  # MESA_train.py's --model-ema-decay
MESA_SETTINGS = ('kl_weight', 'temperature', 'ema_decay', 'start_step')


def mesa_kl(logits: torch.Tensor, ema_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(softmax(ema_logits / T) || softmax(logits / T))``, summed over classes (the last dim), averaged
    over the batch; the EMA's side is a constant. T^2 keeps the gradient's scale independent of T."""
    log_p = F.log_softmax(logits / temperature, dim=-1)
    log_q = F.log_softmax(ema_logits.detach() / temperature, dim=-1)
    return F.kl_div(log_p, log_q, reduction='batchmean', log_target=True) * temperature ** 2


def check_mesa_settings(kl_weight: Any, temperature: Any, ema_decay: Any, start_step: Any) -> None:
    """A one-line ValueError naming the first bad setting."""
    def real(value: Any) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)

    if not (real(kl_weight) and kl_weight >= 0):
        raise ValueError(f'MESA kl_weight must be >= 0, got kl_weight={kl_weight!r}')
    if not (real(temperature) and temperature > 0):
        raise ValueError(f'MESA temperature must be > 0, got temperature={temperature!r}')
    if not (real(ema_decay) and 0 <= ema_decay < 1):
        raise ValueError(f'MESA ema_decay must be in [0, 1), got ema_decay={ema_decay!r}')
    if isinstance(start_step, bool) or not isinstance(start_step, numbers.Integral) or start_step < 0:
        raise ValueError(f'MESA start_step must be an integer >= 0, got start_step={start_step!r}')


def check_mesa_entry(entry: Any) -> Dict[str, Any]:
    """A loaded ``"mesa"`` state-dict entry, or a one-line ValueError."""
    updates = entry.get('updates') if isinstance(entry, dict) else None
    if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0 or not (
            entry.get('ema') is None or isinstance(entry['ema'], dict)):
        raise ValueError(f'MESA state dict entry "mesa" must be a dict with updates (an integer >= 0) and ema '
                         f'(a state dict or None), got {entry!r}')
    return entry


class MESALoss:
    """MESA's term for a loop of your own, with the EMA copy of ``model`` it distils from.

    ``loss = criterion(logits, target) + mesa(inputs, logits)``; after ``optimizer.step()``, ``mesa.update()``.

    Args:
        model: the module being trained (DDP and ``torch.compile`` wrappers are looked through).
        kl_weight: the term's weight (lambda), >= 0.
        temperature: the softmax temperature T, > 0.
        ema_decay: the EMA's decay, in [0, 1).
        start_step: no term before this many ``update()`` calls (the EMA is updated from the first).
    """

    def __init__(
            self,
            model: nn.Module,
            kl_weight: float = MESA_KL_WEIGHT,
            temperature: float = MESA_TEMPERATURE,
            ema_decay: float = MESA_EMA_DECAY,
            start_step: int = 0,
    ) -> None:
        check_mesa_settings(kl_weight, temperature, ema_decay, start_step)
        if not isinstance(model, nn.Module):
            raise ValueError(f'MESA model must be an nn.Module, got {type(model).__name__}')
        self.kl_weight, self.temperature, self.ema_decay, self.start_step = kl_weight, temperature, ema_decay, \
            start_step
        self.model = model
        self.ema = ModelEmaV3(unwrap_model(model), decay=ema_decay)  # a deep copy, in eval mode
        self.updates = 0

    @property
    def active(self) -> bool:
        """Whether the next loss gets the term (weight above 0, ``start_step`` updates done)."""
        return self.kl_weight > 0 and self.updates >= self.start_step

    def __call__(self, inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        """The term for ``logits`` (the model's, on ``inputs``); a zero before ``start_step`` (no EMA forward)."""
        if not self.active:
            return logits.new_zeros(())
        with torch.no_grad():
            ema_logits = self.ema.module(inputs)
        return self.kl_weight * mesa_kl(logits, ema_logits, self.temperature)

    def update(self) -> None:
        """After each optimizer step: the EMA moves towards the model's weights and buffers."""
        self.ema.update(unwrap_model(self.model))
        self.updates += 1

    def state_dict(self) -> Dict[str, Any]:
        """The update count and a copy of the EMA's weights and buffers."""
        ema = {k: v.detach().clone() for k, v in self.ema.module.state_dict().items()}
        return {'updates': self.updates, 'ema': ema}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        state = check_mesa_entry(state)
        self.updates = state['updates']
        if state['ema'] is not None:
            self.ema.module.load_state_dict(state['ema'])

    def __repr__(self) -> str:
        return (f'MESALoss(kl_weight={self.kl_weight!r}, temperature={self.temperature!r}, '
                f'ema_decay={self.ema_decay!r}, start_step={self.start_step!r}, updates={self.updates})')
