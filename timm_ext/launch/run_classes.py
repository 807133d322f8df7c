"""The classes of a train.py run against those of the folder validate.py reads, compared before validate.py starts.

timm's folder reader numbers the classes of a folder by their sorted names (``natural_key``), in the training folder
and in the validation folder alike, and a checkpoint records only their count (its head). A validation folder with
other classes than the run's hands validate.py targets that mean other classes than the model's outputs: classes
``5``..``9`` of a 10-class run are numbered 0..4 and scored as a wrong top-1 with exit code 0; 12 classes stop at
the first target beyond the head (``IndexError: Target 10 is out of bounds``).

:func:`class_check` compares them. The run's class names are read from the class map it trained with, else from
its train folder (the ``data_dir`` and ``train_split`` train.py recorded) while that folder is there; otherwise only
their count is known. A folder that holds some of the run's named classes is mapped to the run's indices by name
through validate.py's own ``--class-map`` (a file of the run's names in index order, written to timm-ext's cache);
every other mismatch is one line that names the folder, both counts and the names that differ.
"""
import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from timm_ext.launch.image_folder import count_images, is_folder_dataset, split_folder

__all__ = ['ClassCheck', 'class_check', 'folder_classes', 'run_class_names', 'write_class_map']

_SHOWN = 6  # names listed in a line before "... (N in all)"


@dataclass(frozen=True)
class ClassCheck:
    """validate.py arguments to add (``--class-map FILE``), notes (one line each), and the problem that stops it."""
    args: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    problem: Optional[str] = None


def folder_classes(folder: Union[str, Path], input_key: Optional[str] = None) -> List[str]:
    """The classes timm's folder reader finds in ``folder``, in its order: the subfolders that hold an image,
    sorted by timm's ``natural_key``."""
    from timm.utils.misc import natural_key

    folder = Path(folder)
    names = [p.name for p in folder.iterdir() if p.is_dir() and count_images(p, 1, input_key)]
    return sorted(names, key=natural_key)


def _class_map(path: str, split: Path) -> Dict[str, int]:
    """The ``{name: index}`` of a class map file as timm reads it (the path, else relative to the split folder)."""
    from timm.data.readers.class_map import load_class_map

    try:
        loaded = load_class_map(path, str(split))
    except (AssertionError, OSError, ValueError) as e:  # timm asserts on a missing file or an unknown extension
        raise ValueError(f'--class-map {path} cannot be read ({e or type(e).__name__})') from None
    return {str(k): int(v) for k, v in loaded.items()}


def run_class_names(train_args: Dict[str, Any]) -> Tuple[Optional[List[str]], str]:
    """The run's class names by index, read from its train folder (``data_dir``/``train_split`` as train.py
    recorded them), and where from; (None, why not) when that folder is not readable as the run's."""
    root = train_args.get('data_dir') or train_args.get('data')
    if not root:
        return None, 'the run recorded no data folder'
    if not is_folder_dataset(train_args.get('dataset')):
        return None, f'the run trained on --dataset {train_args.get("dataset")}'
    if not Path(root).is_dir():
        return None, f'its data folder {root} is gone'
    split = str(train_args.get('train_split') or 'train')
    where = split_folder(root, split)
    if where.fallback and where.other_splits:
        return None, f'its data folder {root} has no {split} folder now'
    names = folder_classes(where.folder, train_args.get('input_key'))
    return (names, f'its train folder {where.folder}') if names else (
        None, f'its train folder {where.folder} holds no images now')


def write_class_map(names: Sequence[str], cache: Optional[Path] = None) -> Path:
    """A class map file of ``names`` in index order (timm's ``.txt``: one name a line, its line number its
    index), kept in timm-ext's cache under its content's sha256 so that a printed command stays valid."""
    from timm_ext.data import default_cache_dir
    from timm_ext.launch.release_table import sha256_of

    text = ''.join(f'{name}\n' for name in names)
    target = (cache or default_cache_dir()) / 'class-maps' / f'{sha256_of(text.encode())[:16]}.txt'
    if not (target.is_file() and target.read_text(encoding='utf-8') == text):
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f'.{os.getpid()}.tmp')
        partial.write_text(text, encoding='utf-8')
        os.replace(partial, target)
    return target


def _listed(names: Sequence[str]) -> str:
    more = f', ... ({len(names)} in all)' if len(names) > _SHOWN else ''
    return ', '.join(names[:_SHOWN]) + more


def class_check(train_args: Dict[str, Any], args: argparse.Namespace, num_classes: int, checkpoint: Path) -> ClassCheck:
    """validate.py's folder (``args``, its parsed arguments) against the run's classes: ``num_classes`` (the
    model's head) and their names where :func:`run_class_names` reads them. Datasets other than timm's folder
    reader and split folders that are not there (the data checks name those) are left alone."""
    root = getattr(args, 'data', None) or getattr(args, 'data_dir', None)
    if not root or not is_folder_dataset(getattr(args, 'dataset', '')) or not Path(root).is_dir():
        return ClassCheck()
    where = split_folder(root, str(args.split))
    if where.fallback and where.other_splits:
        return ClassCheck()
    folder, names = where.folder, folder_classes(where.folder, getattr(args, 'input_key', None))
    if not names:
        return ClassCheck()
    run = f'the run {checkpoint}'
    if getattr(args, 'class_map', ''):
        return _mapped_check(folder, names, str(args.class_map), num_classes, run)
    known, source = run_class_names(train_args)
    if known is not None and len(known) > num_classes:
        known, source = None, f'{source} now holds {len(known)} classes'
    if known is None:
        recorded = bool(train_args.get('data_dir') or train_args.get('data'))
        return _count_check(folder, names, num_classes, run, source, note=recorded)
    if names == known:
        return ClassCheck()
    other = [n for n in names if n not in known]
    if not other:
        if any(not n or n != n.strip() for n in known):
            return ClassCheck(problem=f'{folder} holds {len(names)} of the {num_classes} classes of {run}, whose '
                                      f'names ({source}) cannot be written as a class map: validate on all of them')
        class_map = write_class_map(known)
        return ClassCheck(['--class-map', str(class_map)], [
            f'{folder} holds {len(names)} of the run\'s {len(known)} classes ({_listed(names)}): mapped to the run\'s '
            f'indices by name (--class-map {class_map}, the names of {source}); the top-1 counts the images of '
            f'these {len(names)} classes, the model choosing among all {num_classes}'])
    if len(names) != len(known):
        return ClassCheck(problem=f'{folder} has {len(names)} classes and {run} {len(known)} ({source}): '
                                  f'{_listed(other)} {"is" if len(other) == 1 else "are"} not among the run\'s '
                                  f'classes; validate on the run\'s classes or some of them (mapped by name)')
    return ClassCheck(problem=f'{folder} has the {len(names)} classes of {run} by count but other names: '
                              f'{_listed(other)} {"is" if len(other) == 1 else "are"} not among the run\'s '
                              f'({_listed(known)}, from {source}), and validate.py would score each folder as the '
                              f'run\'s class of the same rank; rename them, or give --class-map FILE (one run class a '
                              f'line, in index order)')


def _count_check(folder: Path, names: List[str], num_classes: int, run: str, why: str, note: bool) -> ClassCheck:
    """The run's class names unknown (``why``): only the counts can be compared; ``note``: say so when they agree
    (the run recorded a data folder that could not be read)."""
    if len(names) == num_classes:
        return ClassCheck(notes=[f'the run\'s class names are unknown ({why}): the {len(names)} classes of {folder} '
                                 f'are taken as the run\'s, in name order'] if note else [])
    effect = (f'validate.py would score them as the run\'s first {len(names)} classes, a wrong top-1'
              if len(names) < num_classes else
              f'validate.py would stop at the first target beyond the run\'s {num_classes} (IndexError)')
    return ClassCheck(problem=f'{folder} has {len(names)} classes and {run} {num_classes}, whose names are unknown '
                              f'({why}): {effect}; validate on all {num_classes} classes, or give --class-map FILE '
                              f'with the run\'s class names in index order, one a line (a subset is then mapped by '
                              f'name)')


def _mapped_check(folder: Path, names: List[str], class_map: str, num_classes: int, run: str) -> ClassCheck:
    """A class map in effect (the run's or the user's): every class of the folder must be in it, within the head."""
    try:
        mapping = _class_map(class_map, folder)
    except ValueError as e:
        return ClassCheck(problem=f'{e}: validate.py would stop on it')
    missing = [n for n in names if n not in mapping]
    if missing:
        return ClassCheck(problem=f'{folder} has classes that --class-map {class_map} does not name '
                                  f'({_listed(missing)}): validate.py would skip their images and say nothing; add '
                                  f'them to the map, or leave them out of the folder')
    beyond = [f'{n} -> {mapping[n]}' for n in names if not 0 <= mapping[n] < num_classes]
    if beyond:
        return ClassCheck(problem=f'--class-map {class_map} maps {_listed(beyond)}, outside the {num_classes} '
                                  f'classes of {run}: validate.py would stop with IndexError')
    return ClassCheck()
