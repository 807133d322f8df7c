"""Write and check a hub folder: ``model.safetensors``, ``config.json`` and a model card ``README.md``.

The folder is what ``timm.create_model('hf-hub:ORG/NAME')`` and ``timm.create_model('local-dir:DIR')``
read on every timm release timm-ext supports. It is written here, not by timm's ``save_for_hf``, because
that function differs across releases: timm 1.0.28 writes a pickle by default, records no
``model_args`` (so a model built with ``img_size=32`` comes back at 224) and fails on a model loaded
through a ``state_dict`` overlay. Only safetensors is written: timm 1.0.28's ``local-dir:`` loads
``*.bin`` / ``*.pth`` / ``*.pth.tar`` over ``model.safetensors`` when both are present.
"""
import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import timm
import torch.nn as nn
from timm.layers import to_2tuple
from timm.models import get_arch_name, is_model

from timm_ext.hub._card import CardInfo, model_card
from timm_ext.hub._files import save_safetensors
from timm_ext.load_errors import CFG_FIELDS, CONFIG_NAME, WEIGHTS_NAME, HubError, first_line, unknown_architecture

__all__ = ['CARD_NAME', 'CONFIG_NAME', 'WEIGHTS_NAME', 'check_folder', 'export', 'hub_config']

CARD_NAME = 'README.md'
_OURS = (WEIGHTS_NAME, CONFIG_NAME, CARD_NAME)
# weight files timm's local-dir/hf-hub loaders may pick up instead of (or next to) model.safetensors
_WEIGHT_SUFFIXES = ('.safetensors', '.bin', '.pth', '.pth.tar', '.pt', '.ckpt', '.npz')
# where the source weights came from and what they were: wrong for the exported weights
_SOURCE_KEYS = ('url', 'file', 'state_dict', 'hf_hub_id', 'hf_hub_filename', 'source', 'tag', 'origin_url', 'notes',
                'description')
# create_model arguments that place or wrap the model, not describe it (as timm >= 1.0.31 excludes them)
_RUNTIME_ARGS = ('device', 'dtype', 'pretrained_model_args', 'pretrained_cfg', 'pretrained_cfg_overlay', 'cache_dir',
                 'checkpoint_path', 'pretrained_strict', 'scriptable', 'exportable', 'no_jit', 'features_only',
                 'out_indices', 'feature_cls', 'feature_cfg')
_DATA_KEYS = ('input_size', 'mean', 'std', 'interpolation', 'crop_pct', 'crop_mode')


def hub_config(
        model: nn.Module,
        model_args: Optional[Dict[str, Any]] = None,
        data_config: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The ``config.json`` of ``model``: ``architecture``, ``num_classes``, ``num_features``, ``model_args`` and
    ``pretrained_cfg`` (the preprocessing of these weights; no source location), JSON-ready.

    ``model_args`` are the ``create_model`` keyword arguments that rebuild the model; by default those timm
    >= 1.0.31 recorded on it, else only ``num_classes``. Drop rates are left out (training only).
    ``data_config`` overrides the preprocessing (``input_size``, ``mean``, ``std``, ``crop_pct``, ...).
    """
    cfg = dict(getattr(model, 'pretrained_cfg', None) or {})
    arch = cfg.get('architecture')
    if not arch:
        raise HubError(f'{type(model).__name__} has no pretrained_cfg architecture: create it with timm.create_model')
    args = _model_args(model, model_args)
    pretrained_cfg = {k: v for k, v in cfg.items() if k in CFG_FIELDS and k not in _SOURCE_KEYS and v is not None}
    pretrained_cfg.pop('architecture', None)
    pretrained_cfg['custom_load'] = False  # a native timm state_dict
    if cfg.get('num_classes') != model.num_classes:
        for key in ('label_names', 'label_descriptions', 'label_offset'):
            pretrained_cfg.pop(key, None)
    pretrained_cfg['num_classes'] = model.num_classes
    pretrained_cfg.update(_input_config(cfg, args, data_config or {}))
    pretrained_cfg = {k: v for k, v in pretrained_cfg.items() if v is not None}
    config: Dict[str, Any] = {'architecture': arch, 'num_classes': model.num_classes}
    if isinstance(getattr(model, 'num_features', None), int):
        config['num_features'] = model.num_features
    if isinstance(getattr(model, 'global_pool', None), str) and model.global_pool:
        config['global_pool'] = model.global_pool
    config['model_args'] = args
    config['pretrained_cfg'] = pretrained_cfg
    return json.loads(json.dumps(config))  # tuples -> lists, as the file will hold them


def _model_args(model: nn.Module, model_args: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    recorded = getattr(model, '_model_args', None) if model_args is None else model_args
    args = {k: v for k, v in dict(recorded or {}).items()
            if k not in _RUNTIME_ARGS and not (k.endswith('drop_rate') or k.startswith('drop_'))}
    if args.get('num_classes', model.num_classes) != model.num_classes:
        raise HubError(f'model_args num_classes={args["num_classes"]} disagrees with the model '
                       f'(num_classes={model.num_classes})')
    args['num_classes'] = model.num_classes
    for key, value in args.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise HubError(f'model_args[{key!r}] = {value!r} cannot be written to config.json: pass a JSON value '
                           f'(a layer by its timm name, e.g. act_layer="gelu") or leave it out') from None
    return args


def _input_config(cfg: Dict[str, Any], args: Dict[str, Any], data_config: Dict[str, Any]) -> Dict[str, Any]:
    """The preprocessing entries of pretrained_cfg for the size the model was built at (or trained at)."""
    unknown = sorted(set(data_config) - set(_DATA_KEYS))
    if unknown:
        raise HubError(f'data_config key {unknown[0]!r} is not one of {", ".join(_DATA_KEYS)}')
    out = {k: v for k, v in data_config.items() if v is not None}
    input_size = tuple(cfg.get('input_size') or (3, 224, 224))
    in_chans = args.get('in_chans', input_size[0])
    if out.get('input_size') is not None:
        size = tuple(out['input_size'])
    elif args.get('img_size') is not None:
        size = (in_chans, *to_2tuple(args['img_size']))
    else:
        size = (in_chans, *input_size[1:])
    out['input_size'] = size
    if size[1:] != input_size[1:]:  # the registered test-time sizes belong to the registered input size
        out.update(test_input_size=None, pool_size=None, test_pool_size=None, min_input_size=None)
    return out


def export(
        model: nn.Module,
        out_dir: Union[str, Path],
        model_args: Optional[Dict[str, Any]] = None,
        data_config: Optional[Dict[str, Any]] = None,
        card: Optional[CardInfo] = None,
        overwrite: bool = False,
) -> Path:
    """Write ``model`` as a hub folder (``model.safetensors``, ``config.json``, ``README.md``) and check it.

    The folder must be empty or absent; ``overwrite=True`` replaces those three files only and keeps any
    other file, but refuses a folder holding other weight files (timm's loaders could pick them). The
    files are written and checked in a scratch folder first (rebuilt from ``config.json`` on the meta
    device, every tensor's name and shape compared), so a folder that would not load is never left behind.
    Every file gets the mode ``open()`` gives (``0o666`` less the umask).
    """
    out = Path(out_dir).expanduser()
    _check_target(out, overwrite)
    config = hub_config(model, model_args, data_config)
    if card is not None:
        config['pretrained_cfg']['license'] = card.license
    state_dict = {k: v.detach().to('cpu', copy=True).contiguous() for k, v in model.state_dict().items()}
    card_text = model_card(config, card or CardInfo(), num_params=sum(p.numel() for p in model.parameters()))
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / '.timm-ext-export'
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        save_safetensors(state_dict, scratch / WEIGHTS_NAME, metadata={'format': 'pt'})
        (scratch / CONFIG_NAME).write_text(json.dumps(config, indent=2) + '\n')
        (scratch / CARD_NAME).write_text(card_text)
        check_folder(scratch, where=out)
        for name in _OURS:
            (scratch / name).replace(out / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise HubError(f'{out} is a file: give a folder for the export')
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if present and not overwrite:
        raise HubError(f'{out} is not empty ({", ".join(present[:5])}): choose an empty folder, or pass --force '
                       f'(overwrite=True) to replace {", ".join(_OURS)} and keep the other files')
    others = _other_weights(out) if present else []
    if others:
        raise HubError(f'{out} holds other weight files ({", ".join(others[:5])}) that timm could load instead of '
                       f'{WEIGHTS_NAME}: move them out first')


def _other_weights(folder: Path) -> List[str]:
    return sorted(p.name for p in folder.iterdir()
                  if p.is_file() and p.name != WEIGHTS_NAME and p.name.endswith(_WEIGHT_SUFFIXES))


def check_folder(folder: Union[str, Path], where: Optional[Path] = None) -> Dict[str, Any]:
    """Check that ``folder`` loads with ``timm.create_model('local-dir:...')`` / ``'hf-hub:...'``; its config.

    Checks, each failure one HubError naming the file: config.json is JSON with ``architecture``,
    ``num_classes``, ``model_args`` and ``pretrained_cfg`` that this timm accepts; the architecture is
    registered; ``model.safetensors`` is the only weight file and readable; the model rebuilt from config.json
    (on the meta device: no memory, no compute) has exactly the file's tensor names and shapes.
    """
    folder = Path(folder).expanduser()
    shown = where or folder  # the name the user knows (export checks a scratch copy)
    config = _read_config(folder / CONFIG_NAME, shown / CONFIG_NAME)
    if not (folder / WEIGHTS_NAME).is_file():
        raise HubError(f'{shown / WEIGHTS_NAME} does not exist: export the model with `timm-ext export`')
    others = _other_weights(folder)
    if others:
        raise HubError(f'{shown} holds weight files besides {WEIGHTS_NAME} ({", ".join(others[:5])}): timm may load '
                       f'them instead; move them out')
    shapes = _safetensors_shapes(folder / WEIGHTS_NAME, shown / WEIGHTS_NAME)
    expected = _rebuilt_shapes(config, shown / CONFIG_NAME)
    _compare(shapes, expected, shown / WEIGHTS_NAME, config)
    return config


def _read_config(path: Path, shown: Path) -> Dict[str, Any]:
    if not path.is_file():
        raise HubError(f'{shown} does not exist: export the folder with `timm-ext export`')
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HubError(f'{shown} is not valid JSON ({first_line(e)}): export the folder again') from None
    if not isinstance(config, dict):
        raise HubError(f'{shown} must hold a JSON object, not {type(config).__name__}')
    for key, kind in (('architecture', str), ('num_classes', int), ('model_args', dict), ('pretrained_cfg', dict)):
        if not isinstance(config.get(key), kind):
            raise HubError(f'{shown} needs {key!r} ({kind.__name__}); export the folder with `timm-ext export`')
    arch = get_arch_name(config['architecture'])
    if not is_model(arch):
        raise HubError(unknown_architecture(config['architecture'], shown))
    unknown = sorted(set(config['pretrained_cfg']) - set(CFG_FIELDS))
    if unknown:
        raise HubError(f'{shown}: pretrained_cfg key {unknown[0]!r} is not a field of timm {timm.__version__}\'s '
                       f'PretrainedCfg; remove it')
    return config


def _safetensors_shapes(path: Path, shown: Path) -> Dict[str, Tuple[int, ...]]:
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework='pt') as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # SafetensorError: bad header, truncated data
        raise HubError(f'{shown} is not a readable safetensors file ({first_line(e)}): it is truncated or corrupt; '
                       f'export or download it again') from None


def _rebuilt_shapes(config: Dict[str, Any], shown: Path) -> Dict[str, Tuple[int, ...]]:
    # what timm does for local-dir:/hf-hub: (the top-level num_classes wins), on the meta device
    pretrained_cfg = dict(config['pretrained_cfg'], num_classes=config['num_classes'])
    try:
        model = timm.create_model(config['architecture'], pretrained=False, pretrained_cfg=pretrained_cfg,
                                  device='meta', **config['model_args'])
    except Exception as e:
        raise HubError(f'{shown}: {config["architecture"]} cannot be built with model_args {config["model_args"]} '
                       f'({first_line(e)})') from None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _compare(shapes: Dict[str, Tuple[int, ...]], expected: Dict[str, Tuple[int, ...]], shown: Path,
             config: Dict[str, Any]) -> None:
    rebuilt = f'{config["architecture"]}(**{config["model_args"]})'
    fix = ('model_args in config.json must be the arguments the model was created with (export(..., model_args=...) '
           'or --model-kwargs; timm < 1.0.31 does not record them)')
    for key, shape in expected.items():
        if key not in shapes:
            raise HubError(f'{shown} has no {key} for {rebuilt}: {fix}')
        if shapes[key] != shape:
            raise HubError(f'{shown}: {key} is {shapes[key]} in the file but {shape} in {rebuilt}: {fix}')
    extra = [k for k in shapes if k not in expected]
    if extra:
        raise HubError(f'{shown} holds {len(extra)} tensors {rebuilt} does not have (first: {extra[0]}): {fix}')

