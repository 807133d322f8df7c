"""timm's real train.py on CUDA (marker `cuda`), on an ImageFolder the test builds: SAM (`samadamw`) with --amp (fp16
and bf16), --channels-last and --torchcompile inductor for 2 epochs, one model of every family; the loss falls,
--resume continues and `timm-ext validate` reads the checkpoint. ``TIMM_EXT_CUDA_TESTS_ON=cpu`` runs two ViTs
on the CPU (no compile there)."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cuda import NO_CUDA, chosen_device
from _timm_train import SCRIPTS_DIR
from conftest import require_timm_script
from test_models import IMG_SIZE
from timm.models import model_entrypoint

pytestmark = pytest.mark.cuda

REPO = Path(__file__).resolve().parents[1]
# one model of each family, shrunk where the family allows it; fp16 and bf16 alternate over the families
FAMILY_RUNS = {
    'vit_tiny_cb': ['patch_size=4', 'depth=2'], 'vit_tiny_convstem': ['depth=2'], 'mixer_s16_cb': ['num_blocks=2'],
    'mixer_s8_224': ['num_blocks=2'], 'pit_b_cb': [], 'volo_d1_convstem': [], 'alternet_18_cifar': [],
    'resnet50_cifar': [],
}
# the CPU run of these bodies: fp16 and bf16, no compile (CPU convs in fp16 are too slow for the others)
ON_CPU = ('vit_tiny_cb', 'vit_tiny_convstem')


def _image_folder(root: Path) -> None:
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, count in (('train', 16), ('validation', 4)):
        for cls in range(3):
            folder = root / split / f'class{cls}'
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 128, (32, 32, 3), dtype=np.uint8)
                pixels[..., cls] = 255  # a learnable signal: the class is the bright channel
                Image.fromarray(pixels).save(folder / f'{i}.png')


def _start(argv, env, log: Path) -> subprocess.Popen:
    with open(log, 'w') as out:
        return subprocess.Popen([sys.executable, '-m', 'timm_ext', *argv], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _finish(procs, timeout=500):
    for name, (proc, log) in procs.items():
        assert proc.wait(timeout=timeout) == 0, f'{name}: ' + log.read_text()[-4000:]


def _summary(path: Path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope='module')
def family_runs(tmp_path_factory):
    """Every family's run, the families side by side (one train.py each): 2 epochs, then --resume for a third
    and `timm-ext validate` on the 2-epoch checkpoint. Returns the folder of each family's runs."""
    device = chosen_device()
    if device is None:
        pytest.skip(NO_CUDA)
    require_timm_script(SCRIPTS_DIR / 'train.py')
    require_timm_script(SCRIPTS_DIR / 'validate.py')
    names = [n for n in FAMILY_RUNS if device.type == 'cuda' or n in ON_CPU]
    root = tmp_path_factory.mktemp('train')
    _image_folder(root / 'data')
    env = dict(os.environ, HF_HUB_OFFLINE='1', TIMM_EXT_TIMM_TRAIN=str(SCRIPTS_DIR), OMP_NUM_THREADS='1')
    commands = {}
    for name in names:
        family = model_entrypoint(name).__module__.rsplit('.', 1)[-1]
        size = IMG_SIZE.get(family, 32)
        kwargs = FAMILY_RUNS[name] + ([f'img_size={size}'] if family in IMG_SIZE else [])
        model = ['--model', name, *(['--model-kwargs', *kwargs] if kwargs else []), '--img-size', str(size),
                 '--num-classes', '3', '--device', device.type, '--workers', '1', '-b', '8',
                 '--data-dir', str(root / 'data')]
        amp_dtype = 'float16' if list(FAMILY_RUNS).index(name) % 2 == 0 else 'bfloat16'
        train = ['train', *model, '--opt', 'samadamw', '--lr', '1e-3', '--warmup-epochs', '0', '--amp',
                 '--amp-dtype', amp_dtype, '--channels-last', '--output', str(root / name), '--log-interval', '100',
                 '--checkpoint-hist', '1']
        commands[name] = model, train
    compile_args = ['--torchcompile', 'inductor'] if device.type == 'cuda' else []
    _finish({n: (_start([*train, '--epochs', '2', '--experiment', 'run', *compile_args], env, root / f'{n}.run.log'),
                 root / f'{n}.run.log') for n, (_, train) in commands.items()})
    later = {}
    for n, (model, train) in commands.items():
        checkpoint = str(root / n / 'run' / 'last.pth.tar')
        later[f'{n} resume'] = (_start([*train, '--epochs', '3', '--experiment', 'resumed', '--resume', checkpoint],
                                       env, root / f'{n}.resumed.log'), root / f'{n}.resumed.log')
        later[f'{n} validate'] = (_start(['validate', *model, '--split', 'validation', '--checkpoint', checkpoint,
                                          '--amp', '--results-file', str(root / n / 'results.json'),
                                          '--results-format', 'json'], env, root / f'{n}.validate.log'),
                                  root / f'{n}.validate.log')
    _finish(later)
    return {n: root / n for n in names}, root, device


@pytest.mark.parametrize('name', list(FAMILY_RUNS))
def test_train_py_sam_amp_channels_last_compile_resume_and_validate(family_runs, name):
    folders, root, device = family_runs
    if name not in folders:
        pytest.skip(f'{name}: on CUDA only; the CPU run of these bodies trains {" and ".join(ON_CPU)}')
    log = (root / f'{name}.run.log').read_text()
    assert 'Created SAMAdamW (samadamw) optimizer' in log
    if device.type == 'cuda':
        assert 'Compiling task components with backend=inductor' in log
    run = _summary(folders[name] / 'run' / 'summary.csv')
    assert [int(r['epoch']) for r in run] == [0, 1]
    assert float(run[1]['train_loss']) < float(run[0]['train_loss']), run  # the loss falls

    assert 'Restoring optimizer state from checkpoint' in (root / f'{name}.resumed.log').read_text()
    assert [int(r['epoch']) for r in _summary(folders[name] / 'resumed' / 'summary.csv')] == [2]

    result = json.loads((folders[name] / 'results.json').read_text())
    assert result['model'] == name
    assert abs(result['top1'] - float(run[1]['eval_top1'])) < 1e-3, (result, run[1])
