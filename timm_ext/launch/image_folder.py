"""A dataset folder as timm's ImageFolder reader and samplers will see it, without reading an image.

The checks before launch (:mod:`timm_ext.launch.command_checks`) need timm's own answers: which folder a split
reads (its ``_search_split``, with the split synonyms), which files count as images, and how many images one
process gets per epoch (``DistributedSampler``, ``RepeatAugSampler``). Answered here once, by timm's rules.
"""
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Set, Tuple, Union

from timm_ext._timm_compat import eval_split_synonyms, search_split, train_split_synonyms

__all__ = [
    'SplitFolder', 'count_images', 'enough_images', 'image_extensions', 'images_per_process', 'is_folder_dataset',
    'split_folder',
]

# dataset prefixes whose data the script's own readers find (torchvision, Hugging Face, TFDS, WebDataset)
_READER_PREFIXES = ('torch', 'hfds', 'hfids', 'tfds', 'wds')


@dataclass(frozen=True)
class SplitFolder:
    """Where timm's folder reader looks for a split: ``folder``, or the root itself when no split folder exists."""
    folder: Path
    looked_for: Tuple[str, ...]  # the folder names timm tries, in order
    fallback: bool  # no folder of the split: the reader scans the whole root
    other_splits: Tuple[str, ...]  # split folders the root does have (read too when ``fallback``)


def is_folder_dataset(dataset: Any) -> bool:
    """timm's folder (or tar) reader: a dataset name without a reader prefix (``''``, ``imagenet``)."""
    prefix, sep, _ = str(dataset or '').partition('/')
    return not (sep and prefix.lower() in _READER_PREFIXES)


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


def image_extensions(input_key: Optional[str] = None) -> Set[str]:
    """The file extensions timm's folder reader takes: its own, or ``input_key``'s ``;``-separated ones."""
    from timm.data.readers.img_extensions import get_img_extensions

    return set(input_key.split(';')) if input_key else get_img_extensions(as_set=True)


def count_images(folder: Union[str, Path], limit: Optional[int] = None, input_key: Optional[str] = None) -> int:
    """Image files under ``folder`` as timm's ImageFolder reader finds them (:func:`image_extensions`); stops at
    ``limit`` (ImageNet's 1.28M files need not all be seen)."""
    extensions = image_extensions(input_key)
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


def enough_images(batch: int, processes: int = 1, aug_repeats: float = 0) -> int:
    """An image count from which on every count gives each process at least ``batch`` images per epoch (the
    inverse of :func:`images_per_process`: where counting can stop)."""
    if processes <= 1:
        return batch
    enough = (batch - 1) * processes + 1
    return max(enough, 256 * math.ceil(batch * processes / 256)) if aug_repeats else enough
