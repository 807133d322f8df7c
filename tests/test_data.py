"""The embedded digits data: real scikit-learn images written once as a timm ImageFolder."""
import json
import os
import stat

import numpy as np
import pytest

pytest.importorskip('sklearn', reason='the digits data needs scikit-learn (pip install "timm-ext[demo]")')
from PIL import Image  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from timm_ext.data import (  # noqa: E402
    DIGITS_CLASSES,
    digits_image_folder,
    digits_subset_folder,
    digits_tuning_folder,
    load_digits_arrays,
)

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return digits_image_folder(tmp_path_factory.mktemp('digits'), size=16, seed=3)


def test_arrays_are_sklearns_digits_scaled_to_bytes():
    images, labels = load_digits_arrays()
    ref = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    np.testing.assert_array_equal(labels, ref.target)
    # 16 grey levels -> 0..255 (16 -> 255, 8 -> 128 after rounding)
    np.testing.assert_array_equal(images, np.rint(ref.images * 255 / 16).astype(np.uint8))


def test_folder_layout_counts_and_stratified_split(folder):
    counts = {}
    for split in ('train', 'validation'):
        assert sorted(p.name for p in (folder / split).iterdir()) == list(DIGITS_CLASSES)
        counts[split] = {c: len(list((folder / split / c).glob('*.png'))) for c in DIGITS_CLASSES}
    per_class = np.bincount(load_digits().target, minlength=10)
    for c in range(10):
        total = counts['train'][str(c)] + counts['validation'][str(c)]
        assert total == per_class[c]
        assert counts['validation'][str(c)] == round(per_class[c] * 0.2)
    meta = json.loads((folder / 'timm_ext_digits.json').read_text())
    assert meta['counts'] == {s: sum(v.values()) for s, v in counts.items()}
    assert sum(meta['counts'].values()) == 1797


def test_images_are_the_upsampled_scans(folder):
    images, labels = load_digits_arrays()
    path = next((folder / 'train' / '7').glob('*.png'))
    idx = int(path.stem)
    assert labels[idx] == 7
    img = Image.open(path)
    assert img.mode == 'RGB' and img.size == (16, 16)
    arr = np.asarray(img)
    assert (arr[..., 0] == arr[..., 1]).all() and (arr[..., 1] == arr[..., 2]).all()
    expected = np.asarray(Image.fromarray(images[idx], mode='L').resize((16, 16), Image.BILINEAR))
    np.testing.assert_array_equal(arr[..., 0], expected)
    # downsampling back by block means recovers the 8x8 scan closely (it is the same image)
    back = arr[..., 0].astype(float).reshape(8, 2, 8, 2).mean(axis=(1, 3))
    assert np.abs(back - images[idx]).mean() < 20


def test_split_is_fixed_by_seed_and_changes_with_it(tmp_path):
    a = digits_image_folder(tmp_path / 'a', size=8, seed=0)
    b = digits_image_folder(tmp_path / 'b', size=8, seed=0)
    c = digits_image_folder(tmp_path / 'c', size=8, seed=1)

    def val_files(f):
        return sorted(p.name for p in (f / 'validation').rglob('*.png'))
    assert val_files(a) == val_files(b)
    assert val_files(a) != val_files(c)


def test_cache_is_reused_not_rewritten(tmp_path):
    first = digits_image_folder(tmp_path, size=8)
    marker = first / 'timm_ext_digits.json'
    stamp = marker.stat().st_mtime_ns
    png = next(first.rglob('*.png'))
    png_stamp = png.stat().st_mtime_ns
    assert digits_image_folder(tmp_path, size=8) == first
    assert marker.stat().st_mtime_ns == stamp and png.stat().st_mtime_ns == png_stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.digits_tmp_')]


def test_incomplete_folder_is_refused_not_overwritten(tmp_path):
    target = tmp_path / 'digits_8px_val0.2_seed0'
    target.mkdir()
    (target / 'mine.txt').write_text('user data')
    with pytest.raises(FileExistsError, match='not a complete timm-ext digits folder'):
        digits_image_folder(tmp_path, size=8)
    assert (target / 'mine.txt').read_text() == 'user data'


@pytest.mark.parametrize('kwargs, match', [
    (dict(size=4), 'size=4'),
    (dict(size=32.0), 'size=32.0'),
    (dict(val_fraction=1.0), 'val_fraction=1.0'),
    (dict(val_fraction=0), 'val_fraction=0'),
    (dict(seed='0'), "seed='0'"),
])
def test_bad_arguments_name_the_value(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        digits_image_folder(tmp_path, **kwargs)


def _files(folder, split):
    return {p.relative_to(folder / split): p for p in (folder / split).rglob('*.png')}


def test_tuning_split_is_made_of_training_images_only(tmp_path):
    main = digits_image_folder(tmp_path, size=8, seed=2)
    tune = digits_tuning_folder(tmp_path, size=8, seed=2, heldout_fraction=0.25, heldout_seed=5)
    assert sorted(p.name for p in tune.iterdir() if p.is_dir()) == ['heldout', 'train']
    train, heldout, validation = _files(main, 'train'), _files(tune, 'heldout'), _files(main, 'validation')
    tune_train = _files(tune, 'train')
    # every tuning image is a training image of the main split (same class folder, same file, same pixels) ...
    assert set(tune_train) | set(heldout) == set(train) and not set(tune_train) & set(heldout)
    for rel, path in {**tune_train, **heldout}.items():
        assert path.read_bytes() == train[rel].read_bytes()
    # ... and no validation image (file names are the dataset index, unique across classes) is among them
    val_ids = {p.stem for p in validation.values()}
    assert not val_ids & {p.stem for p in (*tune_train.values(), *heldout.values())}
    # stratified: a quarter of each class's training images is held out
    for c in DIGITS_CLASSES:
        n_train = sum(1 for rel in train if rel.parts[0] == c)
        assert sum(1 for rel in heldout if rel.parts[0] == c) == round(n_train * 0.25)
    meta = json.loads((tune / 'timm_ext_digits.json').read_text())
    assert meta['counts'] == {'train': len(tune_train), 'heldout': len(heldout)}
    assert (meta['heldout_fraction'], meta['heldout_seed'], meta['seed']) == (0.25, 5, 2)


def test_tuning_split_is_reused_and_changes_with_its_seed(tmp_path):
    a = digits_tuning_folder(tmp_path, size=8)
    stamp = (a / 'timm_ext_digits.json').stat().st_mtime_ns
    assert digits_tuning_folder(tmp_path, size=8) == a
    assert (a / 'timm_ext_digits.json').stat().st_mtime_ns == stamp
    b = digits_tuning_folder(tmp_path, size=8, heldout_seed=2)
    assert set(_files(a, 'heldout')) != set(_files(b, 'heldout'))
    assert set(_files(a, 'heldout')) | set(_files(a, 'train')) == set(_files(b, 'heldout')) | set(_files(b, 'train'))


@pytest.mark.parametrize('kwargs, match', [
    (dict(heldout_fraction=0.0), 'heldout_fraction=0.0'),
    (dict(heldout_fraction=1), 'heldout_fraction=1'),
    (dict(heldout_seed=None), 'heldout_seed=None'),
    (dict(size=7), 'size=7'),
])
def test_tuning_split_bad_arguments_name_the_value(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        digits_tuning_folder(tmp_path, **kwargs)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('mask', [0o022, 0o027])
def test_folders_take_the_umask(tmp_path, mask):
    """The dataset folder gets a new folder's mode, not the 0700 of the temporary folder it is written in."""
    old = os.umask(mask)
    try:
        paths = [digits_image_folder(tmp_path, size=8), digits_tuning_folder(tmp_path, size=8)]
    finally:
        os.umask(old)
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~mask
        assert stat.S_IMODE((path / 'train').stat().st_mode) == 0o777 & ~mask


def _names(root, split):
    return {p.relative_to(root / split) for p in (root / split).rglob('*.png')}


def test_subset_keeps_a_stratified_nested_fraction_and_every_validation_image(tmp_path):
    full = digits_image_folder(tmp_path, size=8)
    half = digits_subset_folder(0.5, tmp_path, size=8)
    quarter = digits_subset_folder(0.25, tmp_path, size=8)
    assert _names(half, 'validation') == _names(quarter, 'validation') == _names(full, 'validation')
    full_train, half_train, quarter_train = (_names(r, 'train') for r in (full, half, quarter))
    assert quarter_train < half_train < full_train  # nested, training images only
    for cls in DIGITS_CLASSES:
        n = sum(p.parts[0] == cls for p in full_train)
        assert sum(p.parts[0] == cls for p in half_train) == round(n * 0.5)
        assert sum(p.parts[0] == cls for p in quarter_train) == round(n * 0.25)
    meta = json.loads((quarter / 'timm_ext_digits.json').read_text())
    assert meta['counts'] == {'train': len(quarter_train), 'validation': len(_names(full, 'validation'))}
    assert meta['train_fraction'] == 0.25
    assert digits_subset_folder(1.0, tmp_path, size=8) == full


@pytest.mark.parametrize('kwargs, match', [
    (dict(fraction=0.0), r'fraction must be a float in \(0, 1\], got fraction=0.0'),
    (dict(fraction=1), r'fraction must be a float in \(0, 1\], got fraction=1'),
    (dict(fraction=0.5, subset_seed='a'), r"subset_seed must be an int, got subset_seed='a'"),
])
def test_subset_bad_arguments_name_the_value(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        digits_subset_folder(root=tmp_path, size=8, **kwargs)
