"""An optimizer that is a view of another one: SAM shares ``param_groups``, ``state`` and ``defaults`` with the
optimizer it wraps (as timm's Lookahead), so timm's schedulers, layer decay and EMA see the base optimizer's."""
from collections import OrderedDict
from typing import Any, Dict, List

from torch.optim import Optimizer

__all__ = ['WrappedOptimizer', 'build_base_optimizer']

HOOK_DICTS = (
    '_optimizer_step_pre_hooks', '_optimizer_step_post_hooks',
    '_optimizer_state_dict_pre_hooks', '_optimizer_state_dict_post_hooks',
    '_optimizer_load_state_dict_pre_hooks', '_optimizer_load_state_dict_post_hooks',
)


def build_base_optimizer(params: Any, base_optimizer: Any, base_kwargs: Dict[str, Any]) -> Optimizer:
    """The optimizer SAM wraps: an instance given as is, or davda54/sam's ``(params, OptimizerClass, **kwargs)``."""
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
    if isinstance(base, WrappedOptimizer):
        raise ValueError('SAM cannot wrap another SAM optimizer')
    return base


class WrappedOptimizer(Optimizer):
    """An ``Optimizer`` whose groups, state and defaults are ``base_optimizer``'s.

    ``Optimizer.__init__`` is not called on purpose: what it would set up (hooks, the step wrapper for
    step hooks and the profiler label) is done by ``_init_torch_machinery``.
    """
    base_optimizer: Optimizer

    def _init_torch_machinery(self) -> None:
        for name in HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._patch_step_function()

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.base_optimizer.param_groups

    @property
    def state(self):
        return self.base_optimizer.state

    @property
    def defaults(self) -> Dict[str, Any]:
        return self.base_optimizer.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def _params(self):
        for group in self.param_groups:
            yield from group['params']
