"""The optimizer SAM wraps: an instance given as is, or davda54/sam's ``(params, OptimizerClass, **kwargs)``."""
from typing import Any, Dict, Optional

import torch.nn as nn
from torch.optim import Optimizer

__all__ = ['build_base_optimizer', 'check_model']


def build_base_optimizer(params: Any, base_optimizer: Any, base_kwargs: Dict[str, Any]) -> Optimizer:
    """``params`` if it is an optimizer instance, else ``base_optimizer(params, **base_kwargs)``; one line otherwise."""
    if isinstance(params, Optimizer) or (params is None and isinstance(base_optimizer, Optimizer)):
        instance = params if isinstance(params, Optimizer) else base_optimizer
        extra = base_optimizer if instance is params else None
        if extra is not None or base_kwargs:
            given = ', '.join(sorted(base_kwargs)) or f'base_optimizer={extra!r}'
            raise ValueError(f'SAM got an optimizer instance and also base-optimizer arguments ({given}); '
                             f'pass either an instance, or params plus an optimizer class and its arguments')
        base = instance
    elif isinstance(base_optimizer, type) and issubclass(base_optimizer, Optimizer) and params is not None:
        base = base_optimizer(params, **base_kwargs)
    else:
        raise ValueError(
            f'SAM needs an optimizer instance to wrap, or params and an optimizer class '
            f'(SAM(params, torch.optim.SGD, rho=0.05, lr=0.1)), got {type(params).__name__} and '
            f'base_optimizer={base_optimizer!r}; build one first (e.g. torch.optim.SGD(params, lr=0.1)) '
            f'or use timm.optim.create_optimizer_v2')
    if hasattr(base, 'base_optimizer') and hasattr(base, 'perturb'):
        raise ValueError('SAM cannot wrap another SAM optimizer')
    return base


def check_model(model: Optional[Any], family: str = 'SAM') -> None:
    """SAM's ``model`` is a module or None."""
    if model is not None and not isinstance(model, nn.Module):
        raise ValueError(f'{family} model must be an nn.Module or None, got {type(model).__name__}')
