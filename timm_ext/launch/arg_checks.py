"""Problems of a whole train.py / validate.py command line (recipe + arguments), each one line with its fix.

They run on the namespace the script itself parses (:func:`timm_ext.launch.preflight.script_args`: the
recipe through ``set_defaults``, then ``parse_args``), so what is checked is what the child sees:

* ``--device cuda`` (the scripts' default) where CUDA is not available;
* an opt name timm's factory would not build as SAM, and ``bce_loss`` that train.py would ignore
  (the rules of :mod:`timm_ext.recipes.checks`, on the merged values);
* an ImageFolder whose class count differs from the number of classes the model will have
  (train.py keeps the model's default, usually 1000, when ``--num-classes`` is not given);
* a baseline ``--opt adamw`` over a SAM recipe whose ``opt_kwargs`` still carry SAM's ``rho``;
* for validate.py: a ``--checkpoint`` that does not exist.

Arguments the script itself would reject are left to it (it prints its own usage error).
"""
import argparse
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from timm_ext.launch.preflight import script_args, split_folder
from timm_ext.recipes.checks import (
    _SAM_ONLY_KEYS,
    is_sam_optimizer,
    loss_problems,
    opt_kwargs_problems,
    opt_name_problems,
    optimizer_arguments,
)

__all__ = ['check_train_args', 'check_validate_args', 'output_problems', 'train_args_problems',
           'validate_args_problems']

_IMAGE_FOLDER_DATASETS = ('', 'folder', 'image_folder')


def check_train_args(
        parser: argparse.ArgumentParser,
        argv: Sequence[str],
        config: Optional[Dict[str, Any]] = None,
        cuda_available: Optional[bool] = None,
) -> List[str]:
    """Problems of a whole train.py command line (``config``, the recipe, under the arguments ``argv``)."""
    args = script_args(parser, argv, config)
    return [] if args is None else train_args_problems(args, config, cuda_available)


def train_args_problems(
        args: argparse.Namespace, config: Optional[Dict[str, Any]] = None, cuda_available: Optional[bool] = None,
) -> List[str]:
    """:func:`check_train_args` on the namespace train.py parses (from :func:`script_args`)."""
    problems = []
    leftover: List[str] = []
    recipe_opt = (config or {}).get('opt')
    if isinstance(recipe_opt, str) and is_sam_optimizer(recipe_opt) and not is_sam_optimizer(args.opt):
        leftover = _leftover_sam_kwargs(args.opt, args.opt_kwargs or {})
    if isinstance(args.opt, str):
        problems += opt_name_problems(args.opt)
        problems += _opt_kwargs_twice(args)
        own = {k: v for k, v in (args.opt_kwargs or {}).items() if k not in leftover}  # those get the line below
        problems += opt_kwargs_problems(args.opt, own)
    problems += _device_problems(args.device, cuda_available)
    problems += output_problems(args)
    problems += loss_problems(lambda k: getattr(args, k, None))
    problems += _class_count_problems(args)
    if leftover:
        problems.append(
            f'--opt {args.opt} replaces the recipe\'s SAM optimizer {recipe_opt!r}, but opt_kwargs still carry '
            f'SAM\'s {", ".join(leftover)}, which {args.opt} does not take: give the baseline its own '
            f'--opt-kwargs (a bare `--opt-kwargs` clears them; train.py\'s --clip-grad clips)')
    return list(dict.fromkeys(problems))


def output_problems(args: argparse.Namespace) -> List[str]:
    """train.py's output folder (``--output``, default ./output/train, and ``--experiment`` in it) must be a folder
    it can create: a file in the way is ``NotADirectoryError``, a folder it cannot write ``PermissionError``,
    both only after the model and data are built. Probed by making and removing a folder where train.py would."""
    import tempfile

    base = Path(args.output or './output/train').expanduser()
    target = base / args.experiment if getattr(args, 'experiment', '') else base
    flag = f'--output {args.output}' if args.output else '--output (train.py\'s default ./output/train)'
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f'{flag}: {existing} is a file, so train.py cannot make its output folder {target} there: '
                f'choose another --output or --experiment']
    try:
        os.rmdir(tempfile.mkdtemp(prefix='.timm-ext-probe-', dir=existing))
    except OSError as e:
        return [f'{flag}: train.py cannot create folders in {existing} ({e.strerror}): choose another --output']
    return []


def _opt_kwargs_twice(args: argparse.Namespace) -> List[str]:
    """train.py calls ``create_optimizer_v2(model, **optimizer_kwargs(cfg=args), **args.opt_kwargs)``: a key in both
    is a TypeError (``got multiple values for keyword argument``)."""
    from timm.optim import optimizer_kwargs

    try:
        own = optimizer_kwargs(cfg=args)
    except Exception:  # a namespace train.py would not build: the other checks name it
        return []
    return [f'opt_kwargs key {key!r} is also train.py\'s --{key.replace("_", "-")} (train.py passes both and stops '
            f'with TypeError): set it with --{key.replace("_", "-")} (a recipe: `{key}:` at the top level)'
            for key in (args.opt_kwargs or {}) if key in own]


def _leftover_sam_kwargs(opt: str, opt_kwargs: Dict[str, Any]) -> List[str]:
    """The SAM-family settings in ``opt_kwargs`` that the plain optimizer ``opt`` has no argument for."""
    takes = optimizer_arguments(opt) or frozenset()
    return [k for k in _SAM_ONLY_KEYS if k in opt_kwargs and k not in takes]


def check_validate_args(
        parser: argparse.ArgumentParser, argv: Sequence[str], cuda_available: Optional[bool] = None) -> List[str]:
    """Problems of a validate.py command line: a checkpoint that does not exist, CUDA that is not there."""
    args = script_args(parser, argv)
    return [] if args is None else validate_args_problems(args, cuda_available)


def validate_args_problems(args: argparse.Namespace, cuda_available: Optional[bool] = None) -> List[str]:
    """:func:`check_validate_args` on the namespace validate.py parses (from :func:`script_args`)."""
    problems = []
    if args.checkpoint and not Path(args.checkpoint).expanduser().exists():  # a folder: validate.py reads each
        problems.append(f'checkpoint {args.checkpoint!r} does not exist')
    return problems + _device_problems(args.device, cuda_available)


def _device_problems(device: Any, cuda_available: Optional[bool]) -> List[str]:
    if str(device).split(':')[0] != 'cuda':
        return []
    if cuda_available is None:
        import torch
        cuda_available = torch.cuda.is_available()
    if cuda_available:
        return []
    return [f'--device is {device!r} but CUDA is not available here (timm\'s scripts default to cuda): '
            f'add --device cpu']


def _class_count_problems(args: argparse.Namespace) -> List[str]:
    """An ImageFolder's class count against the classes the model will have."""
    root = args.data_dir or getattr(args, 'data', None)
    if not root or args.class_map or str(args.dataset).lower() not in _IMAGE_FOLDER_DATASETS:
        return []
    split = split_folder(root, args.train_split) if os.path.isdir(root) else None
    if split is None or not split.folder.is_dir() or (split.fallback and split.other_splits):
        return []  # no folder, or no folder of the split (timm_ext.launch.preflight reports that)
    train_root = split.folder
    classes = [p for p in train_root.iterdir() if p.is_dir() and not p.name.startswith('.')]
    if not classes:
        return []
    num_classes = args.num_classes
    given = num_classes is not None
    if not given:
        num_classes = _model_num_classes(args.model, args.model_kwargs or {})
        if num_classes is None:
            return []
    if len(classes) == num_classes:
        return []
    what = f'--num-classes is {num_classes}' if given else (
        f'--num-classes is not given, so train.py keeps the model\'s default of {num_classes}')
    return [f'the ImageFolder {train_root} has {len(classes)} classes but {what}: add --num-classes {len(classes)}']


def _model_num_classes(model: str, model_kwargs: Dict[str, Any]) -> Optional[int]:
    """The classes ``model`` has by default (built on the meta device: no memory, no weights)."""
    import timm
    import torch

    import timm_ext  # noqa: F401  (registers timm-ext's models)
    try:
        with torch.device('meta'):
            return int(timm.create_model(model, pretrained=False, **model_kwargs).num_classes)
    except Exception:  # an unknown model or bad kwargs: train.py reports those itself
        return None
