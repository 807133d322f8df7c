"""Read the weights of a train.py checkpoint or a safetensors file, and load them into a model strictly.

timm's ``train.py`` saves ``last.pth.tar`` / ``model_best.pth.tar`` as a dict with ``state_dict``, the
EMA weights under ``state_dict_ema`` (with ``--model-ema``), its ``argparse.Namespace`` under ``args``
and the model name under ``arch``. The file is a pickle, so it is only ever read with
``torch.load(weights_only=True)``, which refuses any object other than tensors, containers and the
``Namespace`` allowed here; nothing else gets unpickled. What a file is (torch.save's, safetensors, or
neither) is read from its bytes first, whatever its name.
"""
import argparse
import contextlib
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from timm_ext.hub._format import SAFETENSORS, TAR, checkpoint_format, pickled_globals
from timm_ext.load_errors import HubError, first_line

__all__ = ['Checkpoint', 'load_checkpoint', 'load_weights', 'train_args_allowed']

_PREFIXES = ('module.', '_orig_mod.')  # DistributedDataParallel, torch.compile
# train.py arguments (dest, create_model name) that shape the model (drop rates and bn_momentum: training only)
_MODEL_ARGS_OF_TRAIN = (('num_classes', 'num_classes'), ('in_chans', 'in_chans'), ('gp', 'global_pool'),
                        ('bn_eps', 'bn_eps'))
_DATA_ARGS_OF_TRAIN = ('mean', 'std', 'interpolation', 'crop_pct', 'crop_mode')
_CUT_PICKLE = 'its pickle is truncated or corrupt'


@dataclass
class Checkpoint:
    """The weights of a checkpoint file, and what train.py recorded with them."""
    path: Path
    state_dict: Dict[str, torch.Tensor]
    arch: Optional[str] = None
    train_args: Dict[str, Any] = field(default_factory=dict)
    epoch: Optional[int] = None
    ema: bool = False
    # the optimizer state train.py saved with the weights: None without one, else whether it is a SAM-family
    # state (timm-ext's SAM adds its settings under 'sam')
    optimizer_is_sam: Optional[bool] = None

    def model_kwargs(self) -> Dict[str, Any]:
        """The keyword arguments train.py gave ``timm.create_model`` that shape the model (``--num-classes``,
        ``--in-chans`` or ``--input-size``, ``--gp``, ``--bn-eps``, ``--model-kwargs``); empty for a bare state_dict."""
        args = self.train_args
        kwargs = {name: args[key] for key, name in _MODEL_ARGS_OF_TRAIN if args.get(key) is not None}
        if 'in_chans' not in kwargs and args.get('input_size'):
            kwargs['in_chans'] = args['input_size'][0]
        kwargs.update(args.get('model_kwargs') or {})
        return kwargs

    def data_config(self) -> Dict[str, Any]:
        """The preprocessing train.py was told to use (``--input-size``/``--img-size``, ``--mean``, ``--std``,
        ``--interpolation``, ``--crop-pct``, ``--crop-mode``); what is absent came from the model's pretrained_cfg."""
        args = self.train_args
        config = {k: args[k] for k in _DATA_ARGS_OF_TRAIN if args.get(k) not in (None, '')}
        if args.get('input_size'):
            config['input_size'] = tuple(args['input_size'])
        elif args.get('img_size'):
            size = args['img_size']
            config['input_size'] = (self.model_kwargs().get('in_chans', 3), *((size, size) if isinstance(size, int)
                                                                              else size))
        return config


def load_checkpoint(path: Union[str, Path], use_ema: bool = False) -> Checkpoint:
    """The weights in ``path`` (a train.py checkpoint, a plain state_dict or a ``.safetensors`` file).

    ``use_ema`` picks train.py's EMA weights (``state_dict_ema``) and fails when there are none;
    ``module.`` / ``_orig_mod.`` prefixes are stripped.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise HubError(f'checkpoint {path} does not exist')
    fmt = checkpoint_format(path)
    if fmt == SAFETENSORS:
        if use_ema:
            raise HubError(f'{path} is a safetensors file, which holds one set of weights and no EMA: drop --ema')
        return Checkpoint(path, _strip_prefixes(read_safetensors(path)))
    content = _torch_load(path, fmt)
    if not isinstance(content, dict):
        raise HubError(f'{path} holds a {type(content).__name__}, not a state_dict or a train.py checkpoint')
    state_dict, ema = _pick_state_dict(content, path, use_ema)
    args = content.get('args')
    train_args = vars(args) if isinstance(args, argparse.Namespace) else dict(args) if isinstance(args, dict) else {}
    arch = content.get('arch') if isinstance(content.get('arch'), str) else None
    epoch = content.get('epoch') if isinstance(content.get('epoch'), int) else None
    optimizer = content.get('optimizer')
    is_sam = ('sam' in optimizer) if isinstance(optimizer, dict) else None
    return Checkpoint(path, _strip_prefixes(state_dict), arch=arch, train_args=train_args, epoch=epoch, ema=ema,
                      optimizer_is_sam=is_sam)


def read_safetensors(path: Path) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, on the CPU; a truncated or corrupt file is one HubError."""
    from safetensors.torch import load_file
    try:
        return load_file(str(path), device='cpu')
    except Exception as e:  # SafetensorError (bad header, truncated data), OSError
        raise HubError(f'{path} is not a readable safetensors file ({first_line(e)}): it is truncated or corrupt; '
                       f'export or download it again') from None


def _torch_load(path: Path, fmt: str) -> Any:
    if fmt == TAR:
        raise HubError(f'{path} is a torch < 0.4 checkpoint (a tar archive), which torch.load(weights_only=True) '
                       f'cannot read: in a session you trust, load it and save its state_dict() with torch.save')
    try:
        with train_args_allowed(), path.open('rb') as f:  # a file object: torch.load may dispatch a path on its suffix
            return torch.load(f, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:  # refused objects, or a pickle cut short: its opcodes tell which
        objects = pickled_globals(path, fmt)
        if objects is None:
            raise _unreadable(path, _CUT_PICKLE) from None
        what = ', '.join(objects[:3]) if objects else first_line(e)[:200]
        raise HubError(f'{path} holds objects that torch.load(weights_only=True) refuses ({what}): in a session '
                       f'you trust, load it and save its state_dict() with torch.save') from None
    except EOFError:
        raise _unreadable(path, _CUT_PICKLE) from None
    except Exception as e:  # RuntimeError of a missing or cut tensor record
        raise _unreadable(path, f'truncated or corrupt: {first_line(e)}') from None


def train_args_allowed() -> ContextManager[None]:
    """Meanwhile, ``torch.load(weights_only=True)`` also takes the ``argparse.Namespace`` train.py saves under
    ``args``: the one non-tensor object allowed besides containers (timm < 1.0.28's readers do not allow it)."""
    safe_globals = getattr(torch.serialization, 'safe_globals', None)
    if safe_globals is None:  # torch 2.4: only the global allow-list exists
        torch.serialization.add_safe_globals([argparse.Namespace])
        return contextlib.nullcontext()
    return safe_globals([argparse.Namespace])


def _unreadable(path: Path, why: str) -> HubError:
    return HubError(f'{path} is not a readable PyTorch checkpoint ({why}): copy it again, or save it again with '
                    f'torch.save')


def _pick_state_dict(content: Dict[str, Any], path: Path, use_ema: bool) -> Tuple[Dict[str, Any], bool]:
    if use_ema:
        for key in ('state_dict_ema', 'model_ema'):
            if isinstance(content.get(key), dict):
                return content[key], True
        raise HubError(f'{path} has no EMA weights (no state_dict_ema): train with --model-ema, or export without '
                       f'--ema')
    for key in ('state_dict', 'model'):
        if isinstance(content.get(key), dict):
            return content[key], False
    if content and all(isinstance(v, torch.Tensor) for v in content.values()):
        return content, False
    keys = ', '.join(sorted(map(str, content))[:8])
    raise HubError(f'{path} is neither a state_dict nor a train.py checkpoint (no state_dict key; keys: {keys})')


def _strip_prefixes(state_dict: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    out = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise HubError(f'the state_dict entry {key!r} is a {type(value).__name__}, not a tensor')
        stripped = True
        while stripped:
            stripped = False
            for prefix in _PREFIXES:
                if key.startswith(prefix):
                    key, stripped = key[len(prefix):], True
        out[key] = value
    return out


def load_weights(model: nn.Module, state_dict: Dict[str, torch.Tensor], source: Union[str, Path]) -> None:
    """``model.load_state_dict(state_dict, strict=True)`` after a check that says, in one line, what does not fit."""
    expected = model.state_dict()
    name = getattr(model, 'pretrained_cfg', {}).get('architecture') or type(model).__name__
    mismatched = [(k, tuple(state_dict[k].shape), tuple(v.shape)) for k, v in expected.items()
                  if k in state_dict and tuple(state_dict[k].shape) != tuple(v.shape)]
    if mismatched:
        key, got, want = mismatched[0]
        raise HubError(f'{source} does not fit {name}: {key} is {got} in the checkpoint but {want} in the model '
                       f'({len(mismatched)} tensors differ){_hint(model, key, got)}')
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        parts: List[str] = []
        if missing:
            parts.append(f'{len(missing)} model keys missing from it (first: {missing[0]})')
        if unexpected:
            parts.append(f'{len(unexpected)} keys the model does not have (first: {unexpected[0]})')
        raise HubError(f'{source} does not fit {name}: {"; ".join(parts)}; is it a checkpoint of {name}?')
    model.load_state_dict(state_dict, strict=True)


def _hint(model: nn.Module, key: str, shape: Tuple[int, ...]) -> str:
    classifier = getattr(model, 'pretrained_cfg', {}).get('classifier')
    heads = classifier if isinstance(classifier, (list, tuple)) else [classifier]
    if any(h and key == f'{h}.weight' for h in heads):
        return f': build the model with num_classes={shape[0]} (--model-kwargs num_classes={shape[0]})'
    return ': build the model with the arguments it was trained with (--model-kwargs KEY=VALUE ...)'
