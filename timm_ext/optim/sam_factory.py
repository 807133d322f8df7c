"""SAM in timm's optimizer factory: ``create_optimizer_v2(model, opt='samadamw', rho=0.1)``.

timm's factory keeps only the text after the last underscore of ``opt`` (``lookahead_`` is its one
prefix), so ``sam_adamw`` would silently build plain AdamW. The names registered here therefore
have no underscore:

* ``sam<base>`` / ``asam<base>`` for the common bases (``samsgd``, ``sammomentum``, ``samadamw``,
  ``samlamb``, ... see ``SAM_BASES``); ``asam`` = ``adaptive=True``;
* ``sam`` / ``asam`` with ``base=<any timm optimizer name>`` in the optimizer kwargs
  (``opt_kwargs: {base: cadamw, rho: 0.1}`` in a recipe);
* ``gsam<base>`` / ``gsam`` (GSAM: ``rho_max``, ``rho_min``, ``alpha``, ``lr_max``, ``lr_min``) and
  ``looksam<base>`` / ``looksam`` (LookSAM: ``rho``, ``alpha``, ``interval``), same bases.

Every family takes ``interval`` (a SAM step every k-th update, plain steps between) and
``m_sharpness`` (images per perturbation).

The base optimizer gets the arguments timm would give it for its own name (its defaults, momentum
only if it has one, eps/betas only if it takes them); ``rho``, ``adaptive``, ``eta``,
``clip_grad`` and ``clip_mode`` go to SAM. timm's ``lookahead_`` prefix still applies
(``lookahead_samadamw``), as do layer decay and every parameter-group option of the factory.

Each ``create_*`` signature is its family's constructor's, with ``base`` (a timm name) for ``base_optimizer``.

The model: timm's factory hands an optimizer class only the parameter groups. SAM also needs the
module (its buffers keep their first-pass values; AGC leaves its head out), so ``create_sam`` takes
``model=`` and, when it is left out, uses the ``nn.Module`` that ``create_optimizer_v2`` itself was
called with (read from that call's frame, found by its code object: no guess, and nothing when SAM
is built another way, where SAM warns once if it ever needs a model it was not given). That frame read
(``model_given_to_factory``) is read-only, during that one call, and drops the frame reference at once.

Default radius: ``rho=0.05`` for ``sam*`` and ``rho=0.5`` for ``asam*``, the values the ASAM
authors give for CIFAR-10 (README of github.com/SamsungLabs/ASAM, "Train Examples (CIFAR)": ASAM
``--rho 0.5`` on CIFAR-10 and 1.0 on CIFAR-100; SAM 0.05 and 0.10). ASAM's radius is measured in
units of ``|w| + eta``, so SAM's value is no guide for it.
"""
import inspect
import sys
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type

import torch
import torch.nn as nn
from timm.optim import OptimInfo, OptimizerRegistry, get_optimizer_class, get_optimizer_info, list_optimizers

from timm_ext._timm_compat import (
    FACTORY_MODEL_ARG,
    default_optimizer_registry,
    optimizer_factory_code,
    registry_optimizers,
)
from timm_ext.optim.base_optimizer import check_model
from timm_ext.optim.gsam import GSAM
from timm_ext.optim.looksam import LookSAM
from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_settings import SAM_RHO

__all__ = ['ASAM_RHO', 'SAM_BASES', 'SAM_RHO', 'create_gsam', 'create_looksam', 'create_sam', 'list_sam_bases',
           'register_sam_optimizers', 'sam_kwargs_problems']

# bases that get a combined name (``sam<base>`` and ``asam<base>``); any other one works via ``base=``
SAM_BASES = (
    'sgd', 'momentum', 'nesterov', 'sgdw', 'adam', 'adamw', 'nadam', 'nadamw', 'radam',
    'lamb', 'lars', 'lion', 'adan', 'adopt',
)
ASAM_RHO = 0.5  # SamsungLabs/ASAM README, CIFAR-10 (see the module docstring)


def list_sam_bases() -> List[str]:
    """timm optimizer names SAM can wrap (second-order optimizers such as adahessian excluded)."""
    names = []
    for name in list_optimizers():
        info = get_optimizer_info(name)
        is_sam = isinstance(info.opt_class, partial) and info.opt_class.func in _BUILDERS
        if not info.second_order and not is_sam:
            names.append(name)
    return names


def _check_base(base: Any, kind: str) -> str:
    """``base`` as the timm name of a base ``kind`` can wrap, or a one-line ValueError."""
    if base is None:
        raise ValueError(
            f'{kind} needs a base optimizer: use a combined name such as opt="{kind.lower()}adamw" or pass '
            f'base=<name> (a recipe: opt_kwargs: {{base: adamw}}); valid bases: ' + ', '.join(list_sam_bases()))
    name = str(base).lower()
    valid = list_sam_bases()
    if name not in valid:
        raise ValueError(f'Unknown base optimizer {base!r} for {kind}; valid names: ' + ', '.join(valid))
    return name


def _base_by_name(params: Any, base: Optional[str], kind: str, base_kwargs: Dict[str, Any]) -> torch.optim.Optimizer:
    """Build ``base`` (a timm optimizer name) over ``params`` with the arguments timm's factory would give it."""
    info = get_optimizer_info(_check_base(base, kind))
    kwargs = dict(base_kwargs)
    for key, value in (info.defaults or {}).items():
        kwargs.setdefault(key, value)
    if info.has_momentum:
        kwargs.setdefault('momentum', 0.9)  # timm's factory default
    else:
        kwargs.pop('momentum', None)
    if not info.has_eps:
        kwargs.pop('eps', None)
    if not info.has_betas:
        kwargs.pop('betas', None)
    return get_optimizer_class(info, bind_defaults=False)(params, **kwargs)


def _builder(family: Type[SAM], name: str, doc: str, defaults: Optional[Dict[str, Any]] = None) -> Callable[..., SAM]:
    """``create_<family>(params, base=None, <the family's arguments>, **base_kwargs)``: ``base`` built as timm's
    factory would, wrapped in ``family``; the signature is the family's own, with ``base`` (a timm name) for
    ``base_optimizer`` (a class)."""
    kind = family.Settings.family
    params = []
    for param in list(inspect.signature(family.__init__).parameters.values())[1:]:
        if param.name == 'base_optimizer':
            param = param.replace(name='base', annotation=Optional[str])
        elif param.name in (defaults or {}):
            param = param.replace(default=defaults[param.name])
        params.append(param)
    signature = inspect.Signature(params)

    def create(*args: Any, **kwargs: Any) -> SAM:
        params, base, model, values, base_kwargs = _arguments(signature, args, kwargs)
        check_model(model, kind)
        base_optimizer = _base_by_name(params, base, kind, base_kwargs)
        if model is None:
            model = model_given_to_factory(base_optimizer)
        return family(base_optimizer, model=model, **values)

    create.__name__ = create.__qualname__ = name
    create.__doc__ = doc
    create.__signature__ = signature.replace(return_annotation=family)
    return create


def _arguments(signature: inspect.Signature, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[
        Any, Optional[str], Optional[nn.Module], Dict[str, Any], Dict[str, Any]]:
    """A ``create_*`` call's (params, base, model, the family's own arguments, the base optimizer's)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    params, base, model = values.pop('params'), values.pop('base'), values.pop('model')
    base_kwargs = values.pop('base_kwargs')
    if 'rho' in values and values['rho'] is None:  # sam / asam: the radius depends on adaptive
        values['rho'] = ASAM_RHO if values['adaptive'] else SAM_RHO
    return params, base, model, values, base_kwargs


create_sam = _builder(SAM, 'create_sam', (
    "Build ``base`` (a timm optimizer name) over ``params`` the way timm's factory would, wrapped in SAM.\n\n"
    "``rho`` defaults to 0.05 (SAM) or 0.5 (ASAM, ``adaptive=True``); ``model`` defaults to the module\n"
    "given to ``create_optimizer_v2``."), defaults={'rho': None})
create_gsam = _builder(GSAM, 'create_gsam', (
    "``base`` built as timm's factory would, wrapped in GSAM; ``lr_max`` defaults to the factory's ``lr``."))
create_looksam = _builder(LookSAM, 'create_looksam', (
    "``base`` built as timm's factory would, wrapped in LookSAM (a SAM step every ``interval`` steps)."))


# prefix -> (builder, fixed arguments, description)
_FAMILIES = {
    'sam': (create_sam, {}, 'SAM (sharpness-aware minimization)'),
    'asam': (create_sam, {'adaptive': True}, 'ASAM (adaptive SAM)'),
    'gsam': (create_gsam, {}, 'GSAM (surrogate-gap SAM)'),
    'looksam': (create_looksam, {}, 'LookSAM (SAM every k steps, its direction reused in between)'),
}
_FAMILY_OF: Dict[Callable[..., SAM], Type[SAM]] = {create_sam: SAM, create_gsam: GSAM, create_looksam: LookSAM}
_BUILDERS = tuple(_FAMILY_OF)


def register_sam_optimizers(registry: Optional[OptimizerRegistry] = None) -> None:
    """Register ``sam``, ``asam``, ``gsam``, ``looksam`` and each of them + ``<base>`` with timm's factory
    (``registry``: default, the one behind ``create_optimizer_v2``)."""
    if registry is None:
        registry = default_optimizer_registry()
    known = registry_optimizers(registry)
    for prefix, (builder, fixed, kind) in _FAMILIES.items():
        if prefix not in known:
            registry.register(OptimInfo(
                name=prefix,
                opt_class=partial(builder, **fixed),
                description=f'{kind} around the timm optimizer given as base=<name>',
                has_eps=True,
                has_momentum=True,
                has_betas=True,
            ))
        for base in SAM_BASES:
            name = prefix + base
            if name in known:
                continue
            info = registry.get_optimizer_info(base)
            registry.register(OptimInfo(
                name=name,
                opt_class=partial(builder, base=base, **fixed),
                description=f'{kind} around {base}: {info.description}',
                has_eps=info.has_eps,
                has_momentum=info.has_momentum,
                has_betas=info.has_betas,
                num_betas=info.num_betas,
                defaults=info.defaults,
            ))


def sam_kwargs_problems(opt: str, opt_kwargs: Mapping[str, Any]) -> List[str]:
    """What ``create_optimizer_v2(model, opt, **opt_kwargs)`` would refuse among the SAM family's own arguments
    (``base`` and the family's settings), one line each in the words it would raise, found before anything is
    built: the same argument binding as ``create_*`` and the same checks (:meth:`SAMSettings.problems`). Empty
    for an ``opt`` that is not SAM's, or arguments that do not bind (the signature checks name those)."""
    name = str(opt).lower().split('_')[-1]  # timm's factory keeps the text after the last underscore
    try:
        opt_class = get_optimizer_info(name).opt_class
    except (ValueError, KeyError):
        return []
    family = _FAMILY_OF.get(opt_class.func) if isinstance(opt_class, partial) else None
    if family is None:
        return []
    signature = inspect.signature(opt_class.func)
    try:
        _, base, _, values, _ = _arguments(signature, (None,), {**opt_class.keywords, **opt_kwargs})
    except TypeError:
        return []
    problems = []
    try:
        _check_base(base, family.Settings.family)
    except ValueError as error:
        problems.append(str(error))
    names = family.Settings.init_names()
    return problems + family.Settings.problems(**{n: v for n, v in values.items() if n in names})


def model_given_to_factory(base_optimizer: torch.optim.Optimizer) -> Optional[nn.Module]:
    """The module ``create_optimizer_v2`` (timm's registry) was called with, if SAM is being built inside it
    and that module owns the optimizer's parameters (the factory's frame is found by its code object)."""
    factory_code = optimizer_factory_code()
    frame = sys._getframe(1)
    try:
        while frame is not None and frame.f_code is not factory_code:
            frame = frame.f_back
        model = frame.f_locals.get(FACTORY_MODEL_ARG) if frame is not None else None
    finally:
        del frame
    if not isinstance(model, nn.Module):
        return None
    ids = {id(p) for p in model.parameters()}
    params = [p for group in base_optimizer.param_groups for p in group['params']]
    return model if any(id(p) in ids for p in params) else None
