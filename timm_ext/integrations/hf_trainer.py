"""SAM in the Hugging Face Trainer (``transformers``), exact with gradient accumulation.

The Trainer runs ``training_step`` (forward and backward) on each micro-batch of an accumulation window, then
clips (``max_grad_norm``) and calls ``optimizer.step()`` itself, without a closure. ``SAMTrainer`` keeps the
window's micro-batches (their inputs and random state); after the window's last backward it calls
``sam.first_step()`` (w -> w + e with the window's summed gradient) and replays every micro-batch through the
Trainer's own ``training_step`` (``compute_loss``, the 1/k of accumulation, ``accelerator.backward``; all but
the last inside ``accelerator.no_sync``, each with the dropout / drop-path masks of its first pass). The
Trainer's own ``optimizer.step()`` then finishes the update (SAM's ``step()`` after ``first_step()`` is
``second_step()``: back to w, the base optimizer's step with the gradient at w + e). Its ``max_grad_norm`` clips
that second-pass gradient, between the replay and the step, which is exactly SAM's ``clip_grad`` (mode
``'norm'``); its logged ``grad_norm`` is that gradient's norm before clipping.

``TimmClassifier`` wraps a timm model (images in, logits out) as the Trainer expects a model:
``forward(pixel_values, labels=None)`` returning ``{'loss', 'logits'}``.
"""
from contextlib import nullcontext
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from transformers import Trainer

from timm_ext.optim import SAM
from timm_ext.optim.rng import RngState, cuda_devices_of
from timm_ext.optim.task_replay import sams_in

__all__ = ['SAMTrainer', 'TimmClassifier', 'sam_trainer_problem']

_NOT_SAM = ('SAMTrainer needs a timm-ext SAM optimizer, got {name}: pass it as '
            'optimizers=(create_optimizer_v2(model, \'samadamw\', ...), None)')


class TimmClassifier(nn.Module):
    """A timm classifier as the Trainer expects a model: ``forward(pixel_values, labels=None)`` returns
    ``{'loss': loss_fn(logits, labels), 'logits': logits}`` (no ``loss`` without labels).

    The dataset yields ``{'pixel_values': image tensor, 'labels': class index}``; the Trainer's column removal,
    label detection, evaluation and prediction then work as for a transformers model. Build the optimizer from
    the timm model itself (``create_optimizer_v2(model, ...)``: its no-weight-decay list, and SAM's model for
    BatchNorm buffers and AGC's head), and save ``wrapper.model`` to get timm's own state-dict keys.
    """

    def __init__(self, model: nn.Module, loss_fn: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()

    def forward(self, pixel_values: torch.Tensor, labels: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
        logits = self.model(pixel_values)
        if labels is None:
            return {'logits': logits}
        return {'loss': self.loss_fn(logits, labels), 'logits': logits}


def sam_trainer_problem(args: Any, optimizer: Any) -> Optional[str]:
    """The one line for a Trainer setting SAMTrainer cannot make exact (None when there is none)."""
    sam = _find_sam(optimizer)
    if sam is None:
        return _NOT_SAM.format(name=type(_innermost(optimizer)).__name__)
    if getattr(args, 'fp16', False):
        return ('SAMTrainer does not support fp16: Accelerate\'s GradScaler is built for one backward per step '
                'and SAM makes two; train in bf16 (bf16=True) or fp32')
    if getattr(args, 'deepspeed', None):
        return ('SAMTrainer does not support DeepSpeed: its engine runs the optimizer step, so SAM\'s second '
                'pass cannot be placed before it')
    if sam.settings.m_sharpness:
        return (f'SAMTrainer does not support m_sharpness={sam.settings.m_sharpness}: SAM runs both passes of '
                f'each chunk itself, which it can only do through step(closure) or timm\'s train.py')
    if sam.settings.clip_grad is not None and args.max_grad_norm and args.max_grad_norm > 0:
        return (f'SAMTrainer: both max_grad_norm={args.max_grad_norm} (TrainingArguments, default 1.0) and SAM\'s '
                f'clip_grad={sam.settings.clip_grad} would clip the second-pass gradient: set max_grad_norm=0 to '
                f'let SAM clip (needed for clip_mode \'value\' or \'agc\'), or build SAM with clip_grad=None')
    return None


def _innermost(optimizer: Any) -> Any:
    """The optimizer inside Accelerate's ``AcceleratedOptimizer`` (for the message)."""
    while getattr(optimizer, 'optimizer', None) is not None:
        optimizer = optimizer.optimizer
    return optimizer


def _find_sam(optimizer: Any) -> Optional[SAM]:
    """The SAM inside Accelerate's ``AcceleratedOptimizer`` (``.optimizer``) or timm's Lookahead
    (``._base_optimizer``)."""
    sams = sams_in(optimizer)
    return sams[0] if sams else None


class SAMTrainer(Trainer):
    """``transformers.Trainer`` driving a timm-ext SAM (any of its family: GSAM, LookSAM, ASAM, ``interval``).

    Use it as the Trainer, with the SAM passed in: ``SAMTrainer(model, args, train_dataset=...,
    optimizers=(sam, None))`` (``None``: the Trainer builds its scheduler from ``args`` over SAM's groups).
    With ``gradient_accumulation_steps=k`` one SAM update is taken on the whole window: the perturbation from
    the window's gradient, the applied gradient the window's gradient at w + e (the mean loss over the k
    micro-batches, as the Trainer scales it). Each SAM update costs a second forward-backward over the window;
    the loss the Trainer logs is the first pass's (at w).

    Refused in one line (``ValueError``, at construction, or at the first step when the optimizer is built
    later): an optimizer that is not a SAM, fp16, DeepSpeed, ``m_sharpness``, and SAM's ``clip_grad`` together
    with ``max_grad_norm > 0`` (both would clip the same gradient).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sam_window: List[Tuple[Dict[str, Any], Any, RngState]] = []
        self._sam_window_step = -1  # the update the kept micro-batches belong to
        self._sam_checked = False
        if self.optimizer is not None:
            self._sam()

    def _sam(self) -> SAM:
        if not self._sam_checked:
            problem = sam_trainer_problem(self.args, self.optimizer)
            if problem:
                raise ValueError(problem)
            self._sam_checked = True
        return _find_sam(self.optimizer)

    def training_step(self, model: nn.Module, inputs: Dict[str, Any],
                      num_items_in_batch: Optional[Any] = None) -> torch.Tensor:
        sam = self._sam()
        if self._sam_window_step != self.state.global_step:  # a new window (a stale one if a step raised)
            self._sam_window, self._sam_window_step = [], self.state.global_step
        kept = dict(inputs)
        rng = RngState.capture(cuda_devices_of(p for g in sam.param_groups for p in g['params']))
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._sam_window.append((kept, num_items_in_batch, rng))
        if self.accelerator.sync_gradients:  # the window's last micro-batch: the Trainer clips and steps next
            window, self._sam_window = self._sam_window, []
            if sam.sam_step_due:  # else (interval, LookSAM) the Trainer's step() is a plain base step
                self._second_pass(sam, model, window)
        return loss

    def _second_pass(self, sam: SAM, model: nn.Module, window: List[Tuple[Dict[str, Any], Any, RngState]]) -> None:
        """w -> w + e, then the window's forward-backward again there, scaled and synced as the Trainer does."""
        sam.first_step()
        try:
            for idx, (inputs, num_items_in_batch, rng) in enumerate(window):
                last = idx == len(window) - 1
                sync = nullcontext if last else partial(self.accelerator.no_sync, model=model)
                with sync(), rng.restored():
                    super().training_step(model, dict(inputs), num_items_in_batch)
        except BaseException:
            sam.cancel_step()  # weights and buffers back at w before the error leaves
            raise
