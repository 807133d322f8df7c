"""SAM-family settings in ``opt_kwargs``, bad and good, shared by the recipe check and the command-line check tests:
each bad one is refused by ``create_optimizer_v2`` itself (:func:`factory_error` is that refusal's text), and the
pre-flight must refuse it with the same words before anything is built."""
from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn

# (opt, opt_kwargs): one bad value each, for every setting of every family (and the base of the plain names)
BAD: List[Tuple[str, Dict[str, Any]]] = [
    ('samadamw', {'rho': -0.05}),
    ('samadamw', {'rho': '5e-2'}),  # YAML 1.1 reads 5e-2 (no dot) as a string
    ('samadamw', {'rho': float('inf')}),
    ('samadamw', {'adaptive': 'false'}),  # a string: bool('false') would turn ASAM on
    ('samadamw', {'eta': -0.01}),
    ('samadamw', {'clip_grad': 0}),
    ('samadamw', {'clip_mode': 'l2'}),
    ('samadamw', {'interval': 0}),
    ('samadamw', {'m_sharpness': 0}),
    ('asamsgd', {'rho': -0.5}),
    ('sam', {'base': 'adamx'}),
    ('sam', {'base': None, 'rho': 0.1}),  # a base given as nothing (no base at all builds around sgd)
    ('gsamadamw', {'rho_max': -0.1}),
    ('gsamadamw', {'rho_min': -0.1}),
    ('gsamadamw', {'rho_min': 0.1}),  # above the default rho_max 0.04
    ('gsamadamw', {'alpha': 1.0}),
    ('gsamadamw', {'lr_min': -1.0}),
    ('gsamadamw', {'lr_max': 0.001, 'lr_min': 0.01}),
    ('gsamadamw', {'adaptive': 'yes'}),
    ('gsamadamw', {'eta': -1.0}),
    ('gsamadamw', {'clip_grad': -1.0}),
    ('gsamadamw', {'clip_mode': 'max'}),
    ('gsamadamw', {'interval': 1.5}),
    ('gsamadamw', {'m_sharpness': -2}),
    ('looksamadamw', {'rho': -1.0}),
    ('looksamadamw', {'alpha': 1.5}),
    ('looksamadamw', {'interval': 0}),
    ('looksamadamw', {'adaptive': 2}),
    ('looksamadamw', {'eta': -0.1}),
    ('looksamadamw', {'clip_grad': 'norm'}),
    ('looksamadamw', {'clip_mode': None}),
    ('looksamadamw', {'m_sharpness': 2.5}),
    ('wsamadamw', {'gamma': 1.0}),
    ('wsamadamw', {'gamma': -0.5}),
    ('wsamsgd', {'decouple': 'no'}),
    ('wsamadamw', {'rho': -0.1}),
    ('friendlysamadamw', {'sigma': -1.0}),
    ('friendlysamadamw', {'lmbda': 1.5}),
    ('friendlysamsgd', {'rho': float('nan')}),
    ('samadamw', {'use_gc': 'true'}),
    ('looksamadamw', {'use_gc': 2}),
    ('samonadamw', {'only_norm': 'all'}),
    ('samonsgd', {'rho': -0.2}),
]

# valid settings, every one of them given, per family
GOOD: List[Tuple[str, Dict[str, Any]]] = [
    ('samadamw', {'rho': 0.1, 'adaptive': True, 'eta': 0.0, 'clip_grad': 1.0, 'clip_mode': 'agc', 'interval': 2,
                  'm_sharpness': 4}),
    ('asamsgd', {'rho': 2.0, 'adaptive': 1}),
    ('sam', {'base': 'cadamw', 'rho': 0}),
    ('sam', {'rho': 0.1}),  # no base: adamw (DEFAULT_BASE)
    ('gsam', {'rho_max': 0.1}),
    ('gsamadamw', {'rho_max': 0.1, 'rho_min': 0.0, 'alpha': 0.0, 'lr_max': 1.0, 'lr_min': 0.0, 'clip_grad': None,
                   'clip_mode': 'value', 'interval': 3, 'm_sharpness': None}),
    ('looksamadamw', {'rho': 0.05, 'alpha': 0.0, 'interval': 1, 'adaptive': False, 'eta': 0.5}),
    ('wsamadamw', {'rho': 0.1, 'gamma': 0.0, 'decouple': False, 'interval': 2}),
    ('friendlysam', {'rho': 0.1, 'sigma': 0.0, 'lmbda': 1.0, 'm_sharpness': 4}),
    ('gsamsgd', {'use_gc': True, 'rho_max': 0.1}),
    ('samonadamw', {'rho': 0.1, 'only_norm': False}),
]


def factory_error(opt: str, opt_kwargs: Dict[str, Any]) -> Optional[str]:
    """The ValueError ``create_optimizer_v2`` raises for these arguments (None when it builds the optimizer)."""
    from timm.optim import create_optimizer_v2

    import timm_ext  # noqa: F401  (registers the SAM names)

    try:
        create_optimizer_v2(nn.Linear(2, 2), opt, lr=0.1, **opt_kwargs)
    except ValueError as error:
        return str(error)
    return None


def case_id(case: Tuple[str, Dict[str, Any]]) -> str:
    opt, kwargs = case
    return f'{opt}-' + '-'.join(f'{k}={v!r}' for k, v in kwargs.items())
