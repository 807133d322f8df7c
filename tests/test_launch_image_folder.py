"""timm_ext.launch.image_folder: a dataset folder as timm's reader and samplers see it (the refusals built on it:
tests/test_launch_command_checks.py)."""
import os
from pathlib import Path

import pytest

from timm_ext.launch import image_folder
from timm_ext.launch.image_folder import (
    count_images,
    enough_images,
    images_per_process,
    is_folder_dataset,
    split_folder,
)


def _class_folders(root: Path, classes: int, images: int) -> Path:
    """``root/c<k>/<i>.png``: the reader counts files by extension, so empty files stand in for images."""
    for k in range(classes):
        (root / f'c{k}').mkdir(parents=True)
        for i in range(images):
            (root / f'c{k}' / f'{i}.png').write_bytes(b'')
    return root


def test_images_per_process_follows_timms_samplers():
    assert images_per_process(6) == 6
    assert images_per_process(6, 4) == 2  # DistributedSampler pads to ceil(6 / 4)
    assert images_per_process(255, 8, aug_repeats=3) == 32  # RepeatAugSampler, under 256: ceil
    assert images_per_process(1000, 8, aug_repeats=3) == 96  # 3 x 256 images / 8
    assert images_per_process(1000, 8) == 125


@pytest.mark.parametrize('aug_repeats', [0, 3])
def test_enough_images_is_where_every_process_gets_a_batch(aug_repeats):
    for processes in range(1, 9):
        for batch in range(1, 41):
            enough = enough_images(batch, processes, aug_repeats)
            assert all(images_per_process(n, processes, aug_repeats) >= batch for n in range(enough, enough + 600))
            if not aug_repeats:  # the first such count: one image fewer leaves a process short
                assert images_per_process(enough - 1, processes) < batch


def test_counting_stops_at_the_limit(tmp_path, monkeypatch):
    data = _class_folders(tmp_path / 'data', classes=4, images=2)
    seen = []
    walk = os.walk

    def recording_walk(*args, **kwargs):
        for entry in walk(*args, **kwargs):
            seen.append(entry[0])
            yield entry

    monkeypatch.setattr(image_folder.os, 'walk', recording_walk)
    assert count_images(data) == 8 and len(seen) == 5
    seen.clear()
    assert count_images(data, limit=3) == 3 and len(seen) == 3  # the root and two class folders
    assert count_images(data, input_key='.jpg') == 0


def test_split_folder_follows_timms_synonyms(tmp_path):
    (tmp_path / 'train').mkdir()
    (tmp_path / 'val').mkdir()
    where = split_folder(tmp_path, 'validation')
    assert where.folder == tmp_path / 'val' and not where.fallback
    assert where.looked_for[0] == 'validation' and 'val' in where.looked_for
    missing = split_folder(tmp_path / 'train', 'validation')  # no split folder: the reader scans the root
    assert missing.folder == tmp_path / 'train' and missing.fallback and missing.other_splits == ()
    assert split_folder(tmp_path, 'test').other_splits == ('train', 'val')


@pytest.mark.parametrize('dataset, folder', [
    ('', True), ('imagenet', True), ('folder', True), ('torch/cifar10', False), ('hfds/imagenet-1k', False),
    ('wds/data', False), ('mine/x', True),
])
def test_folder_datasets_are_those_without_a_reader_prefix(dataset, folder):
    assert is_folder_dataset(dataset) is folder
