"""Every check of a train.py / validate.py command line before timm's script starts: the one home of them.

A mistake that reaches train.py ends in a traceback, or worse, in a run that trains nothing and reports
success. Each check here is one function that returns its problems, one line each, naming the bad value and
the fix; :func:`check_train_command` and :func:`check_validate_command` run them all, in order, on the
namespace the script itself parses (:func:`~timm_ext.launch.timm_scripts.script_args`: the recipe through
``set_defaults``, then ``parse_args``), so what is checked is what the child sees. Adding a check: one function
here, one line in the entry point that runs it, and its test in ``tests/test_launch_command_checks.py``.

train.py:

* the recipe file's keys and values (:func:`timm_ext.recipes.check_recipe`, also ``timm-ext recipes check``);
* the optimizer: an opt name timm's factory would not build as SAM, ``opt_kwargs`` its optimizer does not
  take or that repeat train.py's own arguments, SAM settings its optimizer refuses (the optimizer's own checks),
  SAM settings left over under a baseline ``--opt``;
* ``--device cuda`` (the scripts' default) where CUDA is not available; an output folder train.py cannot make;
  ``--amp`` in float16 on the CPU (a warning: measured several times slower per step than fp32);
  ``bce_loss`` that train.py would ignore;
* an ImageFolder whose class count differs from the classes the model will have;
* a model name timm does not know once timm_ext and the ``device_modules`` are imported (with the closest
  names), or a ``device_modules`` entry that cannot be imported at all;
* an input size the model cannot take (a ViT built for 224 px at ``--img-size 32``, or built for 32 px by its
  ``model_kwargs`` and fed the 224 px of its pretrained cfg): built and run once on the meta device;
* the data of an ImageFolder: no ``--data-dir``, a folder that does not exist, a split folder that is missing
  (timm then reads the whole root, the other splits included), a split without images. ``torch/``, ``hfds/``,
  ``hfids/``, ``tfds/`` and ``wds/`` datasets are left to the script;
* an epoch without a step: fewer training images per process than the batch (the train loader drops the last
  partial batch), and ``aug_repeats`` on one process (timm's loader asserts);
* a packaged paper recipe run at another global batch than its paper's: refused with the fix, or, with
  ``allow_batch_change``, a one-line warning;
* ``--initial-checkpoint``: a file that is missing or that timm cannot read, or weights that the model train.py
  builds cannot take strictly: a head of another class count (fine-tuning goes through ``--pretrained
  --pretrained-path``) or another architecture (:mod:`timm_ext.launch.initial_checkpoint`);
* ``--resume``: a checkpoint of another model than ``--model``, or whose optimizer state belongs to another
  optimizer than this run's;
* DDP on the CPU with a train.py that passes ``device_ids`` (:func:`ddp_on_cpu_problems`: the one check that
  ``--no-check`` does not skip, since torch refuses such a run for certain).

validate.py: a ``--checkpoint`` that does not exist, CUDA, the model (or a pattern of pretrained models), the
``--import`` modules, and the data folder of its split.

Arguments the script itself would reject are left to it (it prints its own usage error).
"""
import argparse
import contextlib
import difflib
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from timm_ext.launch.global_batch import batch_splits, count_noun, lr_note, paper_row
from timm_ext.launch.image_folder import (
    SplitFolder,
    count_images,
    enough_images,
    image_extensions,
    images_per_process,
    is_folder_dataset,
    split_folder,
)
from timm_ext.launch.initial_checkpoint import initial_checkpoint_problems
from timm_ext.launch.input_size import input_size_problems, meta_model
from timm_ext.launch.timm_scripts import TimmScript, ddp_passes_device_ids, script_args
from timm_ext.recipes.checks import (
    SAM_ONLY_KEYS,
    check_recipe,
    is_sam_optimizer,
    loss_problems,
    opt_kwargs_problems,
    opt_name_problems,
    optimizer_arguments,
    sam_settings_problems,
)

__all__ = [
    'CheckResult', 'check_train_args', 'check_train_command', 'check_validate_args', 'check_validate_command',
    'ddp_on_cpu_problems',
]

_TAR = '.tar'
_IMAGE_FOLDER_DATASETS = ('', 'folder', 'image_folder')  # timm's names of its folder reader


@dataclass(frozen=True)
class CheckResult:
    """The outcome: ``problems`` stop the command, ``warnings`` let it run, ``notes`` say what it will do (one
    line each)."""
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


# --- the entry points --------------------------------------------------------------------------------

def check_train_command(
        parser: argparse.ArgumentParser,
        train_args: Sequence[str],
        recipe: Optional[Union[str, Path]] = None,
        config: Optional[Dict[str, Any]] = None,
        processes: int = 1,
        allow_batch_change: bool = False,
        script_dir: Optional[Union[str, Path]] = None,
        cuda_available: Optional[bool] = None,
) -> CheckResult:
    """Every check of a train.py command against train.py's ``parser``: ``recipe`` (its file, for a packaged
    paper recipe's global batch) with its values ``config``, under the arguments ``train_args``, on
    ``processes`` processes. ``script_dir``: train.py's folder, on ``sys.path`` while the device modules are
    imported (as it is in the child). Problems without repeats."""
    config = config or {}
    # the recipe's opt_kwargs are checked against the optimizer of the whole command (_optimizer_problems)
    problems = check_recipe(config, parser, opt_kwargs=False) if recipe is not None else []
    args = script_args(parser, train_args, config)
    if args is None:  # train.py prints its own usage error
        return CheckResult(_unique(problems))
    problems += _train_args_problems(args, config, cuda_available)
    modules = ['timm_ext', *_as_list(getattr(args, 'device_modules', None))]
    in_recipe = config.get('model') == args.model
    problems += _model_problems(args.model, modules, script_dir, in_recipe, '--device-modules', 'train.py')
    problems += input_size_problems(args, config)
    problems += initial_checkpoint_problems(args)
    problems += _train_data_problems(args, processes)
    problems += _aug_repeats_problems(args, config, processes)
    warnings = _cpu_amp_warnings(args)
    line = None if recipe is None else _global_batch_line(args, Path(recipe), config, processes, allow_batch_change)
    if line:
        (warnings if allow_batch_change else problems).append(line)
    refused, notes = _resume_problems(args)
    return CheckResult(_unique(problems + refused), warnings, notes)


def check_validate_command(
        parser: argparse.ArgumentParser,
        validate_args: Sequence[str],
        imports: Sequence[str] = (),
        script_dir: Optional[Union[str, Path]] = None,
        cuda_available: Optional[bool] = None,
) -> CheckResult:
    """Every check of a validate.py command against validate.py's ``parser``, ``imports`` imported first
    (checkpoint, CUDA, model, data)."""
    args = script_args(parser, validate_args)
    if args is None:  # validate.py prints its own usage error
        return CheckResult()
    problems = _validate_args_problems(args, cuda_available)
    model = str(args.model)
    checkpoint_dir = bool(args.checkpoint) and os.path.isdir(args.checkpoint)
    if checkpoint_dir or not _validate_bulk(model):  # one model; a folder of checkpoints uses it for each
        problems += _model_problems(model, ['timm_ext', *imports], script_dir, False, '--import', 'validate.py')
    else:
        problems += _import_problems(['timm_ext', *imports], script_dir, '--import', 'validate.py')
        problems += _pattern_problems(model)
    if is_folder_dataset(args.dataset):
        problems += _folder_problems(args.data or args.data_dir, [('--split', args.split)], 'validate.py',
                                     getattr(args, 'input_key', None))[0]
    return CheckResult(_unique(problems))


def check_train_args(
        parser: argparse.ArgumentParser,
        argv: Sequence[str],
        config: Optional[Dict[str, Any]] = None,
        cuda_available: Optional[bool] = None,
) -> List[str]:
    """The checks of train.py's arguments themselves (``config``, the recipe, under ``argv``): the optimizer, the
    device, the output folder, the loss, the class count; not the model, data, global batch or checkpoint."""
    args = script_args(parser, argv, config)
    return [] if args is None else _train_args_problems(args, config, cuda_available)


def check_validate_args(
        parser: argparse.ArgumentParser, argv: Sequence[str], cuda_available: Optional[bool] = None) -> List[str]:
    """The checks of validate.py's arguments themselves: a checkpoint that does not exist, CUDA that is not there."""
    args = script_args(parser, argv)
    return [] if args is None else _validate_args_problems(args, cuda_available)


def ddp_on_cpu_problems(args: Optional[argparse.Namespace], processes: int, script: TimmScript) -> List[str]:
    """Several processes on the CPU with a train.py that passes ``device_ids`` to DistributedDataParallel, which
    torch refuses for a CPU model. Not a guess, so ``--no-check`` does not skip it."""
    if processes <= 1 or args is None or str(args.device).split(':')[0] != 'cpu':
        return []
    if not ddp_passes_device_ids(script.path):
        return []
    return [f'train.py of {script.tag or "this version"} cannot run DDP on the CPU (it passes device_ids to '
            f'DistributedDataParallel, which torch refuses for a CPU model): drop --nproc-per-node or train on GPUs']


def _unique(problems: List[str]) -> List[str]:
    return list(dict.fromkeys(problems))


def _train_args_problems(
        args: argparse.Namespace, config: Optional[Dict[str, Any]], cuda_available: Optional[bool],
) -> List[str]:
    problems = _optimizer_problems(args, config or {})
    problems += _sam_setting_problems(args)
    problems += _device_problems(args.device, cuda_available)
    problems += _output_problems(args)
    problems += loss_problems(lambda k: getattr(args, k, None))
    problems += _class_count_problems(args)
    problems += _leftover_sam_problems(args, config or {})
    return _unique(problems)


def _validate_args_problems(args: argparse.Namespace, cuda_available: Optional[bool]) -> List[str]:
    return _checkpoint_problems(args.checkpoint) + _device_problems(args.device, cuda_available)


# --- the optimizer -----------------------------------------------------------------------------------

def _optimizer_problems(args: argparse.Namespace, config: Dict[str, Any]) -> List[str]:
    """The opt name (``sam_adamw``), ``opt_kwargs`` given twice, and ``opt_kwargs`` the optimizer does not take
    (less SAM's settings left over from the recipe: :func:`_leftover_sam_problems` names those)."""
    if not isinstance(args.opt, str):
        return []
    leftover = _leftover_sam_kwargs(args, config)
    own = {k: v for k, v in (args.opt_kwargs or {}).items() if k not in leftover}
    return opt_name_problems(args.opt) + _opt_kwargs_twice(args) + opt_kwargs_problems(args.opt, own)


def _sam_setting_problems(args: argparse.Namespace) -> List[str]:
    """A SAM setting out of range (``rho=-0.05``): train.py's factory refuses it only after the model and the data
    are built. The optimizer's own checks, as ``timm-ext recipes check`` runs them."""
    if not isinstance(args.opt, str) or not isinstance(args.opt_kwargs or {}, dict):
        return []
    return sam_settings_problems(args.opt, args.opt_kwargs or {})


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


def _leftover_sam_kwargs(args: argparse.Namespace, config: Dict[str, Any]) -> List[str]:
    """The SAM-family settings in ``opt_kwargs`` that a plain ``--opt`` over a SAM recipe has no argument for."""
    recipe_opt = config.get('opt')
    if not (isinstance(recipe_opt, str) and is_sam_optimizer(recipe_opt) and not is_sam_optimizer(args.opt)):
        return []
    takes = optimizer_arguments(args.opt) or frozenset()
    return [k for k in SAM_ONLY_KEYS if k in (args.opt_kwargs or {}) and k not in takes]


def _leftover_sam_problems(args: argparse.Namespace, config: Dict[str, Any]) -> List[str]:
    """A baseline ``--opt adamw`` over a SAM recipe whose ``opt_kwargs`` still carry SAM's ``rho``."""
    leftover = _leftover_sam_kwargs(args, config)
    if not leftover:
        return []
    return [f'--opt {args.opt} replaces the recipe\'s SAM optimizer {config["opt"]!r}, but opt_kwargs still carry '
            f'SAM\'s {", ".join(leftover)}, which {args.opt} does not take: give the baseline its own --opt-kwargs '
            f'(a bare `--opt-kwargs` clears them; train.py\'s --clip-grad clips)']


# --- the device, the output folder, the checkpoint ---------------------------------------------------

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


def _output_problems(args: argparse.Namespace) -> List[str]:
    """train.py's output folder (``--output``, default ./output/train, and ``--experiment`` in it) must be a folder
    it can create: a file in the way is ``NotADirectoryError``, a folder it cannot write ``PermissionError``,
    both only after the model and data are built. Probed by making and removing a folder where train.py would."""
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


def _checkpoint_problems(checkpoint: Any) -> List[str]:
    if checkpoint and not Path(checkpoint).expanduser().exists():  # a folder: validate.py reads each
        return [f'checkpoint {checkpoint!r} does not exist']
    return []


# autocast on the CPU: time per samadamw step against fp32, measured side by side by benchmarks/bench_amp_cpu.py
# (batch 8 at 64 px, one thread, torch 2.14.1; docs/sam.md, training features); the CPU as lscpu names it
CPU_AMP_MEASURED = {'cpu': 'Intel(R) Xeon(R) Processor', 'float16': {'vit_tiny_patch16_224': 4.0, 'resnet18': 103.0},
                    'bfloat16': {'vit_tiny_patch16_224': 1.26, 'resnet18': 0.91}}


def _cpu_amp_warnings(args: argparse.Namespace) -> List[str]:
    """``--amp`` in float16 (train.py's default ``--amp-dtype``) on the CPU: train.py autocasts there without a loss
    scaler, and CPU kernels run fp16 far slower than fp32. A warning, not a refusal: the run works, only slowly."""
    if not getattr(args, 'amp', False) or str(getattr(args, 'device', '')).split(':')[0] != 'cpu' or \
            getattr(args, 'amp_dtype', 'float16') != 'float16':
        return []
    fp16, bf16 = CPU_AMP_MEASURED['float16'], CPU_AMP_MEASURED['bfloat16']
    slower = ' to '.join(f'{fp16[m]:g}x ({m})' for m in fp16)
    return [f'--amp on the CPU: train.py autocasts to float16 (--amp-dtype float16, its default), measured {slower} '
            f'slower per SAM step than fp32 on {CPU_AMP_MEASURED["cpu"]} (benchmarks/bench_amp_cpu.py): drop '
            f'--amp, or use --amp-dtype bfloat16 ({" and ".join(f"{bf16[m]:g}x" for m in bf16)} there)']


# --- the model and the modules imported before the script starts --------------------------------------

def _class_count_problems(args: argparse.Namespace) -> List[str]:
    """An ImageFolder's class count against the classes the model will have (train.py keeps the model's
    default, usually 1000, when ``--num-classes`` is not given)."""
    root = args.data_dir or getattr(args, 'data', None)
    if not root or args.class_map or str(args.dataset).lower() not in _IMAGE_FOLDER_DATASETS:
        return []
    split = split_folder(root, args.train_split) if os.path.isdir(root) else None
    if split is None or not split.folder.is_dir() or (split.fallback and split.other_splits):
        return []  # no folder, or no folder of the split (_train_data_problems reports that)
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
    built = meta_model(model, model_kwargs)
    return None if built is None else int(built.num_classes)


def _model_problems(
        model: Any, modules: Sequence[str], script_dir: Optional[Union[str, Path]], in_recipe: bool, option: str,
        script: str,
) -> List[str]:
    """A model name that timm's registry does not hold once ``modules`` are imported, with the closest names."""
    problems = _import_problems(modules, script_dir, option, script)
    name = str(model)
    if problems or any(c in name for c in ('/', '\\', ':')):  # hf-hub:, local-dir:, paths: timm's own messages
        return problems
    import timm

    if timm.is_model(name):
        return []
    arch = name.split('.')[0]
    close = difflib.get_close_matches(arch, timm.list_models(), n=3, cutoff=0.6)
    what = f'model {name!r} of the recipe' if in_recipe else f'--model {name!r}'
    hint = f'did you mean {", ".join(close)}?' if close else '`timm-ext models` and timm.list_models() list the names'
    imported = ', '.join(dict.fromkeys(modules))
    return [f'{what} is unknown to timm (with {imported} imported): {hint}']


def _import_problems(
        modules: Sequence[str], script_dir: Optional[Union[str, Path]], option: str, script: str) -> List[str]:
    """Modules the script imports before it starts (train.py's --device-modules, validate's --import)."""
    problems = []
    with _on_path(script_dir):
        for module in dict.fromkeys(modules):
            try:
                importlib.import_module(module)
            except Exception as e:  # whatever the import raises, the script would raise it too
                problems.append(f'{option} {module!r} cannot be imported ({type(e).__name__}: {e}): {script} '
                                f'imports it before it starts; install it or drop it')
    return problems


@contextlib.contextmanager
def _on_path(folder: Optional[Union[str, Path]]) -> Iterator[None]:
    """``folder`` on ``sys.path`` meanwhile, as the script's own folder is for ``python SCRIPT``."""
    if folder is None or str(folder) in sys.path:
        yield
        return
    sys.path.append(str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


def _pattern_problems(model: str) -> List[str]:
    """validate.py reads a --model pattern as the pretrained models it matches; none: it validates the pattern."""
    import timm

    if model == 'all' or os.path.isfile(model) or timm.list_models(model, pretrained=True):
        return []
    return [f'--model {model!r} matches no pretrained timm model (validate.py reads a pattern as the pretrained models '
            f'to validate): see `timm.list_models({model!r}, pretrained=True)`, or name one model']


def _validate_bulk(model: str) -> bool:
    """validate.py's other readings of --model: ``all``, a pattern of pretrained models, a file of names."""
    return model == 'all' or any(c in model for c in '*?[') or os.path.isfile(model)


# --- the data and the steps of an epoch ----------------------------------------------------------------

def _train_data_problems(args: argparse.Namespace, processes: int) -> List[str]:
    """train.py's ImageFolder (its train and validation splits), then the steps of an epoch on it."""
    if not is_folder_dataset(args.dataset):
        return []
    splits = [('--train-split', args.train_split)] + ([('--val-split', args.val_split)] if args.val_split else [])
    problems, train = _folder_problems(args.data_dir or args.data, splits, 'train.py', getattr(args, 'input_key', None))
    if train is not None and not problems:
        problems += _step_problems(train, args, processes)
    return problems


def _folder_problems(
        root: Any, splits: Sequence[Tuple[str, str]], script: str, input_key: Optional[str],
) -> Tuple[List[str], Optional[Path]]:
    """Problems of an ImageFolder (or .tar) dataset at ``root`` for ``splits`` ((option, split name) pairs), and
    the folder the first split reads (for the step count)."""
    layout = ' and '.join(f'DIR/{split.split("[")[0]}/<class>/<image>' for _, split in splits)
    if not root:
        return [f'no --data-dir: {script} reads an ImageFolder, add --data-dir DIR with {layout} '
                f'({", ".join(sorted(image_extensions(input_key)))})'], None
    path = Path(root)  # as the script opens it (a quoted ~ stays a ~)
    layout = layout.replace('DIR/', f'{root}/')
    if not path.exists():
        return [f'--data-dir {root} does not exist: it should be an ImageFolder, {layout}'], None
    if path.is_file():
        if path.suffix == _TAR:  # timm's tar reader: its members are not counted here
            return [], None
        return [f'--data-dir {root} is a file: it should be a folder (an ImageFolder, {layout}) or a .tar of '
                f'images'], None
    problems: List[str] = []
    for option, split in splits:
        where = split_folder(path, split)
        if where.fallback and where.other_splits:
            problems.append(_missing_split(root, option, split, where, script))
        elif count_images(where.folder, 1, input_key) == 0:
            problems.append(_no_images(root, option, split, where, input_key))
    first = split_folder(path, splits[0][1]).folder
    return problems, first


def _missing_split(root: Any, option: str, split: str, where: SplitFolder, script: str) -> str:
    name = where.looked_for[0]
    others = ', '.join(f'{s}/' for s in where.other_splits)
    line = (f'--data-dir {root} has no folder for {option} {split} (looked for {", ".join(where.looked_for)}) but has '
            f'{others}: {script} would read all of {root}, {others} included; add {root}/{name}/<class>/<image>')
    if option == '--val-split':
        return f'{line}, or pass --val-split \'\' to train without validation'
    return line if option == '--train-split' else f'{line}, or name its folder with --split'


def _no_images(root: Any, option: str, split: str, where: SplitFolder, input_key: Optional[str]) -> str:
    kinds = ', '.join(sorted(image_extensions(input_key)))
    if where.fallback:
        return (f'--data-dir {root} has no images ({kinds}) and no folder for {option} {split}: it should hold '
                f'{root}/{where.looked_for[0]}/<class>/<image>')
    return f'{where.folder} ({option} {split}) has no images ({kinds}): it should hold {where.folder}/<class>/<image>'


def _step_problems(train: Path, args: argparse.Namespace, processes: int) -> List[str]:
    """No step in an epoch: the train loader drops the last partial batch (``drop_last`` when training)."""
    batch = args.batch_size
    if batch < 1:
        return [f'--batch-size {batch}: the batch must hold at least 1 image']
    if getattr(args, 'naflex_loader', False):  # NaFlex batches by sequence length, not by --batch-size
        return []
    limit = enough_images(batch, processes, args.aug_repeats)
    images = count_images(train, limit, getattr(args, 'input_key', None))
    share = images_per_process(images, processes, args.aug_repeats)
    if share >= batch:
        return []
    what = f'{count_noun(images, "training image")} in {train}'
    if processes > 1:
        what += f' over {processes} processes are {share} per process'
    fixes = ([f'--batch-size {share} or less'] if share else []) + (['fewer processes'] if processes > 1 else [])
    fix = f'{", ".join(fixes)}, or more images' if fixes else 'more images'
    return [f'{what}, fewer than --batch-size {batch}: train.py drops the last partial batch, so an epoch would '
            f'take no step; use {fix}']


def _aug_repeats_problems(args: argparse.Namespace, config: Dict[str, Any], processes: int) -> List[str]:
    """Repeated augmentation on one process: timm's loader asserts."""
    if processes != 1 or not args.aug_repeats:
        return []
    what = ' of the recipe' if config.get('aug_repeats') == args.aug_repeats else ''
    return [f'aug_repeats {args.aug_repeats:g}{what} (repeated augmentation) needs several processes: timm\'s loader '
            f'asserts on one; run --nproc-per-node N on N GPUs, or pass --aug-repeats 0']


# --- the global batch of a paper recipe ----------------------------------------------------------------

def _global_batch_line(
        args: argparse.Namespace, recipe: Path, config: Dict[str, Any], processes: int, allow: bool,
) -> Optional[str]:
    """A packaged paper recipe at another global batch than its paper's: the numbers, the fix, and the lr."""
    row = paper_row(recipe)
    if row is None:
        return None
    batch, accum, want = args.batch_size, max(1, args.grad_accum_steps), row.global_batch
    given = batch * processes * accum
    if given == want:
        return None
    head = (f'recipe {row.name} trains at global batch {want} ({row.paper} {row.table}), this command at {batch} x '
            f'{count_noun(processes, "process", "es")} x {count_noun(accum, "accumulation step")} = {given}')
    lr = lr_note(args, given)
    if allow:
        return f'{head} (--allow-batch-change; {lr})'
    own = (batch, accum) == (config.get('batch_size'), max(1, config.get('grad_accum_steps') or 1))
    fixes = _batch_fixes(batch, processes, accum, want, own)
    fix = f'add {fixes}, or pass' if fixes else 'pass'
    return f'{head}: {fix} --allow-batch-change to train at {given} ({lr})'


def _batch_fixes(batch: int, processes: int, accum: int, want: int, recipe_batch: bool) -> str:
    """Arguments that give the global batch ``want``: the split with the largest per-process batch no larger than
    now (:func:`~timm_ext.launch.global_batch.batch_splits`), or, at the recipe's own per-process batch
    (``recipe_batch``), the process count the recipe assumes."""
    fixes = []
    split = next(((b, steps) for b, steps in batch_splits(want, processes) if b <= batch), None)
    if split is not None:
        per, steps = split
        fixes.append(' '.join(([f'--batch-size {per}'] if per != batch else []) + (
            [f'--grad-accum-steps {steps}'] if steps != accum else [])))
    if recipe_batch and batch >= 1 and want % (batch * accum) == 0 and want // (batch * accum) != processes:
        nproc = want // (batch * accum)
        fixes.append(f'--nproc-per-node {nproc} on {nproc} GPUs')
    return ' or '.join(f for f in fixes if f)


# --- --resume ------------------------------------------------------------------------------------------

def _resume_problems(args: argparse.Namespace) -> Tuple[List[str], List[str]]:
    """(problems, notes) of ``--resume``: train.py loads the checkpoint's optimizer state into whatever optimizer
    this run builds (AdamW's moments into SAM's base, SAM's into plain AdamW) and says nothing. The checkpoint is
    read (weights-only) first; a mismatch is refused unless ``--no-resume-opt`` (train.py's own flag: the
    weights load, the optimizer starts fresh). A checkpoint of another architecture than ``--model`` (its ``arch``,
    else its run's args.yaml) whose weights that model cannot take (built on the meta device) is refused first:
    train.py would build the model, then fail to load the weights."""
    path = getattr(args, 'resume', '')
    if not path:
        return [], []
    from timm_ext.hub import HubError, load_checkpoint

    try:
        ckpt = load_checkpoint(path)
    except HubError as e:
        return [f'--resume: {e}'], []
    arch = _checkpoint_arch(ckpt)
    if arch and isinstance(args.model, str) and _arch_name(arch) != _arch_name(args.model) and \
            not _fits(ckpt, arch, args):
        return [f'--resume {path} holds the weights of {arch}, and this run builds --model {args.model}: train.py '
                f'would build {args.model}, then stop in load_state_dict (missing and unexpected keys); resume with '
                f'--model {arch}, or drop --resume to train {args.model} from scratch'], []
    saved_opt = ckpt.train_args.get('opt')
    epoch = f', epoch {ckpt.epoch}: train.py continues at epoch {ckpt.epoch + 1}' if ckpt.epoch is not None else ''
    if args.no_resume_opt or ckpt.optimizer_is_sam is None or not isinstance(saved_opt, str):
        state = 'no optimizer state' if ckpt.optimizer_is_sam is None else (
            'its optimizer state is not loaded (--no-resume-opt)' if args.no_resume_opt else 'an optimizer state')
        return [], [f'--resume {path}: weights of {ckpt.arch or "the model"}, {state}{epoch}']
    saved_sam, this_sam = ckpt.optimizer_is_sam, is_sam_optimizer(args.opt)
    if saved_sam != this_sam or _factory_name(saved_opt) != _factory_name(args.opt):
        kind = 'SAM' if saved_sam else 'plain'
        return [f'--resume {path} holds the state of {saved_opt} ({kind}), and this run builds '
                f'{_optimizer_label(args.opt)}: train.py would load one optimizer\'s state into the other; resume '
                f'with --opt {saved_opt}, or add --no-resume-opt to load the weights and start the optimizer '
                f'fresh'], []
    return [], [f'--resume {path}: weights and the state of {_optimizer_label(saved_opt)}{epoch}']


def _checkpoint_arch(ckpt: Any) -> Optional[str]:
    """The model a checkpoint holds: its ``arch`` (train.py saves its ``--model`` there), its saved arguments' model,
    else the ``model`` of the run's args.yaml beside it; None when nothing names it."""
    arch = ckpt.arch or ckpt.train_args.get('model')
    if isinstance(arch, str) and arch:
        return arch
    yaml_file = Path(ckpt.path).parent / 'args.yaml'
    if not yaml_file.is_file():
        return None
    import yaml

    try:
        loaded = yaml.safe_load(yaml_file.read_text())
    except (OSError, yaml.YAMLError):
        return None
    model = loaded.get('model') if isinstance(loaded, dict) else None
    return model if isinstance(model, str) and model else None


def _fits(ckpt: Any, arch: str, args: argparse.Namespace) -> bool:
    """Whether ``--model`` as train.py builds it (on the meta device) takes the checkpoint's weights, key for key
    and shape for shape (another name for the same layout, e.g. a deprecated alias, resumes fine)."""
    from timm_ext.launch.from_run import RunSettings, fit_problem
    from timm_ext.launch.input_size import train_model_kwargs

    kwargs = train_model_kwargs(args)
    if kwargs is None:
        return False
    shapes = {k: tuple(v.shape) for k, v in ckpt.state_dict.items()}
    run = RunSettings(Path(ckpt.path), arch, ckpt.train_args, 'resume', shapes)
    return fit_problem(run, args.model, {k: v for k, v in kwargs.items() if v is not None}, {}) is None


def _arch_name(model: str) -> str:
    """The architecture of a timm model name (a pretrained tag does not change the weights' layout); names read
    elsewhere (``hf-hub:``, ``local-dir:``, paths) are kept whole."""
    return model if any(c in model for c in '/\\:') else model.split('.')[0]


def _optimizer_label(opt: str) -> str:
    """``opt`` as timm's factory reads it, with its kind: ``samadamw (SAM)``, ``adamw (plain)``."""
    return f'{opt} ({"SAM" if is_sam_optimizer(opt) else "plain"})'


def _factory_name(opt: str) -> str:
    return str(opt).lower().split('_')[-1]  # timm's factory reads the text after the last underscore


def _as_list(value: Any) -> List[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
