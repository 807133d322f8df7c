"""A recipe file against train.py's own parser, before train.py runs: each problem is one line that says the fix.

train.py feeds a recipe to its parser with ``set_defaults``, which silently accepts any key. The checks
catch what would otherwise cost a run:

* a key train.py does not know (``rho:`` at the top level instead of under ``opt_kwargs``);
* a value of the wrong kind for its argument (``device_modules: timm_ext`` instead of a list,
  ``epochs: 1.5``, a value outside the argument's choices);
* an ``opt`` name with an underscore before a SAM name (``sam_adamw``): timm's optimizer factory
  keeps only the text after the last underscore and builds plain AdamW;
* an ``opt_kwargs`` key the optimizer timm's factory builds has no argument for (``opt: adamw`` with
  ``opt_kwargs: {rho: 0.05}``: ``TypeError`` in train.py), read from the class's signature;
* a SAM-family setting in ``opt_kwargs`` its optimizer refuses (``rho: -0.05``, GSAM's ``rho_min`` above its
  ``rho_max``, an unknown ``base``), checked by the optimizer's own checks, in the words it would raise;
* ``bce_loss: true`` with label smoothing 0 and no mixup / cutmix: train.py then builds softmax
  cross-entropy and ignores ``bce_loss`` (it builds its BCE loss only in the mixup and smoothing branches).

``timm-ext recipes check`` runs these on a recipe file alone. The optimizer and loss rules are public because
the checks of a whole command line (:mod:`timm_ext.launch.command_checks`) apply them to the merged values.
"""
import argparse
import difflib
import inspect
from functools import partial
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from timm_ext._timm_compat import parser_actions
from timm_ext.optim.mesa_optimizer import mesa_kwargs_problems
from timm_ext.optim.sam_factory import sam_kwargs_problems
from timm_ext.optim.sam_settings import sam_opt_kwargs

__all__ = ['SAM_ONLY_KEYS', 'actions_by_dest', 'check_recipe', 'is_sam_optimizer', 'kind_of', 'loss_problems',
           'opt_kwargs_problems', 'opt_name_problems', 'optimizer_arguments', 'sam_settings_problems']

# the SAM family's own optimizer arguments (opt_kwargs), from its settings declarations
SAM_ONLY_KEYS = sam_opt_kwargs()


def is_sam_optimizer(opt: str) -> bool:
    """True when timm's factory (with timm_ext loaded) builds a SAM-family optimizer for ``opt`` (``samadamw``,
    ``gsamadamw``, ``looksamadamw``, ``lookahead_sam``)."""
    from timm.optim import get_optimizer_info, list_optimizers

    from timm_ext.optim import SAM  # (importing timm_ext.optim registers SAM with timm's factory)

    name = str(opt).lower().split('_')[-1]
    if name not in list_optimizers():
        return False
    opt_class = get_optimizer_info(name).opt_class
    return isinstance(opt_class, type) and issubclass(opt_class, SAM)


def check_recipe(config: Dict[str, Any], parser: argparse.ArgumentParser, opt_kwargs: bool = True) -> List[str]:
    """Problems of a recipe against train.py's ``parser``: unknown keys, values of the wrong kind, a SAM name
    that timm's factory would not build, ``opt_kwargs`` its optimizer does not take (``opt_kwargs=False``: left to
    the check of the whole command line, where ``--opt`` may replace the recipe's). One line each, with the fix."""
    actions = actions_by_dest(parser)
    problems = []
    for key, value in config.items():
        action = actions.get(key)
        if action is None:
            problems.append(_unknown_key(key, actions))
        elif key == 'device_modules' and isinstance(value, str):
            problems.append(f'device_modules is the string {value!r}: train.py would import each of its characters; '
                            f'write a list: `device_modules: [{value}]`')
        else:
            problem = _value_problem(action, value)
            if problem:
                problems.append(f'recipe key {key!r}: {problem}')
    opt = config.get('opt')
    if isinstance(opt, str):
        problems += opt_name_problems(opt)
        if opt_kwargs and isinstance(config.get('opt_kwargs'), dict):
            problems += opt_kwargs_problems(opt, config['opt_kwargs'])
        if opt_kwargs and isinstance(config.get('opt_kwargs') or {}, dict):
            problems += sam_settings_problems(opt, config.get('opt_kwargs') or {})
    return problems + loss_problems(lambda k: config.get(k, actions[k].default if k in actions else None))


def actions_by_dest(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    """The parser's arguments by their ``dest`` (a recipe's key), without ``--help``."""
    return {a.dest: a for a in parser_actions(parser)}


def _unknown_key(key: Any, actions: Dict[str, argparse.Action]) -> str:
    line = f'recipe key {key!r} is not a train.py argument (train.py ignores unknown keys silently)'
    if key in SAM_ONLY_KEYS:
        return f'{line}: SAM\'s {key} goes under opt_kwargs, e.g. `opt_kwargs: {{{key}: ...}}`'
    close = difflib.get_close_matches(str(key).replace('-', '_'), list(actions), n=1, cutoff=0.6)
    return f'{line}: did you mean {close[0]!r}?' if close else f'{line}: remove it'


def opt_name_problems(opt: str) -> List[str]:
    """``sam_adamw``: timm's factory keeps the text after the last underscore, so SAM silently becomes AdamW."""
    parts = opt.lower().split('_')
    prefix = ['lookahead'] if len(parts) > 1 and parts[0] == 'lookahead' else []
    rest = parts[len(prefix):]
    if len(rest) < 2 or is_sam_optimizer(rest[-1]) or not any(is_sam_optimizer(p) for p in rest[:-1]):
        return []
    joined = '_'.join(prefix + [''.join(rest)])
    fix = repr(joined) if is_sam_optimizer(joined) else (
        f"{'_'.join(prefix + [rest[0]])!r} with opt_kwargs: {{base: {rest[-1]}}}")
    return [f'opt {opt!r} builds plain {rest[-1]} in timm\'s optimizer factory (it keeps only the text after the '
            f'last underscore), not SAM: write {fix}']


def _signature_names(target: Any) -> Tuple[FrozenSet[str], bool]:
    """The keyword names ``target`` takes (less ``params``), and whether it also takes ``**kwargs``."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return frozenset(), True  # no signature to read: take anything rather than refuse a valid key
    names = frozenset(n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)) - {'params'}
    return names, any(p.kind == p.VAR_KEYWORD for p in params.values())


def optimizer_arguments(opt: str, opt_kwargs: Optional[Dict[str, Any]] = None) -> Optional[FrozenSet[str]]:
    """Every ``opt_kwargs`` key timm's factory can build ``opt`` with: the class's own arguments (for the SAM
    family: its settings and those of its base optimizer) and ``create_optimizer_v2``'s. None when timm does
    not know ``opt`` or its class takes any keyword."""
    from timm.optim import create_optimizer_v2, get_optimizer_info

    from timm_ext.optim import SAM  # (importing timm_ext.optim registers SAM with timm's factory)

    name = str(opt).lower().split('_')[-1]  # timm's factory reads the text after the last underscore
    try:
        info = get_optimizer_info(name)
    except (ValueError, KeyError):  # not a name timm knows: the factory says so itself
        return None
    target = info.opt_class.func if isinstance(info.opt_class, partial) else info.opt_class
    names, any_keyword = _signature_names(target)
    if isinstance(target, type) and issubclass(target, SAM):  # its **kwargs go to the base optimizer
        base = (opt_kwargs or {}).get('base') or (info.defaults or {}).get('base')
        base_names = optimizer_arguments(base) if isinstance(base, str) else None
        if base_names is None:
            return None
        names, any_keyword = names | base_names, False
    if any_keyword:
        return None
    factory, _ = _signature_names(create_optimizer_v2)
    return names | (factory - {'model_or_params', 'opt'})


def opt_kwargs_problems(opt: str, opt_kwargs: Dict[str, Any]) -> List[str]:
    """``opt_kwargs`` keys that the optimizer timm's factory builds for ``opt`` has no argument for: train.py
    would stop with ``TypeError: ... got an unexpected keyword argument`` after building the model."""
    takes = optimizer_arguments(opt, opt_kwargs)
    if takes is None:
        return []
    problems = []
    for key in opt_kwargs:
        if key in takes:
            continue
        line = (f'opt_kwargs key {key!r} is not an argument of the optimizer timm builds for opt {opt!r} (train.py '
                f'would stop with TypeError)')
        if key in SAM_ONLY_KEYS and not is_sam_optimizer(opt):
            name = str(opt).lower().split('_')[-1]
            fix = f'sam{name}' if is_sam_optimizer(f'sam{name}') else 'sam with base: ' + name
            problems.append(f'{line}: {key} is a SAM setting; for SAM write opt: {fix}, else drop {key}')
            continue
        close = difflib.get_close_matches(str(key), sorted(takes), n=1, cutoff=0.6)
        problems.append(f'{line}: did you mean {close[0]!r}?' if close else
                        f'{line}: it takes {", ".join(sorted(takes))}')
    return problems


def sam_settings_problems(opt: str, opt_kwargs: Dict[str, Any]) -> List[str]:
    """SAM-family and MESA settings in ``opt_kwargs`` that timm's factory would refuse when train.py builds the
    optimizer, after the model and the data: found here by the same checks (``sam_kwargs_problems``,
    ``mesa_kwargs_problems``), in the same words. ``timm-ext recipes check`` and the checks of a command line both
    call this."""
    problems = sam_kwargs_problems(opt, opt_kwargs) + mesa_kwargs_problems(opt, opt_kwargs)
    return [f'opt_kwargs: {problem} (train.py would stop with this ValueError when it builds the optimizer, after '
            f'the model and the data)' for problem in problems]


def loss_problems(get: Callable[[str], Any]) -> List[str]:
    """train.py (v1.0.28) builds BinaryCrossEntropy only when mixup / cutmix or label smoothing is on."""
    try:
        smoothing, mixup, cutmix = (float(get(k) or 0) for k in ('smoothing', 'mixup', 'cutmix'))
    except (TypeError, ValueError):  # a bad value is reported by the type checks
        return []
    if get('bce_loss') is not True or get('jsd_loss') or mixup > 0 or cutmix > 0 or get('cutmix_minmax') is not None:
        return []
    if smoothing:
        return []
    return ['bce_loss is true but smoothing is 0 and mixup / cutmix are off: train.py then trains with softmax '
            'cross-entropy and ignores bce_loss; for the sigmoid loss without smoothing set a negligible '
            'smoothing, e.g. `smoothing: 1.0e-06`']


def kind_of(value: Any) -> str:
    """``an int``, ``a str``: the value's type with its article."""
    name = type(value).__name__
    return f'{"an" if name[0] in "aeiou" else "a"} {name}'


def _scalar_problem(action: argparse.Action, value: Any) -> Optional[str]:
    kind = action.type or str
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
                kind is int and isinstance(value, float)):
            return f'{value!r} is {kind_of(value)}; train.py expects {kind.__name__}'
        if isinstance(value, str):
            try:
                kind(value)
            except ValueError:
                return f'{value!r} is not a number; train.py expects {kind.__name__}'
    elif kind is str and not isinstance(value, str):
        return f'{value!r} is {kind_of(value)}; train.py expects text'
    if action.choices is not None and value not in action.choices:
        return f'{value!r} is not one of {", ".join(map(str, action.choices))}'
    return None


def _value_problem(action: argparse.Action, value: Any) -> Optional[str]:
    """Why ``value`` does not fit ``action`` (None when it does); None values keep train.py's default."""
    if value is None:
        return None
    if isinstance(action.default, dict):  # timm's ParseKwargs (--model-kwargs, --opt-kwargs)
        return None if isinstance(value, dict) else f'{value!r} is {kind_of(value)}; train.py expects a mapping'
    if action.nargs == 0:  # flags
        return None if isinstance(value, bool) else f'{value!r} is {kind_of(value)}; train.py expects true or false'
    if action.nargs in ('+', '*') or isinstance(action.nargs, int):
        if not isinstance(value, (list, tuple)):
            return f'{value!r} is {kind_of(value)}; train.py expects a list, e.g. [{value}]'
        if isinstance(action.nargs, int) and len(value) != action.nargs:
            return f'{value!r} has {len(value)} items; train.py expects {action.nargs}'
        if action.nargs == '+' and not value:
            return 'an empty list; train.py expects at least one item'
        for item in value:
            problem = _scalar_problem(action, item)
            if problem:
                return problem
        return None
    return _scalar_problem(action, value)
