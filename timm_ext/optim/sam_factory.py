"""SAM in timm's optimizer factory: ``create_optimizer_v2(model, opt='samadamw', rho=0.1)``.

timm's factory keeps only the text after the last underscore of ``opt`` (``lookahead_`` is its one
prefix), so ``sam_adamw`` would silently build plain AdamW. The names registered here therefore
have no underscore:

* ``sam<base>`` / ``asam<base>`` for the common bases (``samsgd``, ``sammomentum``, ``samadamw``,
  ``samlamb``, ... see ``SAM_BASES``); ``asam`` = ``adaptive=True``;
* ``sam`` / ``asam`` with ``base=<any timm optimizer name>`` in the optimizer kwargs
  (``opt_kwargs: {base: cadamw, rho: 0.1}`` in a recipe).

The base optimizer gets the arguments timm would give it for its own name (its defaults, momentum
only if it has one, eps/betas only if it takes them); ``rho``, ``adaptive``, ``eta``,
``clip_grad`` and ``clip_mode`` go to SAM. timm's ``lookahead_`` prefix still applies
(``lookahead_samadamw``), as do layer decay and every parameter-group option of the factory.
"""
from functools import partial
from typing import Any, List, Optional

from timm.optim import OptimInfo, get_optimizer_class, get_optimizer_info, list_optimizers
from timm.optim._optim_factory import OptimizerRegistry, default_registry

from timm_ext.optim.sam import SAM

__all__ = ['SAM_BASES', 'create_sam', 'list_sam_bases', 'register_sam_optimizers']

# bases that get a combined name (``sam<base>`` and ``asam<base>``); any other one works via ``base=``
SAM_BASES = (
    'sgd', 'momentum', 'nesterov', 'sgdw', 'adam', 'adamw', 'nadam', 'nadamw', 'radam',
    'lamb', 'lars', 'lion', 'adan', 'adopt',
)
_SAM_PREFIXES = ('sam', 'asam')


def list_sam_bases() -> List[str]:
    """timm optimizer names SAM can wrap (second-order optimizers such as adahessian excluded)."""
    names = []
    for name in list_optimizers():
        info = get_optimizer_info(name)
        is_sam = isinstance(info.opt_class, partial) and info.opt_class.func is create_sam
        if not info.second_order and not is_sam:
            names.append(name)
    return names


def create_sam(
        params: Any,
        base: Optional[str] = None,
        rho: float = 0.05,
        adaptive: bool = False,
        eta: float = 0.01,
        clip_grad: Optional[float] = None,
        clip_mode: str = 'norm',
        **base_kwargs: Any,
) -> SAM:
    """Build ``base`` (a timm optimizer name) over ``params`` the way timm's factory would, wrapped in SAM."""
    if base is None:
        raise ValueError(
            'SAM needs a base optimizer: use a combined name such as opt="samadamw" or pass base=<name> '
            '(a recipe: opt_kwargs: {base: adamw}); valid bases: ' + ', '.join(list_sam_bases()))
    name = str(base).lower()
    valid = list_sam_bases()
    if name not in valid:
        raise ValueError(f'Unknown base optimizer {base!r} for SAM; valid names: ' + ', '.join(valid))
    info = get_optimizer_info(name)
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
    base_optimizer = get_optimizer_class(info, bind_defaults=False)(params, **kwargs)
    return SAM(base_optimizer, rho=rho, adaptive=adaptive, eta=eta, clip_grad=clip_grad, clip_mode=clip_mode)


def register_sam_optimizers(registry: OptimizerRegistry = default_registry) -> None:
    """Register ``sam``, ``asam``, ``sam<base>`` and ``asam<base>`` with timm's optimizer factory."""
    for prefix in _SAM_PREFIXES:
        adaptive = prefix == 'asam'
        kind = 'ASAM (adaptive SAM)' if adaptive else 'SAM (sharpness-aware minimization)'
        if prefix not in registry._optimizers:
            registry.register(OptimInfo(
                name=prefix,
                opt_class=partial(create_sam, adaptive=adaptive),
                description=f'{kind} around the timm optimizer given as base=<name>',
                has_eps=True,
                has_momentum=True,
                has_betas=True,
            ))
        for base in SAM_BASES:
            name = prefix + base
            if name in registry._optimizers:
                continue
            info = registry.get_optimizer_info(base)
            registry.register(OptimInfo(
                name=name,
                opt_class=partial(create_sam, base=base, adaptive=adaptive),
                description=f'{kind} around {base}: {info.description}',
                has_eps=info.has_eps,
                has_momentum=info.has_momentum,
                has_betas=info.has_betas,
                num_betas=info.num_betas,
                defaults=info.defaults,
            ))
