"""The one-line messages for a checkpoint that cannot be used, shared by the models' builder and the hub.

``timm.create_model('local-dir:DIR')`` / ``'hf-hub:ID'`` of a timm-ext model fails inside timm with a traceback
(a missing file, a cache miss offline, weights that do not fit); ``explain_load_error`` turns it into the
line :class:`HubError` carries. This module imports nothing of timm-ext, so ``timm_ext.models`` can use it
without importing the hub (which is above the models).
"""
import dataclasses
import json
from pathlib import Path
from typing import Any, Optional, Union

import timm
import torch.nn as nn
from timm.models import PretrainedCfg, get_arch_name, is_model, parse_model_name

__all__ = ['CFG_FIELDS', 'CONFIG_NAME', 'HubError', 'WEIGHTS_NAME', 'explain_load_error', 'first_line',
           'unknown_architecture']

WEIGHTS_NAME = 'model.safetensors'
CONFIG_NAME = 'config.json'
CFG_FIELDS = tuple(f.name for f in dataclasses.fields(PretrainedCfg))


class HubError(ValueError):
    """A checkpoint, hub folder or hub repo that cannot be used, in one line that names the file and the fix."""


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message (its type name when it has none)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def unknown_architecture(arch: str, config_path: Union[str, Path]) -> str:
    """The message for a config.json whose architecture no imported module registered."""
    return (f'{config_path} names architecture {arch!r}, which is not registered with timm: `import timm_ext` '
            f'before timm.create_model (`--device-modules timm_ext` for train.py); if it is imported, a newer '
            f'timm-ext or timm defines {arch!r}')


def explain_load_error(model_name: str, cache_dir: Optional[Union[str, Path]], error: Exception,
                       pretrained: bool = True) -> Optional[str]:
    """The one line for ``error`` raised while ``timm.create_model(model_name)`` loaded an ``hf-hub:`` or
    ``local-dir:`` checkpoint; None when it is not such an error."""
    source, ident = parse_model_name(model_name)
    if source not in ('hf-hub', 'local-dir'):
        return None
    config, weights = _locations(source, ident, cache_dir)
    text = first_line(error)
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(error, LocalEntryNotFoundError):
        missing = CONFIG_NAME if config is None else WEIGHTS_NAME
        repo = ident.split('@')[0]
        return (f'{model_name}: {missing} is not in the Hugging Face cache ({_cache(cache_dir)}) and the hub is '
                f'not reachable{_offline()}: download it once online (`hf download {repo}`), or pass cache_dir= '
                f'(or set HF_HUB_CACHE before importing timm) to a cache that holds it')
    if isinstance(error, RepositoryNotFoundError):
        return (f'{model_name}: no such model repo on the hub (or it is private: log in with `hf auth login` or set '
                f'HF_TOKEN)')
    if isinstance(error, EntryNotFoundError):
        return f'{model_name}: the repo has no {CONFIG_NAME} or {WEIGHTS_NAME}: push a folder made by `timm-ext export`'
    if isinstance(error, FileNotFoundError) and source == 'local-dir':
        return f'{Path(ident) / CONFIG_NAME} does not exist: export the folder with `timm-ext export`'
    if isinstance(error, json.JSONDecodeError):
        return f'{config or CONFIG_NAME} is not valid JSON ({text}): export the folder again'
    from safetensors import SafetensorError

    if isinstance(error, SafetensorError):
        return (f'{weights or WEIGHTS_NAME} is not a readable safetensors file ({text}): it is truncated or '
                f'corrupt; delete it and download (or export) it again')
    saved = _read_json(config)
    arch = saved.get('architecture')
    if isinstance(error, RuntimeError) and isinstance(arch, str) and not is_model(get_arch_name(arch)):
        return unknown_architecture(arch, config or CONFIG_NAME)
    if isinstance(error, RuntimeError) and _raised_by(error, nn.Module.load_state_dict):
        details = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]  # shown, not parsed
        mismatch = (details[0] if details else text)[:240]
        return (f'{weights or WEIGHTS_NAME} does not fit the model built from {config or CONFIG_NAME}: {mismatch} '
                f'model_args in config.json must be the arguments the weights were trained with (export again with '
                f'`timm-ext export --model-kwargs ...`), and keyword arguments given to create_model must agree')
    if isinstance(error, RuntimeError) and weights is not None and pretrained:  # a checkpoint filter refused it
        return f'{weights} could not be loaded with {config or CONFIG_NAME}: {text}'
    cfg = saved.get('pretrained_cfg')
    if isinstance(error, TypeError) and isinstance(cfg, dict) and set(cfg) - set(CFG_FIELDS):
        return (f'{config or CONFIG_NAME}: its pretrained_cfg has a key timm {timm.__version__} does not know '
                f'({text}); export the folder again with `timm-ext export`')
    return None


def _read_json(path: Optional[Union[str, Path]]) -> dict:
    """config.json's object ({} when there is none or it is not a JSON object)."""
    try:
        saved = json.loads(Path(path).read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _raised_by(error: BaseException, function: Any) -> bool:
    """Whether ``function`` itself raised ``error`` (its innermost frame runs ``function``'s code)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is getattr(function, '__code__', None)


def _locations(source: str, ident: str, cache_dir: Optional[Union[str, Path]]):
    """The config.json and model.safetensors paths on disk (None where they are not there)."""
    if source == 'local-dir':
        folder = Path(ident)
        return (folder / CONFIG_NAME if (folder / CONFIG_NAME).is_file() else None,
                folder / WEIGHTS_NAME if (folder / WEIGHTS_NAME).is_file() else None)
    from huggingface_hub import try_to_load_from_cache
    repo, _, revision = ident.partition('@')
    found = [try_to_load_from_cache(repo, name, cache_dir=cache_dir, revision=revision or None)
             for name in (CONFIG_NAME, WEIGHTS_NAME)]
    return tuple(f if isinstance(f, str) else None for f in found)


def _cache(cache_dir: Optional[Union[str, Path]]) -> str:
    if cache_dir is not None:
        return str(cache_dir)
    from huggingface_hub import constants
    return str(constants.HF_HUB_CACHE)


def _offline() -> str:
    from huggingface_hub import constants
    return ' (HF_HUB_OFFLINE=1)' if constants.HF_HUB_OFFLINE else ''
