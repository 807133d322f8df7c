"""Which parameters SAM clips: all with a gradient, and for AGC all but the classifier head (as train.py)."""
from typing import Callable, List, Optional

import torch
import torch.nn as nn
from timm.models import model_parameters

__all__ = ['clip_parameters']


def clip_parameters(
        params: List[torch.Tensor],
        clip_mode: str,
        task: Optional[nn.Module],
        module: Callable[[], Optional[nn.Module]],
) -> List[torch.Tensor]:
    """``params`` without the classifier head's for ``clip_mode='agc'``: the head is the task's
    (``get_clip_parameters``) when SAM runs in train.py, else ``module()``'s (nothing left out without one)."""
    if clip_mode != 'agc':
        return params
    if task is not None and hasattr(task, 'get_clip_parameters'):
        keep = task.get_clip_parameters(exclude_head=True)
    else:
        owner = module()
        if owner is None:
            return params
        keep = model_parameters(owner, exclude_head=True)
    keep_ids = {id(p) for p in keep}
    return [p for p in params if id(p) in keep_ids]
