"""The paper recipes in timm's real, unmodified train.py, and the `timm-ext recipes` actions over them.

Each family runs two optimizer steps through train.py on generated data: an ImageFolder for ImageNet recipes,
CIFAR in torchvision's own on-disk format (``cifar-10-batches-py`` / ``cifar-100-python`` pickles, written
here, never downloaded) for ``torch/cifar10`` / ``torch/cifar100``. Only the image size, the batch, the epochs
and the warmup are overridden; a probe module (loaded through the recipe's ``device_modules``) records what
train.py built from the recipe: the training transform, the mixup arguments, the loss and the optimizer.
"""
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import timm
import yaml
from _cli import run_cli
from _threads import child_threads
from _timm_train import TRAIN_PY
from test_recipes import CREATED_SAM, REPO, TRAIN_PY_TOO_NEW, make_image_folder

from timm_ext.recipes import (
    INDEX_MARKERS,
    build_index,
    format_recipe_table,
    load_paper_values,
    load_recipe,
    recipes_dir,
)

# Runs inside train.py (which runs as __main__): wraps the names train.py imported from timm to note what
# it builds from the recipe; torchvision's CIFAR md5 check is turned off for the generated pickles.
PROBE = '''
import json, os, sys
import torchvision.datasets.cifar
from timm.task import ClassificationTask

torchvision.datasets.cifar.check_integrity = lambda *args, **kwargs: True  # generated files, not the real ones
_main = sys.modules['__main__']
_seen = {}


def _save():
    with open(os.environ['RECIPE_PROBE_OUT'], 'w') as f:
        json.dump(_seen, f, default=repr)


def _wrap(name, note):
    original = getattr(_main, name)

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        note(out, *args, **kwargs)
        return out
    setattr(_main, name, wrapper)


def _loader(loader, dataset, *args, is_training=False, **kwargs):
    if is_training:
        _seen['dataset'] = type(dataset).__name__
        _seen['transform'] = repr(dataset.transform)
        _seen['erasing'] = [kwargs.get('re_prob'), kwargs.get('re_mode'), kwargs.get('re_count')]


def _mixup(out, **kwargs):
    _seen['mixup'] = kwargs


def _optimizer(optimizer, *args, **kwargs):
    opt = optimizer
    base = getattr(opt, 'base_optimizer', opt)
    group = base.param_groups[0]
    settings = getattr(opt, 'settings', None)  # a SAM's optimizer-wide settings (a plain optimizer has none)
    family = getattr(type(opt), 'family', type(opt))  # timm's registry holds FactorySAM, a subclass of SAM
    _seen['optimizer'] = dict(name=family.__name__, base=type(base).__name__,
                              lr=group['lr'], weight_decay=max(g['weight_decay'] for g in base.param_groups),
                              nesterov=group.get('nesterov'), betas=group.get('betas'), momentum=group.get('momentum'))
    _seen['sam_rho'] = [g.get('rho') for g in opt.param_groups][:1]
    _seen['sam_clip_grad'] = getattr(settings, 'clip_grad', None)
    _seen['sam_m_sharpness'] = getattr(settings, 'm_sharpness', None)


_wrap('create_loader', _loader)
_wrap('Mixup', _mixup)
_wrap('FastCollateMixup', _mixup)
_wrap('create_optimizer_v2', _optimizer)
_forward = ClassificationTask.forward


def forward(self, input, target):
    if 'criterion' not in _seen:
        c = self.criterion
        _seen['criterion'] = type(c).__name__
        _seen['criterion_args'] = {k: v for k, v in vars(c).items() if isinstance(v, (bool, int, float, str))}
        _seen['target'] = [str(target.dtype), list(target.shape)]
        _seen['input'] = list(input.shape)
        _save()
    return _forward(self, input, target)


ClassificationTask.forward = forward
'''


def _write_cifar(root: Path, num_classes: int, train: int = 4, test: int = 2) -> None:
    """torchvision's CIFAR files: pickled dicts of uint8 rows (N, 3072) and labels (python 3 pickles)."""
    rng = np.random.default_rng(0)

    def batch(n: int) -> Dict:
        labels = [int(i % num_classes) for i in range(n)]
        key = 'labels' if num_classes == 10 else 'fine_labels'
        return {'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8), key: labels}

    if num_classes == 10:
        folder = root / 'cifar-10-batches-py'
        files = {f'data_batch_{i}': batch(train if i == 1 else 0) for i in range(1, 6)}
        files.update(test_batch=batch(test), **{'batches.meta': {'label_names': [f'c{i}' for i in range(10)]}})
    else:
        folder = root / 'cifar-100-python'
        meta = {'fine_label_names': [f'c{i}' for i in range(100)]}
        files = {'train': batch(train), 'test': batch(test), 'meta': meta}
    folder.mkdir(parents=True)
    for name, content in files.items():
        with open(folder / name, 'wb') as f:
            pickle.dump(content, f)


def _two_steps(tmp_path: Path, recipe_name: str, edit: Dict, *args: str) -> Dict:
    """Two optimizer steps of a packaged recipe (with ``edit`` applied) through train.py; the probe's notes."""
    recipe = dict(load_recipe(recipes_dir() / f'{recipe_name}.yaml'), **edit)
    recipe['device_modules'] = list(recipe['device_modules']) + ['recipe_probe']
    (tmp_path / 'recipe_probe.py').write_text(PROBE)
    path = tmp_path / 'recipe.yaml'
    path.write_text(yaml.safe_dump(recipe))
    env = dict(os.environ, HF_HUB_OFFLINE='1', RECIPE_PROBE_OUT=str(tmp_path / 'probe.json'),
               OMP_NUM_THREADS=child_threads(),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO), os.environ.get('PYTHONPATH', '')]))
    cmd = [sys.executable, str(TRAIN_PY), '-c', str(path), '--data-dir', str(tmp_path / 'data'), '--device', 'cpu',
           '--epochs', '1', '--warmup-epochs', '0', '--workers', '1', '--log-interval', '1',
           '--output', str(tmp_path / 'out'), '--experiment', 'run', '--checkpoint-hist', '1', *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    log = proc.stdout + proc.stderr
    steps = [line for line in log.splitlines() if 'Train: 0 [' in line]
    assert len(steps) == 2 and '[   1/2 ' in steps[-1], steps  # two optimizer steps, the second logged
    seen = json.loads((tmp_path / 'probe.json').read_text())
    seen['log'] = log
    return seen


needs_train = [
    pytest.mark.slow,
    pytest.mark.skipif(not TRAIN_PY.is_file(), reason=f'timm train.py not at {TRAIN_PY} (set TIMM_EXT_TIMM_TRAIN)'),
    pytest.mark.skipif(TRAIN_PY_TOO_NEW, reason=f'the default train.py is timm v1.0.28\'s and needs timm >= 1.0.28 '
                       f'(installed {timm.__version__}); set TIMM_EXT_TIMM_TRAIN to your timm\'s train.py'),
]


def _marks(func):
    for mark in reversed(needs_train):
        func = mark(func)
    return func


@_marks
def test_alternet_cifar100_recipe_runs_with_its_augmentation_loss_and_optimizer(tmp_path):
    """how-do-vits-work CIFAR-100 AlterNet-50: the official code's DeiT-style pipeline (App A.1)."""
    _write_cifar(tmp_path / 'data', 100)
    seen = _two_steps(tmp_path, 'how-do-vits-work/cifar100/alternet_50', {}, '--batch-size', '2')
    assert seen['dataset'] == 'CIFAR100' and seen['input'] == [2, 3, 32, 32]
    t = seen['transform']
    assert 'scale=(0.5625, 1.0)' in t and 'ratio=(1.0, 1.0)' in t  # the pad-4 crop substitute
    assert 'RandAugment(n=2' in t and 'm=9' in t and 'mstd=1.0' in t
    assert 'ColorJitter' not in t and seen['erasing'][0] == 0.0  # code: color_jitter 0, re_prob 0 on CIFAR
    assert seen['mixup'] == dict(
        mixup_alpha=1.0, cutmix_alpha=0.8, cutmix_minmax=None, prob=1.0, switch_prob=0.5, mode='batch',
        label_smoothing=0.1, num_classes=100)
    assert seen['criterion'] == 'SoftTargetCrossEntropy' and seen['target'] == ['torch.float32', [2, 100]]
    opt = seen['optimizer']
    assert (opt['name'], opt['lr'], opt['weight_decay'], opt['betas']) == ('AdamW', 1.25e-4, 0.05, [0.9, 0.999])


@_marks
def test_resnet50_cifar10_recipe_runs(tmp_path):
    """how-do-vits-work CIFAR-10 ResNet-50 (the code's CIFAR stem), with CIFAR-10's statistics (the code's)."""
    _write_cifar(tmp_path / 'data', 10)
    seen = _two_steps(tmp_path, 'how-do-vits-work/cifar10/resnet50', {}, '--batch-size', '2')
    assert seen['dataset'] == 'CIFAR10' and seen['target'] == ['torch.float32', [2, 10]]
    assert 'mean: (0.4914, 0.4822, 0.4465)' in seen['log'] and 'std: (0.2023, 0.1994, 0.201)' in seen['log']
    assert seen['mixup']['num_classes'] == 10 and seen['criterion'] == 'SoftTargetCrossEntropy'


@_marks
def test_alternet_imagenet_recipe_runs(tmp_path):
    """how-do-vits-work ImageNet AlterNet-50 (6 MSAs): random erasing 0.25 'const', RandAugment mstd 0.5."""
    make_image_folder(tmp_path / 'data')
    seen = _two_steps(tmp_path, 'how-do-vits-work/imagenet/alternet_50', {}, '--img-size', '32', '--batch-size', '4',
                      '--num-classes', '2')
    t = seen['transform']
    assert seen['dataset'] == 'ImageDataset' and seen['input'] == [4, 3, 32, 32]
    assert 'scale=(0.08, 1.0)' in t and 'mstd=0.5' in t and seen['erasing'] == [0.25, 'const', 1]
    assert seen['mixup']['cutmix_alpha'] == 0.8 and seen['criterion'] == 'SoftTargetCrossEntropy'


@_marks
def test_vit_sam_imagenet_recipe_runs_sam_with_the_sigmoid_loss(tmp_path):
    """vit-sam ViT-S/16 + SAM: Inception crop + flip only, summed sigmoid loss, AdamW inside SAM (rho 0.1)."""
    make_image_folder(tmp_path / 'data')
    recipe = load_recipe(recipes_dir() / 'vit-sam/imagenet/vit_s16_sam.yaml')
    kwargs = [f'{k}={v}' for k, v in dict(recipe['model_kwargs'], img_size=32).items()]
    assert recipe['opt_kwargs']['m_sharpness'] == 32  # App H: 32 images per TPU core; 2 per chunk of the batch of 4
    edit = {'opt_kwargs': dict(recipe['opt_kwargs'], m_sharpness=2)}
    seen = _two_steps(tmp_path, 'vit-sam/imagenet/vit_s16_sam', edit, '--img-size', '32', '--batch-size', '4',
                      '--grad-accum-steps', '1', '--num-classes', '2', '--model-kwargs', *kwargs)
    t = seen['transform']
    assert 'scale=(0.08, 1.0)' in t and 'interpolation=bilinear' in t and 'RandomHorizontalFlip(p=0.5)' in t
    # colour jitter 0 is torchvision's no-op jitter (train.py's default 0.4 would jitter)
    assert 'ColorJitter(brightness=None, contrast=None, saturation=None, hue=None)' in t
    assert 'RandAugment' not in t and 'mixup' not in seen and seen['erasing'][0] == 0.0
    assert seen['criterion'] == 'BinaryCrossEntropy' and seen['target'][0] == 'torch.int64'
    assert seen['criterion_args']['sum_classes'] is True and seen['criterion_args']['smoothing'] == 1e-6
    opt = seen['optimizer']
    assert (opt['name'], opt['base'], opt['lr'], opt['weight_decay'], opt['betas']) == (
        'SAM', 'AdamW', 0.003, 0.3, [0.9, 0.999])
    assert seen['sam_rho'] == [0.1] and seen['sam_clip_grad'] == 1.0 and seen['sam_m_sharpness'] == 2
    assert CREATED_SAM in seen['log']


@_marks
def test_vit_sam_cifar_finetune_recipe_runs(tmp_path):
    """vit-sam CIFAR-100 fine-tuning (Table 9): SGD with classical momentum, no weight decay, softmax loss.
    Offline: the pretrained weights are not loaded (pretrained off), everything else is the recipe's."""
    _write_cifar(tmp_path / 'data', 100)
    seen = _two_steps(tmp_path, 'vit-sam/cifar100/vit_b16_sam_finetune', {'pretrained': False},
                      '--img-size', '32', '--batch-size', '2', '--model-kwargs', 'img_size=32')
    assert seen['dataset'] == 'CIFAR100' and seen['target'] == ['torch.int64', [2]]
    assert seen['criterion'] == 'CrossEntropyLoss' and 'mixup' not in seen
    opt = seen['optimizer']
    assert (opt['name'], opt['nesterov'], opt['momentum'], opt['lr'], opt['weight_decay']) == (
        'SGD', False, 0.9, 0.01, 0.0)
    assert 'ColorJitter(brightness=None, contrast=None, saturation=None, hue=None)' in seen['transform']
    assert 'RandAugment' not in seen['transform'] and seen['erasing'][0] == 0.0


def _assert_deit_regime(seen: Dict) -> None:
    """DeiT's pipeline, which the CB and scaled-ReLU papers follow: RandAugment, erasing, mixup + cutmix."""
    t = seen['transform']
    assert 'scale=(0.08, 1.0)' in t and 'interpolation=bicubic' in t
    assert 'RandAugment(n=2' in t and 'm=9' in t and 'mstd=0.5' in t and 'ColorJitter' not in t
    assert seen['erasing'] == [0.25, 'pixel', 1]
    assert seen['mixup'] == dict(
        mixup_alpha=0.8, cutmix_alpha=1.0, cutmix_minmax=None, prob=1.0, switch_prob=0.5, mode='batch',
        label_smoothing=0.1, num_classes=2)
    assert seen['criterion'] == 'SoftTargetCrossEntropy'


def _deit_regime_steps(tmp_path, recipe):
    """Two train.py steps of an ImageNet ``recipe`` on 32 px images of 2 classes, batch 4, one process (no repeated
    aug); the DeiT regime checked. Returns what the run saw."""
    make_image_folder(tmp_path / 'data')
    seen = _two_steps(tmp_path, recipe, {}, '--img-size', '32', '--batch-size', '4', '--num-classes', '2',
                      '--aug-repeats', '0', '--model-kwargs', 'img_size=32')
    _assert_deit_regime(seen)
    return seen


@_marks
def test_context_broadcasting_imagenet_recipe_runs_in_the_deit_regime(tmp_path):
    """CB ViT-S (Table 5): AdamW at 1e-3 per 1024 images, linearly scaled. One process: no repeated aug."""
    seen = _deit_regime_steps(tmp_path, 'context-broadcasting/imagenet/vit_small_cb')
    opt = seen['optimizer']
    assert (opt['name'], opt['weight_decay'], opt['betas']) == ('AdamW', 0.05, [0.9, 0.999])
    assert abs(opt['lr'] - 1e-3 * 4 / 1024) < 1e-12  # lr_base 1e-3 at 1024, linear: batch 4 here


@_marks
def test_scaled_relu_imagenet_recipe_runs_sam_on_the_conv_stem(tmp_path):
    """Scaled-ReLU Table 1, conv stem + SAM at lr 1e-3 (DeiT's lr per 512 images): SAM around AdamW."""
    seen = _deit_regime_steps(tmp_path, 'scaled-relu/imagenet/deit_small_conv_sam_lr1e-3')
    opt = seen['optimizer']
    assert (opt['name'], opt['base'], opt['weight_decay']) == ('SAM', 'AdamW', 0.05)
    assert abs(opt['lr'] - 1e-3 * 4 / 512) < 1e-12 and seen['sam_rho'] == [0.05]
    assert CREATED_SAM in seen['log']


# --- the `timm-ext recipes` actions over the paper recipes ----------------------------------------

def _cli(capsys, *argv: str) -> List:
    return list(run_cli(capsys, *argv))


def test_recipes_list_is_the_index_as_a_table(capsys):
    code, out, _ = _cli(capsys, 'recipes', 'list')
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ['recipe', 'table', 'row', 'model', 'batch', 'top1']
    row = next(line for line in lines if line.startswith('vit-sam/imagenet/vit_s16_sam '))
    assert row.split()[-3:] == ['vit_small_patch16_224', '4096', '78.1'] and 'ViT-S/16-SAM' in row
    assert any(line.split() == ['examples/sam_minimal'] for line in lines)  # no paper row: blank columns
    assert len(lines) == 1 + len(list((REPO / 'recipes').rglob('*.yaml')))
    code, out, _ = _cli(capsys, 'recipes', 'list', '--names')
    assert code == 0 and out.split() == sorted(out.split()) and 'how-do-vits-work/cifar100/alternet_50' in out.split()


_LONG = {'recipe': 'paper/ds/a_long_recipe_name_x', 'table': 'Table 12', 'row': 'A row description that is long',
         'model': 'vit_base_patch16_224.tag', 'global_batch': '512', 'expected_top1': '80.1'}


@pytest.mark.parametrize('width, header, row', [
    (None, 'recipe                         table     row                             model                     '
           'batch  top1',
     'paper/ds/a_long_recipe_name_x  Table 12  A row description that is long  vit_base_patch16_224.tag  512    80.1'),
    (100, 'recipe                         table     row                   model                     batch  top1',
     'paper/ds/a_long_recipe_name_x  Table 12  A row description...  vit_base_patch16_224.tag  512    80.1'),
    (90, 'recipe                         table     model                     batch  top1',
     'paper/ds/a_long_recipe_name_x  Table 12  vit_base_patch16_224.tag  512    80.1'),
    (60, 'recipe                         model             batch  top1',
     'paper/ds/a_long_recipe_name_x  vit_bas...24.tag  512    80.1'),
])
def test_format_recipe_table_narrows_to_a_width(width, header, row):
    """The paper row shortens first, then it and the table go; then the model shortens in its middle."""
    lines = format_recipe_table([_LONG, {'recipe': 'p/d/b'}], width).splitlines()
    assert lines == [header, row, 'p/d/b'] and max(map(len, lines)) <= (width or 110)


def test_recipes_list_fits_a_100_column_terminal(capsys, monkeypatch):
    """On a terminal 100 columns wide every line fits and every recipe name stays whole; --wide gives the table
    a pipe gets."""
    monkeypatch.setenv('COLUMNS', '100')
    _, piped, _ = _cli(capsys, 'recipes', 'list')
    monkeypatch.setattr(sys.stdout, 'isatty', lambda: True)
    code, out, err = _cli(capsys, 'recipes', 'list')
    lines = out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 100 < max(map(len, piped.splitlines()))
    assert lines[0].split() == ['recipe', 'model', 'batch', 'top1'] and len(lines) == len(piped.splitlines())
    assert [line.split()[0] for line in lines[1:]] == [line.split()[0] for line in piped.splitlines()[1:]]
    row = next(line for line in lines if line.startswith('vit-sam/cifar10/vit_b16_sam_finetune '))
    assert row.split() == ['vit-sam/cifar10/vit_b16_sam_finetune', 'vit_base_pa...4.sam_in1k', '512', '98.6']
    assert err == '(fitted to 100 columns: `timm-ext recipes list --wide` shows every column whole)\n'
    code, out, err = _cli(capsys, 'recipes', 'list', '--wide')
    assert (code, out, err) == (0, piped, '')


@pytest.mark.skipif(sys.platform == 'win32', reason='needs a pseudo-terminal')
@pytest.mark.slow
def test_recipes_list_in_a_real_terminal(tmp_path):
    """A pseudo-terminal 100 columns wide (no COLUMNS variable): the command reads its width from the terminal.
    (``python -m timm_ext`` runs, too; the Ctrl-C test of tests/test_launch_train_py_hooks.py starts ``python -m
    timm_ext train``, which starts train.py.)"""
    import fcntl
    import pty
    import struct
    import termios
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack('HHHH', 40, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ('COLUMNS', 'LINES')}
    with open(tmp_path / 'err', 'w') as err:
        proc = subprocess.run([sys.executable, '-m', 'timm_ext', 'recipes', 'list'], stdout=child_fd, stderr=err,
                              env=env, timeout=120)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the terminal is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    lines = b''.join(chunks).decode().replace('\r\n', '\n').splitlines()
    assert proc.returncode == 0 and lines[0].split() == ['recipe', 'model', 'batch', 'top1']
    assert len(lines) == 1 + len(list((REPO / 'recipes').rglob('*.yaml'))) and max(map(len, lines)) == 100
    assert (tmp_path / 'err').read_text().startswith('(fitted to 100 columns')


@pytest.mark.timm_free
def test_recipes_index_prints_and_writes(capsys, tmp_path, monkeypatch):
    code, out, _ = _cli(capsys, 'recipes', 'index')
    assert code == 0 and out == (REPO / 'recipes' / 'index.csv').read_text()
    assert len(out.splitlines()) == 1 + len(build_index()) == 1 + len(load_paper_values())
    code, out, _ = _cli(capsys, 'recipes', 'index', '--markdown')
    assert code == 0 and out.splitlines()[0] == '| recipe | paper | table | row | model | global batch | top-1 |'
    table = out
    monkeypatch.setattr('timm_ext.cli.recipes.recipes_dir', lambda: tmp_path)  # where the CLI writes
    (tmp_path / 'README.md').write_text(f'# x\n{INDEX_MARKERS[0]}\nold\n{INDEX_MARKERS[1]}\nrest\n')
    code, out, _ = _cli(capsys, 'recipes', 'index', '--write')
    assert code == 0 and out.strip() == str(tmp_path / 'index.csv')
    assert (tmp_path / 'index.csv').read_text() == (REPO / 'recipes' / 'index.csv').read_text()
    assert (tmp_path / 'README.md').read_text() == f'# x\n{INDEX_MARKERS[0]}\n{table}{INDEX_MARKERS[1]}\nrest\n'


@pytest.mark.skipif(not TRAIN_PY.is_file(), reason=f'timm train.py not found at {TRAIN_PY}')
def test_recipes_check_compares_with_the_paper(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(TRAIN_PY))
    code, out, _ = _cli(capsys, 'recipes', 'check', 'how-do-vits-work/cifar10/swin_ti_p1_w4')
    assert code == 0 and out.startswith('ok   ') and "Fig. C.1a 'Swin-Ti, patch 1, window 4, CIFAR-10'" in out
    mine = tmp_path / 'mine.yaml'
    recipe = load_recipe(recipes_dir() / 'how-do-vits-work/cifar10/swin_ti_p1_w4.yaml')
    recipe.pop('smoothing')
    recipe['reprob'] = 0.25
    mine.write_text(yaml.safe_dump(recipe))
    code, out, _ = _cli(capsys, 'recipes', 'check', str(mine))
    assert code == 0 and out.splitlines() == [f'ok   {mine}']  # not a packaged recipe: train.py's checks only
    code, out, _ = _cli(capsys, 'recipes', 'check', str(mine), '--against', 'how-do-vits-work/cifar10/swin_ti_p1_w4')
    assert code == 1 and out.splitlines() == [
        f'FAIL {mine}',
        "     reprob is 0.25 but Fig. C.1a has 0.0 (code cifar10_vit.yaml: re_prob 0.0 (App A.1 names Random "
        "Erasing; the code it defers to turns it off on CIFAR))"]  # smoothing: train.py's default 0.1 is the paper's
    code, _, err = _cli(capsys, 'recipes', 'check', str(mine), '--against', 'vit-sam/imagenet/nope')
    assert code == 2 and "no paper row for 'vit-sam/imagenet/nope'" in err
