"""timm_ext.launch.run_classes and ``timm-ext validate --checkpoint RUN``: the folder's classes against the run's.

A validation folder with classes ``5``..``9`` of a 10-class run gave validate.py targets 0..4 (a wrong top-1, exit 0);
one with 12 classes a traceback. Each case is run as the user types it (``--dry-run``, in process) on a checkpoint
train.py's way (its ``arch`` and namespace) and folders of 16 px PNGs made here; the mapping of a subset is also run
through timm's real validate.py, whose top-1 must equal one computed here from the model's own outputs.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List

import pytest
import torch
from _cli import run_cli
from _threads import same_threads
from _timm_train import VALIDATE_PY
from conftest import require_timm_script

from timm_ext.launch.run_classes import folder_classes, write_class_map

REPO = Path(__file__).resolve().parents[1]

MODEL_KWARGS = {'img_size': 16, 'patch_size': 4, 'embed_dim': 32, 'depth': 2, 'num_heads': 2, 'stem': 'conv'}
# the colour of each class's images: far apart, so that a head of class centroids tells them apart
COLOURS = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


@pytest.fixture
def validate_parser():
    return require_timm_script(VALIDATE_PY)


def _images(folder: Path, classes: Iterable[str], per_class: int) -> None:
    from PIL import Image

    for name in classes:
        (folder / name).mkdir(parents=True)
        colour = COLOURS[int(name) % len(COLOURS)] if name.isdigit() else (128, 128, 128)
        for i in range(per_class):
            pixels = Image.new('RGB', (16, 16), colour)
            pixels.putpixel((i % 16, i // 16), (0, 0, 0))  # images differ a little within a class
            pixels.save(folder / name / f'{i}.png')


def _train_args(data_dir: Path) -> Dict[str, object]:
    return {'model': 'vit_tiny_cb', 'model_kwargs': MODEL_KWARGS, 'num_classes': 10, 'input_size': [3, 16, 16],
            'crop_pct': 1.0, 'interpolation': 'bilinear', 'mean': [0.5] * 3, 'std': [0.5] * 3, 'device': 'cpu',
            'data_dir': str(data_dir), 'dataset': '', 'train_split': 'train', 'val_split': 'validation',
            'class_map': '', 'model_ema': False}


def _run(tmp_path: Path, model: torch.nn.Module = None) -> Path:
    """A 10-class run whose train folder ``tmp_path/data/train`` holds classes 0..9; its checkpoint file."""
    import timm

    _images(tmp_path / 'data' / 'train', [str(k) for k in range(10)], 1)
    model = model or timm.create_model('vit_tiny_cb', num_classes=10, **MODEL_KWARGS)
    (tmp_path / 'run').mkdir()
    torch.save({'state_dict': model.state_dict(), 'arch': 'vit_tiny_cb', 'epoch': 1,
                'args': argparse.Namespace(**_train_args(tmp_path / 'data'))}, tmp_path / 'run' / 'last.pth.tar')
    return tmp_path / 'run' / 'last.pth.tar'


def _validate(capsys, checkpoint: Path, data: Path, *extra) -> tuple:
    """(exit code, the command printed, stderr lines) of ``timm-ext validate --checkpoint C --data-dir D --dry-run``."""
    code, out, err = run_cli(capsys, 'validate', '--timm-validate', VALIDATE_PY, '--checkpoint', checkpoint,
                             '--data-dir', data, '--dry-run', *extra)
    return code, out, err.splitlines()


def _notes(err: List[str]) -> List[str]:
    return [line for line in err if line.startswith('timm-ext validate: note: ') and 'note: from ' not in line]


def test_folder_classes_are_timms_in_its_order(tmp_path):
    _images(tmp_path, ['10', '9', '1', 'b', 'a'], 1)
    (tmp_path / 'empty').mkdir()  # no image: not a class for timm's reader
    assert folder_classes(tmp_path) == ['1', '9', '10', 'a', 'b']


def test_a_subset_of_the_runs_classes_is_mapped_by_name(tmp_path, capsys, validate_parser):
    checkpoint = _run(tmp_path)
    _images(tmp_path / 'val' / 'validation', ['5', '6', '7', '8', '9'], 2)
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'val')
    class_map = write_class_map([str(k) for k in range(10)])
    assert code == 0 and out.split()[-2:] == ['--class-map', str(class_map)], (out, err)
    assert class_map.read_text() == ''.join(f'{k}\n' for k in range(10))
    assert _notes(err) == [
        f'timm-ext validate: note: {tmp_path / "val" / "validation"} holds 5 of the run\'s 10 classes (5, 6, 7, 8, 9): '
        f'mapped to the run\'s indices by name (--class-map {class_map}, the names of its train folder '
        f'{tmp_path / "data" / "train"}); the top-1 counts the images of these 5 classes, the model choosing among '
        f'all 10']
    # the run's own classes: nothing to map, nothing said
    _images(tmp_path / 'all' / 'validation', [str(k) for k in range(10)], 1)
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'all')
    assert code == 0 and '--class-map' not in out and _notes(err) == []


def test_classes_that_are_not_the_runs_are_one_line(tmp_path, capsys, validate_parser):
    checkpoint = _run(tmp_path)
    twelve = tmp_path / 'twelve' / 'validation'
    _images(twelve, [str(k) for k in range(12)], 1)
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'twelve')
    assert code == 2 and out == '' and err[-1] == (
        f'timm-ext validate: error: {twelve} has 12 classes and the run {checkpoint} 10 (its train folder '
        f'{tmp_path / "data" / "train"}): 10, 11 are not among the run\'s classes; validate on the run\'s classes or '
        f'some of them (mapped by name)')
    letters = tmp_path / 'letters' / 'validation'
    _images(letters, list('abcdefghij'), 1)
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'letters')
    assert code == 2 and out == '' and err[-1] == (
        f'timm-ext validate: error: {letters} has the 10 classes of the run {checkpoint} by count but other names: '
        f'a, b, c, d, e, f, ... (10 in all) are not among the run\'s (0, 1, 2, 3, 4, 5, ... (10 in all), from its '
        f'train folder {tmp_path / "data" / "train"}), and validate.py would score each folder as the run\'s class '
        f'of the same rank; rename them, or give --class-map FILE (one run class a line, in index order)')


def test_without_the_runs_train_folder_only_the_count_is_compared(tmp_path, capsys, validate_parser):
    checkpoint = _run(tmp_path)
    data = tmp_path / 'data'
    data.rename(tmp_path / 'moved')
    subset = tmp_path / 'subset' / 'validation'
    _images(subset, ['5', '6', '7', '8', '9'], 1)
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'subset')
    assert code == 2 and out == '' and err[-1] == (
        f'timm-ext validate: error: {subset} has 5 classes and the run {checkpoint} 10, whose names are unknown (its '
        f'data folder {data} is gone): validate.py would score them as the run\'s first 5 classes, a wrong top-1; '
        f'validate on all 10 classes, or give --class-map FILE with the run\'s class names in index order, one a line '
        f'(a subset is then mapped by name)')
    _images(tmp_path / 'twelve' / 'validation', [str(k) for k in range(12)], 1)
    code, _, err = _validate(capsys, checkpoint, tmp_path / 'twelve')
    assert code == 2 and 'validate.py would stop at the first target beyond the run\'s 10 (IndexError)' in err[-1]
    all_ten = tmp_path / 'all' / 'validation'
    _images(all_ten, [str(k) for k in range(10)], 1)
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'all')
    assert code == 0 and '--class-map' not in out and _notes(err) == [
        f'timm-ext validate: note: the run\'s class names are unknown (its data folder {data} is gone): the 10 '
        f'classes of {all_ten} are taken as the run\'s, in name order']
    # the user's own class map names the run's classes: the subset is theirs to map, and it is checked
    (tmp_path / 'names.txt').write_text(''.join(f'{k}\n' for k in range(10)))
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'subset', '--class-map', tmp_path / 'names.txt')
    assert code == 0 and _notes(err) == [], err
    (tmp_path / 'short.txt').write_text('5\n6\n7\n')
    code, _, err = _validate(capsys, checkpoint, tmp_path / 'subset', '--class-map', tmp_path / 'short.txt')
    assert code == 2 and err[-1] == (
        f'timm-ext validate: error: {subset} has classes that --class-map {tmp_path / "short.txt"} does not name '
        f'(8, 9): validate.py would skip their images and say nothing; add them to the map, or leave them out of '
        f'the folder')
    (tmp_path / 'long.txt').write_text(''.join(f'{k}\n' for k in range(12)))
    code, _, err = _validate(capsys, checkpoint, tmp_path / 'twelve', '--class-map', tmp_path / 'long.txt')
    assert code == 2 and err[-1] == (
        f'timm-ext validate: error: --class-map {tmp_path / "long.txt"} maps 10 -> 10, 11 -> 11, outside the 10 '
        f'classes of the run {checkpoint}: validate.py would stop with IndexError')


def test_no_run_args_takes_nothing_from_the_run_and_checks_no_class(tmp_path, capsys, validate_parser):
    checkpoint = _run(tmp_path)
    _images(tmp_path / 'subset' / 'validation', ['5', '6', '7', '8', '9'], 1)
    kwargs = [f'{k}={v}' for k, v in MODEL_KWARGS.items()]
    code, out, err = _validate(capsys, checkpoint, tmp_path / 'subset', '--no-run-args', '--model', 'vit_tiny_cb',
                               '--model-kwargs', *kwargs, '--num-classes', '10', '--device', 'cpu')
    assert code == 0 and '--class-map' not in out and _notes(err) == []


def _centroid_head(model: torch.nn.Module, images: Dict[str, List[torch.Tensor]]) -> None:
    """The head scores class k by the centroid of its images' features (the other classes far below): a model that
    recognises ``images``' classes, whatever the backbone's random weights."""
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.fill_(-1e4)
        for name, xs in images.items():
            features = model.forward_head(model.forward_features(torch.stack(xs)), pre_logits=True)
            model.head.weight[int(name)] = torch.nn.functional.normalize(features.mean(0), dim=0)
            model.head.bias[int(name)] = 0


def _tensor(path: Path) -> torch.Tensor:
    """validate.py's preprocessing of a 16 px image at 16 px, crop 1.0 (an identity resize), mean and std 0.5."""
    import numpy as np
    from PIL import Image

    pixels = torch.from_numpy(np.asarray(Image.open(path).convert('RGB'), dtype=np.float32) / 255)
    return (pixels.permute(2, 0, 1) - 0.5) / 0.5


@pytest.mark.slow
def test_validate_py_scores_a_subset_against_the_runs_indices(tmp_path, validate_parser):
    """Classes 5..9 of a 10-class run through timm's real validate.py: the top-1 is the share of images whose
    argmax is their class's index in the run, computed here image by image (unmapped, validate.py would compare
    with 0..4, which this head never predicts)."""
    import timm

    if tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 5):
        pytest.skip(f'validate.py cannot load train.py\'s checkpoint with torch {torch.__version__}')
    folder = tmp_path / 'val' / 'validation'
    _images(folder, ['5', '6', '7', '8', '9'], 3)
    images = {c.name: [_tensor(p) for p in sorted(c.iterdir())] for c in sorted(folder.iterdir())}
    model = timm.create_model('vit_tiny_cb', num_classes=10, **MODEL_KWARGS).eval()
    _centroid_head(model, {k: v[:1] for k, v in images.items()})
    with torch.no_grad():
        hits = [int(model(x[None]).argmax()) == int(name) for name, xs in images.items() for x in xs]
    reference = 100 * sum(hits) / len(hits)
    assert reference > 0
    results = tmp_path / 'results.json'
    proc = subprocess.run(
        [sys.executable, '-m', 'timm_ext', 'validate', '--timm-validate', str(VALIDATE_PY), '--checkpoint',
         str(_run(tmp_path, model)), '--data-dir', str(tmp_path / 'val'), '--results-file', str(results),
         '--results-format', 'json', '--workers', '0'],
        # the reference above ran on this process's threads: the child too (tests/_threads.py), or float sums in
        # another order could flip a near tie of this random backbone's argmax
        env=dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS=same_threads()), capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'holds 5 of the run\'s 10 classes (5, 6, 7, 8, 9): mapped to the run\'s indices by name' in proc.stderr
    assert abs(json.loads(results.read_text())['top1'] - reference) < 1e-3, (reference, proc.stdout[-2000:])
