"""Whether the weights of ``--initial-checkpoint`` fit the model train.py will build, checked before it is built.

train.py passes ``--initial-checkpoint`` to ``timm.create_model(checkpoint_path=...)``, which loads it strictly into
the model built with this run's ``--num-classes``: a checkpoint of 5 classes fine-tuned on 10 passes every other
check, then ends in a traceback of size mismatches once the model is built. train.py's route to fine-tune is
``--pretrained --pretrained-path FILE``, which drops a head of another class count. The file is read as timm reads it
(``timm.models.load_state_dict``: the EMA weights first, wrapper prefixes removed, ``weights_only``) and compared key
for key and shape for shape with the model built on the meta device. Called by
:func:`timm_ext.launch.command_checks.check_train_command`.
"""
import argparse
import os
from typing import Any, Dict, List, Optional, Tuple

from timm_ext.launch.input_size import meta_model, train_model_kwargs
from timm_ext.load_errors import first_line

__all__ = ['initial_checkpoint_problems']

_NUMPY = ('.npz', '.npy')  # timm hands these to the model's own load_pretrained, not to load_state_dict
_TOLERATED = ('num_batches_tracked',)  # BatchNorm fills it in when a state_dict without it is loaded


def initial_checkpoint_problems(args: argparse.Namespace) -> List[str]:
    """One line when ``--initial-checkpoint`` is missing, unreadable, or does not fit the model train.py builds (a
    head of another class count, another architecture); nothing without it, or for a model read by name elsewhere
    (``hf-hub:``, paths) or one that cannot be built (the model checks name that)."""
    path = getattr(args, 'initial_checkpoint', '') or ''
    if not path:
        return []
    if not os.path.isfile(path):  # as train.py opens it: relative to the working folder, a quoted ~ kept
        what = 'is a folder, not a file' if os.path.isdir(path) else 'does not exist'
        return [f'--initial-checkpoint {path} {what}: train.py would build the model, then stop (FileNotFoundError); '
                f'give the weights file to start from']
    if os.path.splitext(path)[1].lower() in _NUMPY or not isinstance(args.model, str) or \
            any(c in args.model for c in ('/', '\\', ':')):
        return []
    kwargs = train_model_kwargs(args)
    model = None if kwargs is None else meta_model(args.model, kwargs)
    if model is None:
        return []
    try:
        state_dict = _read_as_timm_does(path)
    except Exception as e:  # whatever timm's reader raises, train.py raises it too, after building the model
        return [f'--initial-checkpoint {path} cannot be read as train.py reads it (timm.models.load_state_dict, '
                f'weights only): {_why_unreadable(path, e)}']
    found = _fit_problem(path, _shapes(state_dict), model, args)
    return [found] if found else []


def _read_as_timm_does(path: str) -> Dict[str, Any]:
    """The state dict timm's ``create_model(checkpoint_path=path)`` loads: its own reader, EMA weights first, on the
    CPU, weights only (train.py's saved ``args`` Namespace allowed, as timm >= 1.0.28 allows it)."""
    from timm.models import load_state_dict

    from timm_ext.hub._checkpoint import train_args_allowed

    with train_args_allowed():
        return load_state_dict(path, use_ema=True, device='cpu', weights_only=True)


def _why_unreadable(path: str, error: Exception) -> str:
    """What the file is, as timm-ext's own reader names it (timm's says a text file "requires non-allowlisted pickle
    globals"); timm's first line when that reader takes the file."""
    from timm_ext.hub import HubError, load_checkpoint

    try:
        load_checkpoint(path)
    except HubError as e:
        return str(e)
    except Exception:  # a file timm-ext reads but timm does not: timm's own error is the answer
        pass
    return f'{type(error).__name__}: {first_line(error)}'


def _shapes(state_dict: Dict[str, Any]) -> Dict[str, Optional[Tuple[int, ...]]]:
    return {k: tuple(v.shape) if hasattr(v, 'shape') else None for k, v in state_dict.items()}


def _fit_problem(path: str, saved: Dict[str, Optional[Tuple[int, ...]]], model: Any,
                 args: argparse.Namespace) -> Optional[str]:
    """What a strict ``load_state_dict`` of ``saved`` into ``model`` would stop at, in one line: other keys than
    the head's first (another architecture), then other shapes, then the head."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    heads = _head_keys(model)
    missing = [k for k in expected if k not in saved and k not in heads and not k.endswith(_TOLERATED)]
    unexpected = [k for k in saved if k not in expected and k not in heads]
    if missing or unexpected:
        parts = ([f'{len(missing)} model keys missing from it (first: {missing[0]})'] if missing else []) + (
            [f'{len(unexpected)} keys the model does not have (first: {unexpected[0]})'] if unexpected else [])
        return (f'--initial-checkpoint {path} does not fit {args.model}: {"; ".join(parts)}: is it a checkpoint of '
                f'{args.model}? train.py loads it strictly and would stop after building the model')
    differ = [k for k in expected if k in saved and k not in heads and saved[k] != expected[k]]
    if differ:
        key = differ[0]
        return (f'--initial-checkpoint {path} does not fit {args.model}: {key} is {_shown(saved[key])} there, '
                f'{_shown(expected[key])} in the model ({len(differ)} tensors differ): build the model as the '
                f'checkpoint was built (--model-kwargs, --img-size), or start from a checkpoint of this model')
    return _head_problem(path, saved, expected, heads, model, args)


def _head_problem(path: str, saved: Dict[str, Optional[Tuple[int, ...]]], expected: Dict[str, Tuple[int, ...]],
                  heads: List[str], model: Any, args: argparse.Namespace) -> Optional[str]:
    """The classifier of another class count (or none): train.py's strict load stops at it; its route to fine-tune
    a checkpoint on other classes is ``--pretrained --pretrained-path``, which drops the head."""
    key = next((k for k in heads if saved.get(k) != expected.get(k)), None)
    if key is None:
        return None
    classes = f'--num-classes {args.num_classes}' if args.num_classes is not None else \
        f'its default {model.num_classes} classes (no --num-classes)'
    return (f'--initial-checkpoint {path}: {key} is {_shown(saved.get(key))} there but {_shown(expected.get(key))} '
            f'in {args.model} with {classes}, and train.py loads it strictly (a size mismatch after building the '
            f'model): to fine-tune, pass --pretrained --pretrained-path {path} instead (it drops a mismatched head)')


def _head_keys(model: Any) -> List[str]:
    """The classifier's weight and bias keys, from the model's ``pretrained_cfg['classifier']`` (one name or
    several: distilled ViTs have ``head`` and ``head_dist``)."""
    classifier = (getattr(model, 'pretrained_cfg', None) or {}).get('classifier') or ()
    names = [classifier] if isinstance(classifier, str) else list(classifier)
    return [f'{name}.{part}' for name in names for part in ('weight', 'bias')]


def _shown(shape: Optional[Tuple[int, ...]]) -> str:
    return 'absent' if shape is None else str(shape)
