"""MESA as an optimizer for timm's unmodified train.py: ``opt: mesaadamw`` in a recipe (``mesa<base>``, ``mesa``).

A recipe reaches train.py only through ``opt``/``opt_kwargs``, and train.py builds its own loss, so MESA's term
(``mesa.MESALoss``) is added by the optimizer: it finds the ``timm.task.ClassificationTask`` that owns its parameters
at the task's first call (``task_finder``, as SAM's recorder does), adds the term to the loss each call returns (a
forward hook on that task), and updates the EMA after each base step. The EMA and the update count are in its state
dict. One extra forward without gradient per step (the EMA's): about 1.3 passes where SAM takes 2.
"""
import inspect
import weakref
from typing import Any, Dict, List, Mapping, Optional, Type

import torch
import torch.nn as nn
from timm.optim import OptimInfo, OptimizerRegistry, get_optimizer_class, get_optimizer_info

from timm_ext._timm_compat import default_optimizer_registry, registry_optimizers
from timm_ext.optim.base_optimizer import WrappedOptimizer, check_keywords
from timm_ext.optim.mesa import (
    MESA_EMA_DECAY,
    MESA_KL_WEIGHT,
    MESA_SETTINGS,
    MESA_TEMPERATURE,
    MESALoss,
    check_mesa_entry,
    check_mesa_settings,
)
from timm_ext.optim.sam_factory import (
    BASE_CLASS_NAMES,
    DEFAULT_BASE,
    SAM_BASES,
    base_by_name,
    base_parameters,
    check_base,
)
from timm_ext.optim.task_recorder import RecorderState, TaskRecorder

__all__ = ['FactoryMESA', 'MESA', 'MESA_CLASSES', 'mesa_kwargs_problems', 'register_mesa_optimizers']


class _TaskBinding(TaskRecorder):
    """The training task of one MESA optimizer: found and held as SAM's recorder finds and holds its own (the
    same states: unbound, waiting, bound, closed); bound, a forward hook adds the optimizer's term to every loss
    the task returns, instead of recording calls."""

    def bind(self, task: nn.Module) -> None:
        optimizer = self._optimizer_ref()
        if optimizer is None or self.state not in (RecorderState.UNBOUND, RecorderState.WAITING):
            return
        _check_task(task)
        if not self.claim(task, _bound):  # a newer MESA over these parameters owns the task
            return
        self_ref = weakref.ref(self)

        def _add_term(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
            binding = self_ref()
            mesa = binding._optimizer_ref() if binding is not None else None
            return mesa.loss_with_term(args, kwargs, output) if mesa is not None else None

        self._handle = task.register_forward_hook(_add_term, with_kwargs=True)
        weakref.finalize(self, self._handle.remove)
        self.state = RecorderState.BOUND
        _bound.add(self)
        optimizer.use_model(self.trainable_module_of(task))

    def _release_task(self) -> None:
        super()._release_task()
        _bound.discard(self)

    def __repr__(self) -> str:
        return f'_TaskBinding(state={self.state.value})'


_bound: 'weakref.WeakSet[_TaskBinding]' = weakref.WeakSet()


def _check_task(task: nn.Module) -> None:
    """MESA's term is a softmax KL over the logits a classification task returns as ``'output'``."""
    from timm.task import ClassificationTask  # timm >= 1.0.23; a task exists, so timm has the task API

    if not isinstance(task, ClassificationTask) or getattr(task, 'multi_label', False):
        raise ValueError(f'MESA adds a softmax KL over the logits of timm\'s single-label ClassificationTask, got '
                         f'{type(task).__name__}: train with ClassificationTask, or use MESALoss in a loop of your own')


class MESA(WrappedOptimizer):
    """ MESA around any torch/timm optimizer, for timm's training task (train.py, or ``task(x, y)['loss']``).

    Args:
        params: the optimizer to wrap (an instance), or the parameters for ``base_optimizer``.
        base_optimizer: the optimizer class, built as ``base_optimizer(params, **base_kwargs)``.
        kl_weight, temperature, ema_decay, start_step: as for :class:`MESALoss` (``start_step`` in updates).
        **base_kwargs: the base optimizer's arguments (``lr``, ...).

    Built, it waits for the first ``timm.task.ClassificationTask`` call whose trainable module holds its
    parameters (``TrainingTask.__call__`` is wrapped until then, as for SAM) and copies that module into its EMA;
    ``step()`` refuses in one line if no such task has run (there would be no term).
    """
    _copied = ('base_optimizer', *MESA_SETTINGS, '_pending')

    def __init__(
            self,
            params: Any,
            base_optimizer: Optional[type] = None,
            kl_weight: float = MESA_KL_WEIGHT,
            temperature: float = MESA_TEMPERATURE,
            ema_decay: float = MESA_EMA_DECAY,
            start_step: int = 0,
            **base_kwargs: Any,
    ) -> None:
        check_mesa_settings(kl_weight, temperature, ema_decay, start_step)
        self.kl_weight, self.temperature, self.ema_decay, self.start_step = kl_weight, temperature, ema_decay, \
            start_step
        self._wrap(params, base_optimizer, base_kwargs, MESA_SETTINGS, 'MESA')
        if isinstance(self.base_optimizer, WrappedOptimizer):  # its step needs driving of its own (a task, a pass)
            raise ValueError(f'MESA cannot wrap {type(self.base_optimizer).__name__}, an optimizer that wraps '
                             f'another: wrap its base optimizer')
        self._pending: Optional[Dict[str, Any]] = None  # a loaded entry, until the task gives the model
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._init_wrapper()
        self.term: Optional[MESALoss] = None  # made when the task is found
        self.binding = _TaskBinding(self)
        self.binding.start()

    def use_model(self, model: nn.Module) -> None:
        """The module the EMA copies (the bound task's trainable one); a loaded state waiting for it is applied."""
        if self.term is not None:  # the same parameters under a new task: the EMA goes on
            self.term.model = model
            return
        self.term = MESALoss(model, **{name: getattr(self, name) for name in MESA_SETTINGS})
        if self._pending is not None:
            self.term.load_state_dict(self._pending)
            self._pending = None

    def loss_with_term(self, args: Any, kwargs: Any, output: Any) -> Optional[Dict[str, Any]]:
        """The task's output with the term added to its ``'loss'`` (None: left as it is)."""
        term = self.term
        if term is None or not term.active or not torch.is_grad_enabled():
            return None
        logits = output.get('output') if isinstance(output, dict) else None
        if not isinstance(logits, torch.Tensor) or 'loss' not in output:
            raise ValueError(f'MESA needs the training task to return a dict with "loss" and the logits as '
                             f'"output", got {type(output).__name__}')
        inputs = args[0] if args else kwargs.get('input')
        return dict(output, loss=output['loss'] + term(inputs, logits))

    @torch.no_grad()
    def step(self, closure: Optional[Any] = None) -> Optional[Any]:
        """The base optimizer's step, then the EMA's update. ``closure``: run first (it calls the task)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not any(p.grad is not None for group in self.param_groups for p in group['params']):
            return loss  # nothing to step, as for any torch optimizer (no term is missing)
        if self.term is None:
            raise RuntimeError('MESA.step(): no timm ClassificationTask holding this optimizer\'s parameters has run, '
                               'so there is no model to average and no loss to add the term to: compute the loss '
                               'with the task (task(input, target)["loss"], as train.py does), or use MESALoss in a '
                               'loop of your own')
        self.base_optimizer.step()
        self.term.update()
        return loss

    def _entry(self) -> Dict[str, Any]:
        if self.term is not None:
            return self.term.state_dict()
        return dict(self._pending) if self._pending is not None else {'updates': 0, 'ema': None}

    def state_dict(self) -> Dict[str, Any]:
        """The base optimizer's, plus ``"mesa"``: the update count and the EMA's weights and buffers."""
        return self._with_state_dict_hooks(lambda: dict(self.base_optimizer.state_dict(), mesa=self._entry()))

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """A MESA state dict (the EMA applied now, or when the task is found), or the base optimizer's."""
        def load(state_dict: Dict[str, Any]) -> None:
            state_dict = dict(state_dict)
            entry = state_dict.pop('mesa', None)
            entry = check_mesa_entry(entry) if entry is not None else None
            self.base_optimizer.load_state_dict(state_dict)
            if entry is None:
                return
            if self.term is not None:
                self.term.load_state_dict(entry)
            else:
                self._pending = entry
        self._with_load_state_dict_hooks(state_dict, load)

    def __getstate__(self) -> Dict[str, Any]:  # a copy waits for its own task; the EMA goes with it as a pending state
        return dict(super().__getstate__(), _pending=self._entry())

    def __repr__(self) -> str:
        values = ', '.join(f'{name}={getattr(self, name)!r}' for name in MESA_SETTINGS)
        return f'MESA({self.base_optimizer!r}, {values})'


class FactoryMESA(MESA):
    """MESA around ``base`` (a timm optimizer name) built as timm's factory would: what
    ``create_optimizer_v2(model, 'mesa<base>' | 'mesa')`` builds (the same class for every name)."""

    def __init__(
            self,
            params: Any,
            base: str = DEFAULT_BASE,
            kl_weight: float = MESA_KL_WEIGHT,
            temperature: float = MESA_TEMPERATURE,
            ema_decay: float = MESA_EMA_DECAY,
            start_step: int = 0,
            **base_kwargs: Any,
    ) -> None:
        check_mesa_settings(kl_weight, temperature, ema_decay, start_step)  # before the base is built
        base_kwargs = {k: v for k, v in base_kwargs.items() if not (v is None and k in ('eps', 'betas', 'momentum'))}
        base_optimizer = base_by_name(params, base, 'MESA', base_kwargs, MESA_SETTINGS)
        super().__init__(base_optimizer, kl_weight=kl_weight, temperature=temperature, ema_decay=ema_decay,
                         start_step=start_step)


def _named_class(base: Optional[str]) -> Type[FactoryMESA]:
    """The class of ``mesa<base>`` (``mesa``: base None): FactoryMESA with a signature that shows, after MESA's own
    arguments, the keywords of ``base``'s optimizer (for ``mesa``, the three timm's factory hands any optimizer), so
    timm sees what it takes, as for SAM's names (``sam_factory``)."""
    own = list(inspect.signature(FactoryMESA.__init__).parameters.values())[1:-1]
    if base is not None:
        own = [p.replace(default=base) if p.name == 'base' else p for p in own]
    base_params, any_keyword = base_parameters(base, {p.name for p in own})
    rest = [inspect.Parameter('base_kwargs', inspect.Parameter.VAR_KEYWORD)] if any_keyword else []
    signature = inspect.Signature(own + base_params + rest)

    own_names = [p.name for p in own if p.name != 'params']
    base_name = getattr(get_optimizer_class(base, bind_defaults=False), '__name__', base) if base else ''

    def __init__(self: FactoryMESA, *args: Any, **kwargs: Any) -> None:
        if not rest:  # a keyword neither MESA nor the base takes: one line naming the closest one
            check_keywords(kwargs, 'MESA', own_names, base_name, [p.name for p in base_params])
        bound = signature.bind(*args, **kwargs).arguments
        FactoryMESA.__init__(self, **{k: v for k, v in bound.items() if k != 'base_kwargs'},
                             **bound.get('base_kwargs', {}))

    self_param = inspect.Parameter('self', inspect.Parameter.POSITIONAL_OR_KEYWORD)
    __init__.__signature__ = signature.replace(parameters=[self_param, *signature.parameters.values()])
    name = 'MESA' + (BASE_CLASS_NAMES[base] if base is not None else 'Any')
    cls = type(name, (FactoryMESA,), {'__init__': __init__, '__module__': __name__, '__doc__': (
        f'MESA around timm\'s ``{base or "<base>"}``: what ``create_optimizer_v2(model, \'mesa{base or ""}\')`` '
        f'builds.')})
    cls.__qualname__ = name
    return cls


# the class behind each name (timm's tests read each one's signature); module attributes, so pickles find them
MESA_CLASSES = {base: _named_class(base) for base in (None, *SAM_BASES)}
globals().update({cls.__name__: cls for cls in MESA_CLASSES.values()})


def register_mesa_optimizers(registry: Optional[OptimizerRegistry] = None) -> None:
    """Register ``mesa`` (base from ``base=``, default adamw) and ``mesa<base>`` for each of ``SAM_BASES`` with
    timm's factory (``registry``: default, the one behind ``create_optimizer_v2``); names already there are kept."""
    if registry is None:
        registry = default_optimizer_registry()
    known = registry_optimizers(registry)
    if 'mesa' not in known:
        registry.register(OptimInfo(
            name='mesa', opt_class=MESA_CLASSES[None],
            description=f'MESA (sharpness-aware training for free: KL to an EMA of the model) around the timm '
                        f'optimizer given as base=<name> (default: {DEFAULT_BASE})',
            has_eps=True, has_momentum=True, has_betas=True,  # the base's own flags decide
            defaults={'base': DEFAULT_BASE}))
    for base in SAM_BASES:
        if 'mesa' + base in known:
            continue
        info = registry.get_optimizer_info(base)
        registry.register(OptimInfo(
            name='mesa' + base, opt_class=MESA_CLASSES[base], description=f'MESA around {base}: {info.description}',
            has_eps=info.has_eps, has_momentum=info.has_momentum, has_betas=info.has_betas,
            num_betas=info.num_betas, defaults={**(info.defaults or {}), 'base': base}))


def mesa_kwargs_problems(opt: str, opt_kwargs: Mapping[str, Any]) -> List[str]:
    """What ``create_optimizer_v2(model, opt, **opt_kwargs)`` would refuse among MESA's settings and ``base``, in the
    words it would raise (the first bad setting, then a bad base), found before anything is built; empty for an
    ``opt`` that is not MESA's (a recipe check: train.py would stop there after building the model and the data)."""
    try:
        info = get_optimizer_info(str(opt).lower().split('_')[-1])  # timm keeps the text after the last underscore
    except (ValueError, KeyError):
        return []
    if not (isinstance(info.opt_class, type) and issubclass(info.opt_class, FactoryMESA)):
        return []
    given = {**(info.defaults or {}), **opt_kwargs}
    defaults = inspect.signature(FactoryMESA.__init__).parameters
    problems = []
    for check in (lambda: check_mesa_settings(*(given.get(name, defaults[name].default) for name in MESA_SETTINGS)),
                  lambda: check_base(given.get('base', DEFAULT_BASE), 'MESA')):
        try:
            check()
        except ValueError as error:
            problems.append(str(error))
    return problems
