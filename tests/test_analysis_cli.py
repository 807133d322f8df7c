"""``timm-ext analyze``: wiring and one-line error messages (the numbers are tested per module)."""
import importlib.util
import json

import pytest
from PIL import Image

from timm_ext.cli import main

TINY = ['--model', 'vit_tiny_patch16_224', '--model-kwargs', 'img_size=16', 'patch_size=4', 'embed_dim=16', 'depth=2',
        'num_heads=2', 'num_classes=3']


@pytest.fixture
def image_folder(tmp_path):
    root = tmp_path / 'data'
    for split in ('train', 'validation'):
        for cls in range(3):
            folder = root / split / str(cls)
            folder.mkdir(parents=True)
            for i in range(3):
                Image.new('RGB', (16, 16), (40 * cls, 20 * i, 90)).save(folder / f'{i}.png')
    return root


# a run writes its plot: without the analysis extra (e.g. the floor's virtualenv) those tests skip, as the demo's do
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None,
                                      reason='analyze writes a plot: needs matplotlib (timm-ext[analysis])')


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@needs_matplotlib
def test_writes_json_csv_and_plot(capsys, tmp_path, image_folder):
    out_dir = tmp_path / 'out'
    code, out, err = run(capsys, 'analyze', 'attention', *TINY, '--data', str(image_folder), '--out', str(out_dir),
                         '--batches', '2', '--batch-size', '4', '--no-progress')
    assert code == 0, err
    data = json.loads((out_dir / 'attention.json').read_text())
    assert data['metric'] == 'attention' and len(data['entropy']) == 2 and len(data['entropy'][0]) == 2
    assert (out_dir / 'attention.csv').read_text().splitlines()[0] == 'layer,head,entropy,distance'
    assert (out_dir / 'attention.png').stat().st_size > 0
    assert f'json: {out_dir / "attention.json"}' in out


@needs_matplotlib
def test_loss_metrics_use_the_training_split(capsys, tmp_path, image_folder):
    (image_folder / 'train' / '0' / '0.png').unlink()  # 8 training images vs 9 validation images
    out_dir = tmp_path / 'out'
    code, _, err = run(capsys, 'analyze', 'landscape', *TINY, '--data', str(image_folder), '--out', str(out_dir),
                       '--batches', '5', '--batch-size', '4', '--steps', '3', '--no-progress')
    assert code == 0, err
    rows = (out_dir / 'landscape.csv').read_text().splitlines()
    assert rows[0] == 'alpha,loss' and len(rows) == 4


def test_unknown_metric_lists_the_valid_ones(capsys):
    code, _, err = run(capsys, 'analyze', 'entropy', *TINY)
    assert code == 2
    assert err.strip().splitlines() == [
        "timm-ext analyze: error: unknown metric 'entropy': choose one of attention, tokens, hessian, trace, density, "
        "noise, fourier, variance, landscape, landscape2d, cka, lesion, activity"]


def test_bad_checkpoint_names_the_file(capsys, tmp_path):
    missing = tmp_path / 'nope.pth.tar'
    code, _, err = run(capsys, 'analyze', 'tokens', *TINY, '--checkpoint', str(missing))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(missing) in err
    garbage = tmp_path / 'bad.pth.tar'
    garbage.write_bytes(b'not a checkpoint')
    code, _, err = run(capsys, 'analyze', 'tokens', *TINY, '--checkpoint', str(garbage))
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(garbage) in err


@pytest.mark.parametrize('argv, message', [
    (['analyze', 'tokens'], 'name a model with --model NAME'),
    (['analyze', 'tokens', '--model', 'no_such_model'], "unknown model 'no_such_model'"),
    (['analyze', 'tokens', *TINY, 'oops'], "--model-kwargs takes KEY=VALUE pairs, got 'oops'"),
    (['analyze', 'tokens', *TINY, '--other-model', 'vit_tiny_patch16_224'], 'for the cka metric only'),
    (['analyze', 'tokens', *TINY, '--data', '/no/such/dir'], '--data must be "digits" or an ImageFolder directory'),
    (['analyze', 'tokens', *TINY, '--batches', '0'], '--batches must be a positive integer, got 0'),
])
def test_one_line_errors(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_density_takes_runs_not_samples(capsys):
    code, _, err = run(capsys, 'analyze', 'density', *TINY, '--samples', '3')
    assert code == 2
    assert err.strip() == 'timm-ext analyze: error: density counts Lanczos runs with --runs N, not --samples'


@needs_matplotlib
def test_a_run_folder_gives_the_model_and_its_preprocessing(capsys, tmp_path, image_folder):
    import argparse

    import timm
    import torch

    kwargs = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2)
    model = timm.create_model('vit_tiny_patch16_224', num_classes=3, **kwargs)
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    args = argparse.Namespace(model='vit_tiny_patch16_224', model_kwargs=kwargs, num_classes=3, input_size=[3, 16, 16],
                              mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0], interpolation='bilinear', crop_pct=1.0)
    torch.save({'state_dict': model.state_dict(), 'arch': 'vit_tiny_patch16_224', 'args': args},
               run_dir / 'last.pth.tar')
    code, _, err = run(capsys, 'analyze', 'attention', '--checkpoint', str(run_dir), '--data', str(image_folder),
                       '--out', str(tmp_path / 'out'), '--batches', '1', '--batch-size', '2', '--no-progress')
    assert code == 0, err
    assert err.splitlines()[0] == (
        'timm-ext analyze: note: from run/last.pth.tar: model vit_tiny_patch16_224, num_classes 3, in_chans 3, '
        'img_size 16, patch_size 4, embed_dim 16, depth 2, num_heads 2, mean [0.0, 0.0, 0.0], std [1.0, 1.0, 1.0], '
        'interpolation bilinear, crop_pct 1.0, input_size (3, 16, 16)')
    code, _, err = run(capsys, 'analyze', 'attention', '--checkpoint', str(run_dir), '--best', '--no-progress')
    assert code == 2 and err.splitlines() == [
        f'timm-ext analyze: error: run folder {run_dir} has no model_best.pth.tar (it has last.pth.tar): give a '
        f'checkpoint file with --checkpoint']


def test_load_batches_takes_the_runs_preprocessing(image_folder):
    import timm

    from timm_ext.analysis.runner import load_batches

    model = timm.create_model('vit_tiny_patch16_224', img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2)
    plain = {'mean': (0.0,) * 3, 'std': (1.0,) * 3, 'input_size': (3, 8, 8), 'crop_pct': 1.0}
    ((x, _),) = load_batches(str(image_folder), 'validation', 2, 1, model, data_config=plain)
    assert tuple(x.shape) == (2, 3, 8, 8) and 0.0 <= x.min() and x.max() <= 1.0  # no ImageNet normalisation
    ((y, _),) = load_batches(str(image_folder), 'validation', 2, 1, model,
                             data_config=dict(plain, mean=(0.5,) * 3))
    assert torch_allclose(y, x - 0.5)


def torch_allclose(a, b):
    import torch
    return torch.allclose(a, b, atol=1e-6)
