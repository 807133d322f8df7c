"""Real images that ship inside a package: scikit-learn's handwritten digits as an ImageFolder.

``sklearn.datasets.load_digits`` holds 1,797 real 8x8 scans of handwritten digits (UCI
"Optical Recognition of Handwritten Digits", 16 grey levels, 10 classes). Nothing is downloaded:
the data is inside the scikit-learn wheel. :func:`digits_image_folder` writes it once as PNG files
in timm's ImageFolder layout (``<root>/train/<class>/*.png``, ``<root>/validation/<class>/*.png``),
so that timm's train.py reads it through its real data pipeline.

:func:`digits_tuning_folder` splits the *training* images of that split once more, into
``train/`` and ``heldout/``, so settings can be chosen without ever looking at ``validation/``.
:func:`digits_subset_folder` keeps a stratified fraction of the training images (nested: a quarter is
inside the half) and every validation image, for data-size studies (vit-sam paper, Table 5).

The split is stratified and fixed by a seed, the images are upsampled with bilinear interpolation
to ``size`` pixels and stored as RGB (train.py's ImageFolder reader converts to RGB anyway). The
folder is written under a temporary name and renamed into place when complete, so an interrupted
run never leaves a half-written cache; a complete cache is reused, never rewritten.
"""
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

import numpy as np

from timm_ext._files import user_dir_mode

__all__ = ['DIGITS_CLASSES', 'default_cache_dir', 'digits_image_folder', 'digits_subset_folder', 'digits_tuning_folder',
           'load_digits_arrays']

DIGITS_CLASSES = tuple(str(i) for i in range(10))
_MARKER = 'timm_ext_digits.json'
_FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    """``$TIMM_EXT_CACHE`` or ``~/.cache/timm-ext``: where timm-ext keeps data and scripts."""
    return Path(os.environ.get('TIMM_EXT_CACHE', Path.home() / '.cache' / 'timm-ext')).expanduser()


def load_digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """The 1,797 digit images as uint8 (N, 8, 8) in 0..255 and their labels (N,)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError(
            'the digits data comes from scikit-learn, which is not installed: '
            'pip install "timm-ext[demo]" (or pip install scikit-learn)') from e
    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def _stratified_split(labels: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of validation samples: ``val_fraction`` of each class, chosen by ``seed``."""
    rng = np.random.default_rng(seed)
    is_val = np.zeros(len(labels), dtype=bool)
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        is_val[idx[:int(round(len(idx) * val_fraction))]] = True
    return is_val


def _check_args(size: int, val_fraction: float, seed: int) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not 8 <= size <= 512:
        raise ValueError(f'digits image size must be an int in [8, 512], got size={size!r}')
    if not isinstance(val_fraction, float) or not 0.0 < val_fraction < 1.0:
        raise ValueError(f'val_fraction must be a float in (0, 1), got val_fraction={val_fraction!r}')
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f'seed must be an int, got seed={seed!r}')


def _read_marker(root: Path) -> Optional[Dict[str, object]]:
    try:
        return json.loads((root / _MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_images(root: Path, size: int, split_of: Dict[int, str], **meta: object) -> Dict[str, object]:
    """Each digit ``idx`` of ``split_of`` as ``root/<split>/<class>/<idx>.png`` (one file name per digit in every
    folder kind), then the marker with ``meta`` and the counts per split."""
    from PIL import Image

    images, labels = load_digits_arrays()
    counts: Dict[str, int] = {}
    for idx, split in split_of.items():
        folder = root / split / DIGITS_CLASSES[labels[idx]]
        folder.mkdir(parents=True, exist_ok=True)
        pil = Image.fromarray(images[idx], mode='L').resize((size, size), Image.BILINEAR).convert('RGB')
        pil.save(folder / f'{idx:04d}.png')
        counts[split] = counts.get(split, 0) + 1
    out = dict(format_version=_FORMAT_VERSION, source='sklearn.datasets.load_digits', size=size, **meta,
               num_classes=len(DIGITS_CLASSES), counts=counts)
    (root / _MARKER).write_text(json.dumps(out, indent=2))
    return out


def _write_folder(root: Path, size: int, val_fraction: float, seed: int) -> Dict[str, object]:
    _, labels = load_digits_arrays()
    is_val = _stratified_split(labels, val_fraction, seed)
    split_of = {idx: 'validation' if v else 'train' for idx, v in enumerate(is_val)}
    return _write_images(root, size, dict(sorted(split_of.items())), val_fraction=val_fraction, seed=seed)


def _written_once(target: Path, what: str, write: Callable[[Path], Dict[str, object]]) -> Path:
    """``target``, written by ``write`` into a temporary folder renamed into place when complete, or reused."""
    meta = _read_marker(target)
    if meta is not None and meta.get('format_version') == _FORMAT_VERSION:
        return target
    if target.exists():
        raise FileExistsError(
            f'{target} exists but is not a complete timm-ext {what} (no valid {_MARKER}); '
            f'move it away or pass another root=')
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix='.digits_tmp_', dir=target.parent))
    try:
        os.chmod(tmp, user_dir_mode())  # a new folder's mode, not mkdtemp's 0700
        write(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if _read_marker(target) is None:  # another process did not finish it either
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def digits_image_folder(
        root: Optional[Union[str, Path]] = None,
        size: int = 32,
        val_fraction: float = 0.2,
        seed: int = 0,
) -> Path:
    """The digits as an ImageFolder (``train/`` and ``validation/``), written once and then reused.

    Args:
        root: parent folder of the cache; default ``default_cache_dir() / 'data'``.
        size: side of the stored images in pixels (the 8x8 scans are upsampled bilinearly).
        val_fraction: fraction of each class held out for ``validation/``.
        seed: seed of the split.

    Returns:
        The dataset folder, to pass to train.py as ``--data-dir`` (``--num-classes 10``).
    """
    _check_args(size, val_fraction, seed)
    parent = Path(root).expanduser() if root is not None else default_cache_dir() / 'data'
    target = parent / f'digits_{size}px_val{val_fraction:g}_seed{seed}'
    return _written_once(target, 'digits folder', lambda tmp: _write_folder(tmp, size, val_fraction, seed))


def _write_tuning_folder(
        root: Path, size: int, val_fraction: float, seed: int, heldout_fraction: float, heldout_seed: int,
) -> Dict[str, object]:
    _, labels = load_digits_arrays()
    train_idx = np.flatnonzero(~_stratified_split(labels, val_fraction, seed))  # validation images never enter
    is_heldout = _stratified_split(labels[train_idx], heldout_fraction, heldout_seed)
    split_of = {int(idx): 'heldout' if h else 'train' for idx, h in zip(train_idx, is_heldout)}
    return _write_images(root, size, split_of, val_fraction=val_fraction, seed=seed,
                         heldout_fraction=heldout_fraction, heldout_seed=heldout_seed)


def digits_tuning_folder(
        root: Optional[Union[str, Path]] = None,
        size: int = 32,
        val_fraction: float = 0.2,
        seed: int = 0,
        heldout_fraction: float = 0.2,
        heldout_seed: int = 1,
) -> Path:
    """A tuning split made of the training images only: ``train/`` and ``heldout/`` (written once, then reused).

    The images of :func:`digits_image_folder`'s ``train/`` (same ``size``, ``val_fraction`` and
    ``seed``) are split again, stratified, ``heldout_fraction`` of each class into ``heldout/``; no
    image of its ``validation/`` is ever written here. Pass the folder to train.py with
    ``--val-split heldout`` to compare settings without touching the validation images.
    """
    _check_args(size, val_fraction, seed)
    if not isinstance(heldout_fraction, float) or not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f'heldout_fraction must be a float in (0, 1), got heldout_fraction={heldout_fraction!r}')
    if not isinstance(heldout_seed, int) or isinstance(heldout_seed, bool):
        raise ValueError(f'heldout_seed must be an int, got heldout_seed={heldout_seed!r}')
    parent = Path(root).expanduser() if root is not None else default_cache_dir() / 'data'
    target = parent / f'digits_{size}px_val{val_fraction:g}_seed{seed}_heldout{heldout_fraction:g}_seed{heldout_seed}'
    return _written_once(target, 'digits tuning folder', lambda tmp: _write_tuning_folder(
        tmp, size, val_fraction, seed, heldout_fraction, heldout_seed))


def _write_subset_folder(root: Path, size: int, val_fraction: float, seed: int, fraction: float,
                         subset_seed: int) -> Dict[str, object]:
    _, labels = load_digits_arrays()
    is_val = _stratified_split(labels, val_fraction, seed)
    train_idx = np.flatnonzero(~is_val)
    # the first round(n * fraction) of one shuffle per class: with the same seed a smaller share nests in a larger
    kept = train_idx[_stratified_split(labels[train_idx], fraction, subset_seed)]
    split_of = {int(idx): 'validation' for idx in np.flatnonzero(is_val)}
    split_of.update({int(idx): 'train' for idx in kept})
    return _write_images(root, size, dict(sorted(split_of.items())), val_fraction=val_fraction, seed=seed,
                         train_fraction=fraction, subset_seed=subset_seed)


def digits_subset_folder(
        fraction: float,
        root: Optional[Union[str, Path]] = None,
        size: int = 32,
        val_fraction: float = 0.2,
        seed: int = 0,
        subset_seed: int = 0,
) -> Path:
    """:func:`digits_image_folder` with only ``fraction`` of each class's training images (written once).

    ``validation/`` is the full one, so accuracies compare across fractions. The kept images are the
    first ones of one shuffle per class (``subset_seed``): the quarter is inside the half.
    """
    _check_args(size, val_fraction, seed)
    if not isinstance(fraction, float) or not 0.0 < fraction <= 1.0:
        raise ValueError(f'fraction must be a float in (0, 1], got fraction={fraction!r}')
    if not isinstance(subset_seed, int) or isinstance(subset_seed, bool):
        raise ValueError(f'subset_seed must be an int, got subset_seed={subset_seed!r}')
    if fraction == 1.0:
        return digits_image_folder(root, size, val_fraction, seed)
    parent = Path(root).expanduser() if root is not None else default_cache_dir() / 'data'
    target = parent / f'digits_{size}px_val{val_fraction:g}_seed{seed}_train{fraction:g}_seed{subset_seed}'
    return _written_once(target, 'digits subset folder', lambda tmp: _write_subset_folder(
        tmp, size, val_fraction, seed, fraction, subset_seed))
