"""The optimizer SAM wraps, and what makes SAM an optimizer around it (as timm's Lookahead is).

The base optimizer is an instance given as is, or davda54/sam's ``(params, OptimizerClass, **kwargs)``. SAM's
param groups, per-parameter state and defaults are the base optimizer's own objects, so a scheduler, timm's
layer decay or a checkpoint sees one optimizer; torch's hook tables and step wrapper are SAM's.
"""
import copy
import difflib
import inspect
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.optim import Optimizer

from timm_ext.optim.sharded import refuse_flat_parameters

__all__ = ['WrappedOptimizer', 'build_base_optimizer', 'check_keywords', 'check_model', 'check_steps_alone',
           'keyword_names', 'step_state_keys']

# torch.optim.Optimizer's hook tables (Optimizer.__init__ is not called: the groups are the base optimizer's)
_HOOK_TABLES = ('_optimizer_step_pre_hooks', '_optimizer_step_post_hooks', '_optimizer_state_dict_pre_hooks',
                '_optimizer_state_dict_post_hooks', '_optimizer_load_state_dict_pre_hooks',
                '_optimizer_load_state_dict_post_hooks')


def keyword_names(function: Callable[..., Any]) -> Optional[List[str]]:
    """The keywords ``function`` (an optimizer class) takes besides ``params``; None if it takes any (``**kwargs``)."""
    names = []
    for param in inspect.signature(function).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            return None
        if param.kind is not param.VAR_POSITIONAL and param.name != 'params':
            names.append(param.name)
    return names


def _closest(key: str, names: Sequence[str], cutoff: float = 0.6) -> Optional[str]:
    """The name most like ``key`` (difflib's ratio, at least ``cutoff``); on a tie the first (``rho``: ``rho_max``)."""
    scores = [(difflib.SequenceMatcher(None, key, name).ratio(), -index) for index, name in enumerate(names)]
    score, index = max(scores, default=(0.0, 0))
    return names[-index] if score >= cutoff else None


def check_keywords(given: Iterable[str], family: str, own: Sequence[str], base: str = '',
                   base_names: Sequence[str] = ()) -> None:
    """A one-line TypeError for the first ``given`` keyword that is neither ``family``'s (``own``) nor the base
    optimizer's (``base_names``; ``base``: its name), naming the closest one that is (``rhoo``: did you mean 'rho'?).
    Without ``base`` (an optimizer instance was given), only a near miss of ``own`` raises."""
    for key in given:
        if key in own or key in base_names:
            continue
        close = _closest(key, [*own, *base_names])
        if close:
            whose = f'a {family} setting' if close in own else f'an argument of {base}'
            raise TypeError(f'{family} got an unexpected keyword argument {key!r}: did you mean {close!r} ({whose})?')
        if base:
            raise TypeError(f'{family} got an unexpected keyword argument {key!r}: it is neither a {family} setting '
                            f'({", ".join(own)}) nor an argument of {base} ({", ".join(base_names)})')


def build_base_optimizer(params: Any, base_optimizer: Any, base_kwargs: Dict[str, Any], own: Sequence[str] = (),
                         family: str = 'SAM') -> Optimizer:
    """``params`` if it is an optimizer instance, else ``base_optimizer(params, **base_kwargs)``; one line otherwise.
    ``own``: the keywords of ``family`` (SAM's settings), named when a keyword of ``base_kwargs`` is a near miss."""
    if isinstance(params, Optimizer) or (params is None and isinstance(base_optimizer, Optimizer)):
        instance = params if isinstance(params, Optimizer) else base_optimizer
        check_keywords(base_kwargs, family, own)
        extra = base_optimizer if instance is params else None
        if extra is not None or base_kwargs:
            given = ', '.join(sorted(base_kwargs)) or f'base_optimizer={extra!r}'
            raise ValueError(f'SAM got an optimizer instance and also base-optimizer arguments ({given}); '
                             f'pass either an instance, or params plus an optimizer class and its arguments')
        check_steps_alone(type(instance), family)
        base = instance
    elif isinstance(base_optimizer, type) and issubclass(base_optimizer, Optimizer) and params is not None:
        names = keyword_names(base_optimizer)
        if names is not None:
            check_keywords(base_kwargs, family, own, base_optimizer.__name__, names)
        check_steps_alone(base_optimizer, family)
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


def check_steps_alone(optimizer_class: type, family: str = 'SAM') -> None:
    """SAM calls its base optimizer's ``step()`` once per update, on the gradient at hand: an optimizer whose step
    requires an argument (LBFGS's ``closure``: a line search that re-evaluates the loss many times per step) would
    fail at the first step with torch's TypeError. Read from the signature, so every such optimizer is refused,
    not only torch's LBFGS."""
    parameters = list(inspect.signature(optimizer_class.step).parameters.values())[1:]  # after self
    required = [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise ValueError(f'{family} cannot wrap {optimizer_class.__name__}: its step({", ".join(required)}) needs '
                         f'a closure that re-evaluates the loss many times per step, and {family}\'s base optimizer '
                         f'must take one step from the gradient at hand; wrap an optimizer whose closure is optional '
                         f'(torch.optim.SGD, AdamW, or any of timm\'s)')


# hyperparameters that pick a kernel or a device, not what a step keeps: the CPU defaults for the probe's step
_KERNEL_KEYS = {'foreach': None, 'fused': None, 'capturable': False, 'differentiable': False}
_PROBE_SIDE = 256  # a probe parameter's dims at most this long: an optimizer that factors large dims still does


def step_state_keys(optimizer_class: type, group: Dict[str, Any], like: torch.Tensor) -> Optional[Tuple[str, ...]]:
    """The per-parameter state keys ``optimizer_class`` keeps after one step on a parameter like ``like`` (its
    dtype, its dims up to ``_PROBE_SIDE``) in a param group with ``group``'s hyperparameters, in the order it writes
    them; None when the probe cannot run. A scratch optimizer on a scratch CPU tensor with a zero gradient: nothing
    of the caller's is touched."""
    probe = torch.zeros([min(side, _PROBE_SIDE) for side in like.shape], dtype=like.dtype, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    # copies: an optimizer may keep a step count in its group and add to it in place (timm's Lamb: group['step'])
    hyper = copy.deepcopy({k: v for k, v in group.items() if k not in ('params', 'param_names')})
    names = keyword_names(optimizer_class) or ()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            optimizer = optimizer_class([probe], **{k: hyper[k] for k in names if k in hyper and k not in _KERNEL_KEYS})
            probe_group = optimizer.param_groups[0]
            probe_group.update(hyper, **{k: v for k, v in _KERNEL_KEYS.items() if k in probe_group})
            optimizer.step()
    except Exception:  # an optimizer that needs more than a group (sparse gradients, a wrapped optimizer)
        return None
    return tuple(optimizer.state[probe])


def check_model(model: Optional[Any], family: str = 'SAM') -> None:
    """SAM's ``model`` is a module or None."""
    if model is not None and not isinstance(model, nn.Module):
        raise ValueError(f'{family} model must be an nn.Module or None, got {type(model).__name__}')


class WrappedOptimizer(Optimizer):
    """An optimizer whose groups, state and defaults are ``self.base_optimizer``'s; torch's hooks are its own.
    A copy or a pickle keeps the attributes named in ``_copied`` and rebuilds the rest (``_init_runtime``)."""
    base_optimizer: Optimizer
    _copied: Tuple[str, ...] = ('base_optimizer',)

    def _wrap(self, params: Any, base_optimizer: Any, base_kwargs: Dict[str, Any], own: Sequence[str] = (),
              family: str = 'SAM') -> None:
        self.base_optimizer = build_base_optimizer(params, base_optimizer, base_kwargs, own, family)
        refuse_flat_parameters([p for group in self.param_groups for p in group['params']])

    def _init_runtime(self) -> None:
        self._init_wrapper()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def __getstate__(self) -> Dict[str, Any]:
        return {k: self.__dict__[k] for k in self._copied}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def _init_wrapper(self) -> None:
        for name in _HOOK_TABLES:
            setattr(self, name, OrderedDict())
        self._patch_step_function()  # torch's step wrapper: step hooks and the profiler label

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.base_optimizer.param_groups

    @property
    def state(self) -> Dict[Any, Any]:
        return self.base_optimizer.state

    @property
    def defaults(self) -> Dict[str, Any]:
        return self.base_optimizer.defaults

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self.base_optimizer.add_param_group(param_group)
        self._add_group_defaults()

    def _add_group_defaults(self) -> None:
        """A subclass's own group keys, set on every group (also one added later)."""

    def _with_state_dict_hooks(self, build: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state_dict = build()
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            state_dict = post_hook(self, state_dict) or state_dict
        return state_dict

    def _with_load_state_dict_hooks(self, state_dict: Dict[str, Any], load: Callable[[Dict[str, Any]], None]) -> None:
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            state_dict = pre_hook(self, state_dict) or state_dict
        load(state_dict)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)
