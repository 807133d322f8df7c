"""Which closure convention a ``SAM.step(closure)`` follows, told from the gradients at hand.

Two conventions meet in ``step(closure)``:

* **torch's** (LBFGS; timm's and Lightning's closures): the closure zeroes the gradients, computes and
  back-propagates the loss, and returns it; SAM calls it at w and at w + e. Between steps the gradients are the
  ones the last step left, or none.
* **davda54/sam's** (and pytorch-optimizer's): the caller has already run the backward at w; SAM perturbs with
  that gradient and calls the closure once, at w + e. Between steps the caller zeroes the gradients.

``LeftGradients`` remembers the gradient tensors the optimizer last left in ``p.grad`` (held weakly, with their
version counters): after each closure step, after ``zero_grad(set_to_none=False)`` (zeros in place; set to None,
the tensors are gone and a later backward makes new ones), and when the optimizer is made or copied. At the next
step the gradients at hand are either those, untouched (torch's convention: the closure evaluates both passes),
or new, made by a backward since (davda54's: the first pass is done). Gradients added onto the ones a step left,
without zeroing, are stale sums and are refused in one line, as are gradients half new and half left behind.
"""
import weakref
from typing import Dict, List, Sequence, Set, Tuple

import torch

__all__ = ['ADDED_TO_LEFT', 'CONVENTIONS', 'LeftGradients', 'MIXED']

CONVENTIONS = (
    'either run the backward at w yourself, call step(closure) with a closure that back-propagates at w + e, then '
    'optimizer.zero_grad() (davda54/sam\'s and pytorch-optimizer\'s convention), or let the closure zero the '
    'gradients, compute and back-propagate the loss, called by SAM at w and at w + e (torch\'s convention)')
ADDED_TO_LEFT = (
    'SAM.step(closure): {who} added to the gradients the last step left, without zeroing them, so they are '
    'stale sums: ' + CONVENTIONS)
MIXED = (
    'SAM.step(closure): of the parameters with a gradient, {new} got it from a backward since the last step and '
    '{left} still hold the one the last step left, so neither convention fits: ' + CONVENTIONS)


class LeftGradients:
    """The gradient tensors the optimizer last left in ``p.grad``, each held weakly with its version counter, and
    whether they are zeros (``zero_grad(set_to_none=False)``) or a step's gradients."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self._left: Dict[torch.Tensor, Tuple[weakref.ref, int]] = {}
        self._zeros = False
        self.record(params)  # whatever is there when the optimizer is made (or copied) is no new backward

    def record(self, params: Sequence[torch.Tensor], zeros: bool = False) -> None:
        """What ``params`` hold now: a step's gradients, or (``zeros``) what ``zero_grad(set_to_none=False)`` left."""
        self._left = {p: (weakref.ref(p.grad), p.grad._version) for p in params if p.grad is not None}
        self._zeros = zeros


    def _kinds(self, params: Sequence[torch.Tensor]) -> Tuple[Set[str], int, int]:
        """'new' (a backward made or filled it since), 'left' (a step's gradient, untouched), 'added' (a step's
        gradient a backward added to), 'zero' (zeroed in place, untouched); with how many are new and left."""
        kinds: List[str] = []
        for p in params:
            grad = p.grad
            if grad is None:
                continue
            ref, version = self._left.get(p, (None, None))
            if ref is None or ref() is not grad:
                kinds.append('new')
            elif grad._version == version:
                kinds.append('zero' if self._zeros else 'left')
            else:
                kinds.append('new' if self._zeros else 'added')
        return set(kinds), kinds.count('new'), kinds.count('left')

    def first_pass_done(self, params: Sequence[torch.Tensor]) -> bool:
        """True when the gradients at hand come from a backward the caller ran since the last step (davda54/sam's
        convention); False when there are none, only zeros, or only the ones the last step left (torch's). A
        one-line ``ValueError`` for stale sums or a mix."""
        kinds, new, left = self._kinds(params)
        if 'added' in kinds:
            raise ValueError(ADDED_TO_LEFT.format(who='a backward since'))
        if 'new' in kinds and 'left' in kinds:
            raise ValueError(MIXED.format(new=new, left=left))
        return 'new' in kinds

    def check_closure_zeroed(self, params: Sequence[torch.Tensor]) -> None:
        """After the closure's first call in torch's convention: it must not have added to the last step's gradients."""
        if 'added' in self._kinds(params)[0]:
            self.record(params)  # the sums are stale now: a closure that zeroes can take the next step
            raise ValueError(ADDED_TO_LEFT.format(who='the closure'))
