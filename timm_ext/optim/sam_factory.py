"""SAM in timm's optimizer factory: ``create_optimizer_v2(model, opt='samadamw', rho=0.1)``.

timm's factory keeps only the text after the last underscore of ``opt`` (``lookahead_`` is its one
prefix), so ``sam_adamw`` would silently build plain AdamW. The names registered here therefore
have no underscore:

* ``sam<base>`` / ``asam<base>`` for the common bases (``samsgd``, ``sammomentum``, ``samadamw``,
  ``samlamb``, ... see ``SAM_BASES``); ``asam`` = ``adaptive=True``;
* ``sam`` / ``asam`` with ``base=<any timm optimizer name>`` in the optimizer kwargs
  (``opt_kwargs: {base: cadamw, rho: 0.1}`` in a recipe), ``adamw`` when none is given (``DEFAULT_BASE``);
* ``gsam<base>`` / ``gsam`` (GSAM: ``rho_max``, ``rho_min``, ``alpha``, ``lr_max``, ``lr_min``),
  ``looksam<base>`` / ``looksam`` (LookSAM: ``rho``, ``alpha``, ``interval``), ``wsam<base>`` / ``wsam`` (WSAM:
  ``rho``, ``gamma``, ``decouple``), ``friendlysam<base>`` / ``friendlysam`` (FriendlySAM: ``rho``, ``sigma``,
  ``lmbda``), ``samon<base>`` / ``samon`` (SAM-ON: ``rho``, ``only_norm``), ``esam<base>`` / ``esam`` (ESAM: ``rho``,
  ``weight_fraction``, ``data_fraction``, ``seed``) and ``msam<base>`` / ``msam``
  (Momentum-SAM: ``rho``; one pass, so no ``interval`` or ``m_sharpness``), same bases.

Every two-pass family takes ``interval`` (a SAM step every k-th update, plain steps between) and
``m_sharpness`` (images per perturbation).

The base optimizer gets the arguments timm would give it for its own name (its defaults, momentum
only if it has one, eps/betas only if it takes them); ``rho``, ``adaptive``, ``eta``,
``clip_grad`` and ``clip_mode`` go to SAM. timm's ``lookahead_`` prefix still applies
(``lookahead_samadamw``), as do layer decay and every parameter-group option of the factory.

What timm registers is a class, as for its own optimizers: ``FactorySAM``, ``FactoryGSAM`` and ``FactoryLookSAM``
subclass their family, with the family's signature and ``base`` (a timm name) for ``base_optimizer``; each name's
base and fixed arguments are its ``OptimInfo.defaults`` (``get_optimizer_class('samadamw')`` binds them, as timm
does). Each combined name's class is written out below (``SAMAdamW`` for ``samadamw``, ``GSAMSGD`` for ``gsamsgd``).

The model: timm's factory hands an optimizer class only the parameter groups. SAM also needs the
module (its buffers keep their first-pass values; AGC leaves its head out), so ``FactorySAM`` takes
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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type

import torch
import torch.nn as nn
from timm.optim import OptimInfo, OptimizerRegistry, get_optimizer_class, get_optimizer_info, list_optimizers

from timm_ext._timm_compat import (
    FACTORY_MODEL_ARG,
    default_optimizer_registry,
    optimizer_factory_code,
    registry_optimizers,
)
from timm_ext.optim.base_optimizer import WrappedOptimizer, check_keywords, check_model, keyword_names
from timm_ext.optim.esam import ESAM
from timm_ext.optim.friendly_sam import FriendlySAM
from timm_ext.optim.gsam import GSAM
from timm_ext.optim.looksam import LookSAM
from timm_ext.optim.momentum_sam import MomentumSAM
from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_on import SAMON
from timm_ext.optim.sam_settings import ASAM_ETA, SAM_RHO
from timm_ext.optim.wsam import WSAM

__all__ = ['ASAM_CLASSES', 'ASAM_RHO', 'BASE_CLASS_NAMES', 'DEFAULT_BASE', 'ESAM_CLASSES', 'FRIENDLYSAM_CLASSES',
           'FactoryESAM', 'FactoryFriendlySAM', 'FactoryGSAM', 'FactoryLookSAM', 'FactoryMomentumSAM', 'FactorySAM',
           'FactorySAMON', 'FactoryWSAM', 'GSAM_CLASSES', 'LOOKSAM_CLASSES', 'MSAM_CLASSES', 'SAMON_CLASSES',
           'SAM_BASES', 'SAM_CLASSES', 'SAM_RHO', 'WSAM_CLASSES', 'base_by_name', 'base_parameters', 'check_base',
           'list_sam_bases', 'register_sam_optimizers', 'sam_kwargs_problems']

# bases that get a combined name (``sam<base>`` and ``asam<base>``); any other one works via ``base=``
SAM_BASES = (
    'sgd', 'momentum', 'nesterov', 'sgdw', 'adam', 'adamw', 'nadam', 'nadamw', 'radam',
    'lamb', 'lars', 'lion', 'adan', 'adopt',
)
ASAM_RHO = 0.5  # SamsungLabs/ASAM README, CIFAR-10 (see the module docstring)


def list_sam_bases() -> List[str]:
    """timm optimizer names SAM (and MESA) can wrap: no second-order optimizer (adahessian), none that wraps another."""
    names = []
    for name in list_optimizers():
        info = get_optimizer_info(name)
        wraps = isinstance(info.opt_class, type) and issubclass(info.opt_class, WrappedOptimizer)  # SAM's, MESA
        if not info.second_order and not wraps:
            names.append(name)
    return names


def check_base(base: Any, kind: str) -> str:
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


def base_by_name(params: Any, base: Optional[str], kind: str, base_kwargs: Dict[str, Any],
                  own: Sequence[str] = ()) -> torch.optim.Optimizer:
    """Build ``base`` (a timm optimizer name) over ``params`` with the arguments timm's factory would give it;
    ``own``: the family's keywords, named when a keyword is a near miss of one."""
    info = get_optimizer_info(check_base(base, kind))
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
    base_class = get_optimizer_class(info, bind_defaults=False)
    names = keyword_names(base_class)
    if names is not None:
        check_keywords(kwargs, kind, own, getattr(base_class, '__name__', info.name), names)
    return base_class(params, **kwargs)


# arguments timm's factory hands any optimizer that declares them (``OptimInfo.has_eps``, ...); a bare name's base is
# not known until it is built, so its class declares all three and passes on those its base takes
_COMMON_BASE_ARGS = ('eps', 'betas', 'momentum')
BASE_CLASS_NAMES = {'sgd': 'SGD', 'momentum': 'Momentum', 'nesterov': 'Nesterov', 'sgdw': 'SGDW', 'adam': 'Adam',
                     'adamw': 'AdamW', 'nadam': 'NAdam', 'nadamw': 'NAdamW', 'radam': 'RAdam', 'lamb': 'Lamb',
                     'lars': 'Lars', 'lion': 'Lion', 'adan': 'Adan', 'adopt': 'Adopt'}


def base_parameters(base: Optional[str], taken: set) -> Tuple[List[inspect.Parameter], bool]:
    """The keyword parameters of ``base``'s optimizer class (all three common ones for a bare name), and whether it
    takes any other keyword. A common one that this timm's registry says its factory does not hand ``base`` is left
    out, as ``_base_by_name`` would drop it: timm 1.0.23 ... 1.0.28 register ``adopt`` without betas, though
    ``Adopt`` takes them, so ``samadopt`` takes none there (a TypeError, not betas silently dropped)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    if base is None:
        return [inspect.Parameter(n, keyword, default=None) for n in _COMMON_BASE_ARGS], True
    info = get_optimizer_info(base)
    handed = {'eps': info.has_eps, 'betas': info.has_betas, 'momentum': info.has_momentum}
    params, any_keyword = [], False
    for param in inspect.signature(get_optimizer_class(info, bind_defaults=False)).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            any_keyword = True
        elif param.kind is not param.VAR_POSITIONAL and param.name not in ('params', *taken) and \
                handed.get(param.name, True):
            params.append(param.replace(kind=keyword))
    return params, any_keyword


def _factory_class(family: Type[SAM], name: str, doc: str, defaults: Optional[Dict[str, Any]] = None,
                   base: Optional[str] = None) -> Type[SAM]:
    """The ``family`` subclass timm's factory builds for one name: ``cls(params, base=<its base>, <the family's
    arguments>, *, <the base optimizer's arguments>)``, ``base`` (a timm name) built as timm's factory would for
    that name, wrapped in ``family``. The signature is the family's own with ``base`` for ``base_optimizer`` (a
    class), then the base optimizer's keywords, so timm sees what it takes (``eps``, ``betas``, ``momentum``)."""
    kind = family.Settings.family
    own = []
    for param in list(inspect.signature(family.__init__).parameters.values())[1:]:
        if param.kind is param.VAR_KEYWORD:
            continue
        if param.name == 'base_optimizer':
            param = param.replace(name='base', annotation=Optional[str], default=base)
        elif param.name in (defaults or {}):
            param = param.replace(default=defaults[param.name])
        elif param.name == 'eta' and param.default is None:  # SAM's None means 0.01 over an instance, as here
            param = param.replace(default=ASAM_ETA, annotation=float)
        own.append(param)
    family_names = frozenset(p.name for p in own)
    base_params, any_keyword = base_parameters(base, set(family_names))
    var_keyword = [inspect.Parameter('base_kwargs', inspect.Parameter.VAR_KEYWORD)] if any_keyword else []
    signature = inspect.Signature(own + base_params + var_keyword)

    def __init__(self: SAM, *args: Any, **kwargs: Any) -> None:
        params, base, model, values, base_kwargs = _arguments(type(self), args, kwargs)
        check_model(model, kind)
        base_optimizer = base_by_name(params, base, kind, base_kwargs, _own_keywords(type(self)))
        if model is None:
            model = model_given_to_factory(base_optimizer)
        family.__init__(self, base_optimizer, model=model, **values)

    self_param = inspect.Parameter('self', inspect.Parameter.POSITIONAL_OR_KEYWORD)
    __init__.__signature__ = signature.replace(parameters=[self_param, *signature.parameters.values()],
                                               return_annotation=None)
    __init__.__doc__ = doc
    cls = type(name, (family,), {'__init__': __init__, '__doc__': doc, '__module__': __name__, 'family': family,
                                 'signature': signature, 'family_names': family_names})
    cls.__qualname__ = name
    __init__.__qualname__ = f'{name}.__init__'
    return cls


def _arguments(cls: Type[SAM], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[
        Any, Optional[str], Optional[nn.Module], Dict[str, Any], Dict[str, Any]]:
    """A factory class's call as (params, base, model, the family's own arguments, the base optimizer's: only
    those given, so the base gets timm's defaults for its name)."""
    takes = cls.signature.parameters
    if 'base_kwargs' not in takes:  # a combined name: its base's keywords are known, a typo gets a suggestion
        base = getattr(get_optimizer_class(takes['base'].default, bind_defaults=False), '__name__', 'its base')
        check_keywords(kwargs, cls.family.Settings.family, _own_keywords(cls), base,
                       [n for n in takes if n not in cls.family_names])
    bound = cls.signature.bind(*args, **kwargs)
    given = dict(bound.arguments)
    base_kwargs = dict(given.pop('base_kwargs', {}))
    values = {p.name: given.pop(p.name, p.default) for p in cls.signature.parameters.values()
              if p.name in cls.family_names}
    base_kwargs.update({k: v for k, v in given.items() if not (v is None and k in _COMMON_BASE_ARGS)})
    params, base, model = values.pop('params'), values.pop('base'), values.pop('model')
    if 'rho' in values and values['rho'] is None:  # sam / asam: the radius depends on adaptive
        values['rho'] = ASAM_RHO if values['adaptive'] else SAM_RHO
    return params, base, model, values, base_kwargs


def _own_keywords(cls: Type[SAM]) -> List[str]:
    """The keywords of a factory class that are its family's (``base``, ``rho``, ...), in signature order."""
    return [name for name in cls.signature.parameters if name in cls.family_names and name != 'params']


_DOCS = {
    SAM: "SAM around ``base`` (a timm optimizer name) built over ``params`` the way timm's factory would: what\n"
         "``create_optimizer_v2(model, 'sam<base>' | 'asam<base>' | 'sam')`` builds. ``rho`` defaults to 0.05 (SAM)\n"
         "or 0.5 (ASAM, ``adaptive=True``); ``model`` to the module given to ``create_optimizer_v2``.",
    GSAM: "GSAM around ``base`` built as timm's factory would (``gsam<base>``, ``gsam``); ``lr_max`` defaults to the\n"
          "factory's ``lr``.",
    LookSAM: "LookSAM around ``base`` built as timm's factory would (``looksam<base>``, ``looksam``): a SAM step\n"
             "every ``interval`` steps.",
    WSAM: "WSAM around ``base`` built as timm's factory would (``wsam<base>``, ``wsam``): the sharpness weighted\n"
          "``gamma / (1 - gamma)`` as a regulariser.",
    FriendlySAM: "FriendlySAM around ``base`` built as timm's factory would (``friendlysam<base>``, ``friendlysam``):\n"
                 "the perturbation along the batch-specific part of the gradient.",
    ESAM: "ESAM around ``base`` built as timm's factory would (``esam<base>``, ``esam``): a random subset of the\n"
          "weights perturbed, the second pass on the samples whose loss rose most.",
    MomentumSAM: "Momentum-SAM around ``base`` built as timm's factory would (``msam<base>``, ``msam``): one\n"
                 "pass, the gradient taken at ``w - rho v / ||v||`` (v the base's momentum).",
    SAMON: "SAM-ON around ``base`` built as timm's factory would (``samon<base>``, ``samon``): only the normalization\n"
           "layers' parameters perturbed; ``model`` defaults to the module given to ``create_optimizer_v2``.",
}
FactorySAM = _factory_class(SAM, 'FactorySAM', _DOCS[SAM], defaults={'rho': None})
FactoryGSAM = _factory_class(GSAM, 'FactoryGSAM', _DOCS[GSAM])
FactoryLookSAM = _factory_class(LookSAM, 'FactoryLookSAM', _DOCS[LookSAM])
FactoryWSAM = _factory_class(WSAM, 'FactoryWSAM', _DOCS[WSAM])
FactoryFriendlySAM = _factory_class(FriendlySAM, 'FactoryFriendlySAM', _DOCS[FriendlySAM])
FactorySAMON = _factory_class(SAMON, 'FactorySAMON', _DOCS[SAMON])
FactoryESAM = _factory_class(ESAM, 'FactoryESAM', _DOCS[ESAM])
FactoryMomentumSAM = _factory_class(MomentumSAM, 'FactoryMomentumSAM', _DOCS[MomentumSAM])

DEFAULT_BASE = 'adamw'  # the base of the bare names: what the ViT-SAM paper trained its ViTs and MLP-Mixers with
# (Chen et al. 2022, Table 8: AdamW, betas (0.9, 0.999)); its ResNets' SGD is `samsgd`

# prefix -> (bare name's class, family, class-name prefix, fixed arguments, description)
_FAMILIES = {
    'sam': (FactorySAM, SAM, 'SAM', {}, 'SAM (sharpness-aware minimization)'),
    'asam': (FactorySAM, SAM, 'ASAM', {'adaptive': True}, 'ASAM (adaptive SAM)'),
    'gsam': (FactoryGSAM, GSAM, 'GSAM', {}, 'GSAM (surrogate-gap SAM)'),
    'looksam': (FactoryLookSAM, LookSAM, 'LookSAM', {}, 'LookSAM (SAM every k steps, its direction reused in between)'),
    'wsam': (FactoryWSAM, WSAM, 'WSAM', {}, 'WSAM (weighted sharpness as a regulariser)'),
    'friendlysam': (FactoryFriendlySAM, FriendlySAM, 'FriendlySAM', {},
                    'FriendlySAM (F-SAM: the perturbation along the batch-specific gradient)'),
    'samon': (FactorySAMON, SAMON, 'SAMON', {}, 'SAM-ON (only the normalization layers perturbed)'),
    'esam': (FactoryESAM, ESAM, 'ESAM', {}, 'ESAM (efficient SAM: a subset of weights and of samples)'),
    'msam': (FactoryMomentumSAM, MomentumSAM, 'MomentumSAM', {},
             'Momentum-SAM (one pass, the gradient taken along the momentum)'),
}


def _named_class(prefix: str, base: str) -> Type[SAM]:
    """The class of one combined name, ``prefix + base`` (``SAMAdamW`` for ``samadamw``): the family's signature
    with ``base`` and the prefix's fixed arguments as defaults, then the base optimizer's own arguments."""
    _, family, class_prefix, fixed, kind = _FAMILIES[prefix]
    defaults = {'rho': None, **fixed} if family is SAM else dict(fixed)
    doc = f'{kind} around timm\'s ``{base}``: what ``create_optimizer_v2(model, \'{prefix}{base}\')`` builds.'
    return _factory_class(family, class_prefix + BASE_CLASS_NAMES[base], doc, defaults, base=base)


# The class behind each combined name, one per base of SAM_BASES in its order (timm's factory builds these; timm's
# tests read each one's __init__ signature). Written out so that a search for a name finds where it is made.
SAM_CLASSES = (SAMSGD, SAMMomentum, SAMNesterov, SAMSGDW, SAMAdam, SAMAdamW, SAMNAdam, SAMNAdamW, SAMRAdam, SAMLamb,
               SAMLars, SAMLion, SAMAdan, SAMAdopt) = tuple(_named_class('sam', base) for base in SAM_BASES)
ASAM_CLASSES = (ASAMSGD, ASAMMomentum, ASAMNesterov, ASAMSGDW, ASAMAdam, ASAMAdamW, ASAMNAdam, ASAMNAdamW, ASAMRAdam,
                ASAMLamb, ASAMLars, ASAMLion, ASAMAdan, ASAMAdopt) = tuple(_named_class('asam', b) for b in SAM_BASES)
GSAM_CLASSES = (GSAMSGD, GSAMMomentum, GSAMNesterov, GSAMSGDW, GSAMAdam, GSAMAdamW, GSAMNAdam, GSAMNAdamW, GSAMRAdam,
                GSAMLamb, GSAMLars, GSAMLion, GSAMAdan, GSAMAdopt) = tuple(_named_class('gsam', b) for b in SAM_BASES)
LOOKSAM_CLASSES = (LookSAMSGD, LookSAMMomentum, LookSAMNesterov, LookSAMSGDW, LookSAMAdam, LookSAMAdamW, LookSAMNAdam,
                   LookSAMNAdamW, LookSAMRAdam, LookSAMLamb, LookSAMLars, LookSAMLion, LookSAMAdan, LookSAMAdopt) = \
    tuple(_named_class('looksam', base) for base in SAM_BASES)
WSAM_CLASSES = (WSAMSGD, WSAMMomentum, WSAMNesterov, WSAMSGDW, WSAMAdam, WSAMAdamW, WSAMNAdam, WSAMNAdamW, WSAMRAdam,
                WSAMLamb, WSAMLars, WSAMLion, WSAMAdan, WSAMAdopt) = tuple(_named_class('wsam', b) for b in SAM_BASES)
FRIENDLYSAM_CLASSES = (FriendlySAMSGD, FriendlySAMMomentum, FriendlySAMNesterov, FriendlySAMSGDW, FriendlySAMAdam,
                       FriendlySAMAdamW, FriendlySAMNAdam, FriendlySAMNAdamW, FriendlySAMRAdam, FriendlySAMLamb,
                       FriendlySAMLars, FriendlySAMLion, FriendlySAMAdan, FriendlySAMAdopt) = \
    tuple(_named_class('friendlysam', base) for base in SAM_BASES)
SAMON_CLASSES = (SAMONSGD, SAMONMomentum, SAMONNesterov, SAMONSGDW, SAMONAdam, SAMONAdamW, SAMONNAdam, SAMONNAdamW,
                 SAMONRAdam, SAMONLamb, SAMONLars, SAMONLion, SAMONAdan, SAMONAdopt) = \
    tuple(_named_class('samon', base) for base in SAM_BASES)
ESAM_CLASSES = (ESAMSGD, ESAMMomentum, ESAMNesterov, ESAMSGDW, ESAMAdam, ESAMAdamW, ESAMNAdam, ESAMNAdamW, ESAMRAdam,
                ESAMLamb, ESAMLars, ESAMLion, ESAMAdan, ESAMAdopt) = tuple(_named_class('esam', b) for b in SAM_BASES)
MSAM_CLASSES = (MomentumSAMSGD, MomentumSAMMomentum, MomentumSAMNesterov, MomentumSAMSGDW, MomentumSAMAdam,
                MomentumSAMAdamW, MomentumSAMNAdam, MomentumSAMNAdamW, MomentumSAMRAdam, MomentumSAMLamb,
                MomentumSAMLars, MomentumSAMLion, MomentumSAMAdan, MomentumSAMAdopt) = \
    tuple(_named_class('msam', base) for base in SAM_BASES)
_NAMED = {'sam': SAM_CLASSES, 'asam': ASAM_CLASSES, 'gsam': GSAM_CLASSES, 'looksam': LOOKSAM_CLASSES,
          'wsam': WSAM_CLASSES, 'friendlysam': FRIENDLYSAM_CLASSES, 'samon': SAMON_CLASSES,
          'esam': ESAM_CLASSES, 'msam': MSAM_CLASSES}


def register_sam_optimizers(registry: Optional[OptimizerRegistry] = None) -> None:
    """Register ``sam``, ``asam``, ``gsam``, ``looksam``, ``wsam``, ``friendlysam``, ``samon``, ``esam``, ``msam``
    and each of them + ``<base>`` with timm's factory (``registry``: default, the one behind
    ``create_optimizer_v2``)."""
    if registry is None:
        registry = default_optimizer_registry()
    known = registry_optimizers(registry)
    for prefix, (cls, _, _, fixed, kind) in _FAMILIES.items():
        if prefix not in known:
            registry.register(OptimInfo(
                name=prefix,
                opt_class=cls,
                description=f'{kind} around the timm optimizer given as base=<name> (default: {DEFAULT_BASE})',
                has_eps=True,  # the base's own flags decide (any base may be given)
                has_momentum=True,
                has_betas=True,
                defaults={'base': DEFAULT_BASE, **fixed},
            ))
        for base, named in zip(SAM_BASES, _NAMED[prefix]):
            name = prefix + base
            if name in known:
                continue
            info = registry.get_optimizer_info(base)
            registry.register(OptimInfo(
                name=name,
                opt_class=named,
                description=f'{kind} around {base}: {info.description}',
                has_eps=info.has_eps,
                has_momentum=info.has_momentum,
                has_betas=info.has_betas,
                num_betas=info.num_betas,
                defaults={**(info.defaults or {}), 'base': base, **fixed},
            ))


def sam_kwargs_problems(opt: str, opt_kwargs: Mapping[str, Any]) -> List[str]:
    """What ``create_optimizer_v2(model, opt, **opt_kwargs)`` would refuse among the SAM family's own arguments
    (``base`` and the family's settings), one line each in the words it would raise, found before anything is
    built: the same argument binding as the factory's class and the same checks (:meth:`SAMSettings.problems`).
    Empty for an ``opt`` that is not SAM's, or arguments that do not bind (the signature checks name those)."""
    name = str(opt).lower().split('_')[-1]  # timm's factory keeps the text after the last underscore
    try:
        info = get_optimizer_info(name)
    except (ValueError, KeyError):
        return []
    cls = info.opt_class
    if isinstance(cls, type) and issubclass(cls, SAM) and not hasattr(cls, 'signature'):  # bsam: no base to bind
        names = cls.Settings.init_names()
        return cls.Settings.problems(**{k: v for k, v in {**(info.defaults or {}), **opt_kwargs}.items() if k in names})
    if not (isinstance(cls, type) and issubclass(cls, SAM) and hasattr(cls, 'signature')):
        return []
    try:
        takes = cls.signature.parameters
        if not any(p.kind is p.VAR_KEYWORD for p in takes.values()):  # a key it does not take: the signature check's
            opt_kwargs = {k: v for k, v in opt_kwargs.items() if k in takes}
        _, base, _, values, _ = _arguments(cls, (None,), {**(info.defaults or {}), **opt_kwargs})
    except TypeError:
        return []
    problems = []
    try:
        check_base(base, cls.family.Settings.family)
    except ValueError as error:
        problems.append(str(error))
    names = cls.family.Settings.init_names()
    return problems + cls.family.Settings.problems(**{n: v for n, v in values.items() if n in names})


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
