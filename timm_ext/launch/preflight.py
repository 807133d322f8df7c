"""What timm-ext can know before timm's train.py (or validate.py) starts, read the way the script will read it.

A mistake that reaches train.py ends in a traceback, or worse, in a run that trains nothing and
reports success. These checks run on the namespace train.py itself would parse (:func:`script_args`:
a copy of the script's parser, the recipe through ``set_defaults``, then ``parse_args``), and each
problem is one line that names the value and the fix:

* a model name timm does not know once timm_ext and the ``device_modules`` are imported (with the
  closest names), or a ``device_modules`` entry that cannot be imported at all;
* the data of an ImageFolder: no ``--data-dir``, a folder that does not exist, a split folder that is
  missing (timm then reads the whole root, the other splits included), a split without images.
  ``torch/``, ``hfds/``, ``hfids/``, ``tfds/`` and ``wds/`` datasets are left to the script;
* an epoch without a step: fewer training images per process than the batch (the train loader drops
  the last partial batch), and ``aug_repeats`` on one process (timm's loader asserts);
* a packaged paper recipe run at another global batch (batch x processes x accumulation steps) than
  its paper's: refused with the fix, or, with ``allow_batch_change``, a one-line warning.
"""
import argparse
import contextlib
import copy
import difflib
import functools
import importlib
import io
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from timm_ext._timm_compat import eval_split_synonyms, search_split, train_split_synonyms
from timm_ext.recipes import PaperRow, load_paper_values, packaged_row, recipes_dir

__all__ = [
    'Preflight', 'SplitFolder', 'check_train', 'check_validate', 'count_images', 'count_noun', 'images_per_process',
    'lr_note', 'paper_row', 'script_args', 'split_folder',
]

# dataset prefixes whose data the script's own readers find (torchvision, Hugging Face, TFDS, WebDataset)
_READER_PREFIXES = ('torch', 'hfds', 'hfids', 'tfds', 'wds')
_TAR = '.tar'


@dataclass(frozen=True)
class Preflight:
    """The outcome: ``problems`` stop the command (one line each), ``warnings`` let it run (one line each)."""
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class SplitFolder:
    """Where timm's folder reader looks for a split: ``folder``, or the root itself when no split folder exists."""
    folder: Path
    looked_for: Tuple[str, ...]  # the folder names timm tries, in order
    fallback: bool  # no folder of the split: the reader scans the whole root
    other_splits: Tuple[str, ...]  # split folders the root does have (read too when ``fallback``)


def script_args(
        parser: argparse.ArgumentParser, argv: Sequence[str], config: Optional[Dict[str, Any]] = None,
) -> Optional[argparse.Namespace]:
    """The namespace timm's script parses: ``set_defaults(**recipe)`` then ``parse_args(argv)``, as train.py's
    ``_parse_args`` does (string values converted by each argument's type). ``parser`` is left as it was (a copy
    is parsed); None when the script would reject ``argv`` (it prints its own usage error then)."""
    parser = copy.deepcopy(parser)
    if config:
        parser.set_defaults(**config)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(list(argv))
    except SystemExit:
        return None


def check_train(
        args: argparse.Namespace,
        recipe: Optional[Union[str, Path]] = None,
        processes: int = 1,
        allow_batch_change: bool = False,
        script_dir: Optional[Union[str, Path]] = None,
        config: Optional[Dict[str, Any]] = None,
) -> Preflight:
    """Problems of a train.py run with ``args`` (from :func:`script_args`) on ``processes`` processes.

    ``recipe``: the recipe file, for the global batch of a packaged paper recipe; ``config``: its values (a
    model named there is called the recipe's). ``script_dir``: train.py's folder, on ``sys.path`` while the
    device modules are imported (as it is in the child).
    """
    modules = ['timm_ext', *_as_list(getattr(args, 'device_modules', None))]
    in_recipe = (config or {}).get('model') == args.model
    problems = _model_problems(args.model, modules, script_dir, in_recipe, '--device-modules', 'train.py')
    root = args.data_dir or args.data
    if _is_folder_dataset(args.dataset):
        splits = [('--train-split', args.train_split)] + ([('--val-split', args.val_split)] if args.val_split else [])
        data, train = _folder_problems(root, splits, 'train.py', getattr(args, 'input_key', None))
        problems += data
        if train is not None and not data:
            problems += _step_problems(train, args, processes)
    if processes == 1 and args.aug_repeats:
        what = ' of the recipe' if (config or {}).get('aug_repeats') == args.aug_repeats else ''
        problems.append(f'aug_repeats {args.aug_repeats:g}{what} (repeated augmentation) needs several processes: '
                        f'timm\'s loader asserts on one; run --nproc-per-node N on N GPUs, or pass --aug-repeats 0')
    warnings: List[str] = []
    if recipe is not None:
        line = _global_batch_line(args, Path(recipe), config or {}, processes, allow_batch_change)
        if line:
            (warnings if allow_batch_change else problems).append(line)
    return Preflight(problems, warnings)


def check_validate(
        args: argparse.Namespace,
        imports: Sequence[str] = (),
        script_dir: Optional[Union[str, Path]] = None,
) -> Preflight:
    """Problems of a validate.py run with ``args`` (from :func:`script_args`), ``imports`` imported first."""
    model = str(args.model)
    checkpoint_dir = bool(args.checkpoint) and os.path.isdir(args.checkpoint)
    if checkpoint_dir or not _validate_bulk(model):  # one model; a folder of checkpoints uses it for each
        problems = _model_problems(model, ['timm_ext', *imports], script_dir, False, '--import', 'validate.py')
    else:
        problems = _import_problems(['timm_ext', *imports], script_dir, '--import', 'validate.py')
        problems += _pattern_problems(model)
    if _is_folder_dataset(args.dataset):
        problems += _folder_problems(args.data or args.data_dir, [('--split', args.split)], 'validate.py',
                                     getattr(args, 'input_key', None))[0]
    return Preflight(problems)


def split_folder(root: Union[str, Path], split: str) -> SplitFolder:
    """The folder timm's dataset factory reads for ``split`` under ``root`` (its ``_search_split``: the split's
    name, then its synonyms, ``validation`` -> ``val``, ``valid``, ``eval``, ...; else the root itself)."""
    root = Path(root)
    name = split.split('[')[0]
    train, evaluation = train_split_synonyms(), eval_split_synonyms()
    synonyms = train if name in train else evaluation if name in evaluation else ()
    folder = Path(search_split(str(root), split))
    fallback = bool(name) and os.path.normpath(folder) == os.path.normpath(root)
    others = tuple(s for s in (*train, *evaluation) if fallback and (root / s).exists())
    return SplitFolder(folder, tuple(dict.fromkeys([name, *synonyms])), fallback, others)


def count_images(folder: Union[str, Path], limit: Optional[int] = None, input_key: Optional[str] = None) -> int:
    """Image files under ``folder`` as timm's ImageFolder reader finds them (its extensions, or ``input_key``'s
    ``;``-separated ones); stops at ``limit`` (ImageNet's 1.28M files need not all be seen)."""
    extensions = _extensions(input_key)
    count = 0
    for _, _, files in os.walk(folder, followlinks=True):
        count += sum(os.path.splitext(f)[1].lower() in extensions for f in files)
        if limit is not None and count >= limit:
            return limit
    return count


def images_per_process(images: int, processes: int = 1, aug_repeats: float = 0) -> int:
    """Training images one process sees per epoch: all on one process; ``DistributedSampler``'s share
    (rounded up: it pads) on several, or ``RepeatAugSampler``'s (whole multiples of 256 images) with
    ``aug_repeats``."""
    if processes <= 1:
        return images
    if not aug_repeats:
        return math.ceil(images / processes)
    selected = images // 256 * 256 // processes if images >= 256 else math.ceil(images / processes)
    return min(selected, math.ceil(images * aug_repeats / processes))


def _enough_images(batch: int, processes: int, aug_repeats: float) -> int:
    """An image count from which on every count gives a process at least ``batch`` images (where counting stops)."""
    if processes <= 1:
        return batch
    enough = (batch - 1) * processes + 1
    return max(enough, 256 * math.ceil(batch * processes / 256)) if aug_repeats else enough


def _step_problems(train: Path, args: argparse.Namespace, processes: int) -> List[str]:
    """No step in an epoch: the train loader drops the last partial batch (``drop_last`` when training)."""
    batch = args.batch_size
    if batch < 1:
        return [f'--batch-size {batch}: the batch must hold at least 1 image']
    if getattr(args, 'naflex_loader', False):  # NaFlex batches by sequence length, not by --batch-size
        return []
    images = count_images(train, _enough_images(batch, processes, args.aug_repeats), getattr(args, 'input_key', None))
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


def _folder_problems(
        root: Any, splits: Sequence[Tuple[str, str]], script: str, input_key: Optional[str],
) -> Tuple[List[str], Optional[Path]]:
    """Problems of an ImageFolder (or .tar) dataset at ``root`` for ``splits`` ((option, split name) pairs), and
    the folder the first split reads (for the step count)."""
    layout = ' and '.join(f'DIR/{split.split("[")[0]}/<class>/<image>' for _, split in splits)
    if not root:
        return [f'no --data-dir: {script} reads an ImageFolder, add --data-dir DIR with {layout} '
                f'({", ".join(sorted(_extensions(input_key)))})'], None
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
    kinds = ', '.join(sorted(_extensions(input_key)))
    if where.fallback:
        return (f'--data-dir {root} has no images ({kinds}) and no folder for {option} {split}: it should hold '
                f'{root}/{where.looked_for[0]}/<class>/<image>')
    return f'{where.folder} ({option} {split}) has no images ({kinds}): it should hold {where.folder}/<class>/<image>'


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


def paper_row(recipe: Path) -> Optional[PaperRow]:
    """The paper row of a packaged paper recipe (None for any other file)."""
    try:
        recipe.resolve().relative_to(recipes_dir().resolve())
    except ValueError:  # a user's own recipe: its paper values are not known
        return None
    return packaged_row(recipe, _paper_rows())


@functools.lru_cache(maxsize=1)
def _paper_rows() -> Dict[str, PaperRow]:
    """The paper-values tables (package data), read once per process."""
    return load_paper_values()


def _batch_fixes(batch: int, processes: int, accum: int, want: int, recipe_batch: bool) -> str:
    """Arguments that give the global batch ``want``: accumulation steps (the per-process batch no larger than
    now), or, at the recipe's own per-process batch (``recipe_batch``), the process count the recipe assumes."""
    fixes = []
    for steps in range(1, want + 1):
        if want % (processes * steps) == 0 and want // (processes * steps) <= batch:
            per = want // (processes * steps)
            parts = ([f'--batch-size {per}'] if per != batch else []) + (
                [f'--grad-accum-steps {steps}'] if steps != accum else [])
            fixes.append(' '.join(parts))
            break
    if recipe_batch and want % (batch * accum) == 0 and want // (batch * accum) != processes:
        nproc = want // (batch * accum)
        fixes.append(f'--nproc-per-node {nproc} on {nproc} GPUs')
    return ' or '.join(f for f in fixes if f)


def lr_note(args: argparse.Namespace, batch: int) -> str:
    """The lr train.py uses at global batch ``batch``: an explicit lr as it is, else lr_base scaled (its rule)."""
    if args.lr:
        return f'lr {args.lr:g} unchanged: train.py does not rescale an explicit lr'
    if not args.lr_base_size:
        return 'lr_base_size 0: train.py cannot scale lr_base'
    scale = args.lr_base_scale or ('sqrt' if any(o in str(args.opt).lower() for o in ('ada', 'lamb')) else 'linear')
    ratio = batch / args.lr_base_size
    lr = args.lr_base * (ratio ** 0.5 if scale == 'sqrt' else ratio)
    return f'train.py scales lr_base {args.lr_base:g} at {args.lr_base_size} ({scale}) to lr {lr:.3g}'


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


def _is_folder_dataset(dataset: Any) -> bool:
    """timm's folder (or tar) reader: a dataset name without a reader prefix (``''``, ``imagenet``)."""
    prefix, sep, _ = str(dataset or '').partition('/')
    return not (sep and prefix.lower() in _READER_PREFIXES)


def _extensions(input_key: Optional[str]) -> set:
    from timm.data.readers.img_extensions import get_img_extensions

    return set(input_key.split(';')) if input_key else get_img_extensions(as_set=True)


def count_noun(n: int, word: str, plural: str = 's') -> str:
    """'1 process', '32 processes': a count and its noun, for one-line messages."""
    return f'{n} {word}{plural if n != 1 else ""}'


def _as_list(value: Any) -> List[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
