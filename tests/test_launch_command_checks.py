"""timm_ext.launch.command_checks: what ``timm-ext train`` / ``validate`` refuse before timm's script starts, and
what they must not refuse.

Each refusal is tested with the command a user would type (``timm_ext.cli.main`` with ``--dry-run``)
against ImageFolders built here from 8x8 PNGs: exit code 2 and the exact one-line message; the checks of the
arguments themselves also through :func:`check_train_args` / :func:`check_validate_args`. Valid
commands pass: every packaged recipe (at its paper's global batch, and on one CPU process with a
small batch), and the commands of README.md and docs/cli.md. Scripts come from TIMM_EXT_TIMM_TRAIN
(default ../shared/timm-train/v1.0.28); the network is never used.
"""
import inspect
import io
import re
import shlex
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from _cli import run_cli
from _sam_settings_cases import BAD, GOOD, case_id, factory_error
from _timm_train import SCRIPTS_DIR, TRAIN_PY, VALIDATE_PY
from conftest import require_timm_script
from timm.models.swin_transformer import SwinTransformer

from timm_ext.launch.command_checks import check_train_args, check_train_command, check_validate_args
from timm_ext.launch.timm_scripts import load_script_parser
from timm_ext.recipes import find_recipe, list_recipes, load_paper_values, load_recipe, packaged_row

REPO = Path(__file__).resolve().parents[1]
KINDS = '.jpeg, .jpg, .png'


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new('RGB', (8, 8), (120, 30, 200)).save(out, format='PNG')
    return out.getvalue()


PNG = _png()


def image_folder(root: Path, images: Dict[str, int], classes: int = 2) -> Path:
    """``root/<split>/c<k>/<i>.png``: ``images[split]`` PNGs per class (one PNG's bytes, written once per file)."""
    for split, count in images.items():
        for k in range(classes):
            folder = root / split / f'c{k}' if split else root / f'c{k}'
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                (folder / f'{i}.png').write_bytes(PNG)
    return root


@pytest.fixture(autouse=True)
def _offline(offline_scripts, monkeypatch):
    """A private cache, no network, and timm's real scripts (or skip)."""
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(SCRIPTS_DIR))


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)


@pytest.fixture
def cuda(monkeypatch):
    """A machine with CUDA, as far as the checks can tell (the commands only print, nothing runs on a GPU)."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)


@pytest.fixture
def tiny(tmp_path) -> Path:
    """train/ and validation/: two classes, 3 and 2 images each (6 training images)."""
    return image_folder(tmp_path / 'tiny', {'train': 3, 'validation': 2})


@pytest.fixture(scope='module')
def big(tmp_path_factory) -> Path:
    """256 training images in two classes: one process at batch 256, or the recipes' 128."""
    return image_folder(tmp_path_factory.mktemp('big'), {'train': 128, 'validation': 1})


@pytest.fixture(scope='module')
def train_parser():
    require_timm_script(TRAIN_PY)
    return load_script_parser(TRAIN_PY)


def cli(capsys, *argv):
    """(exit code, stdout, the lines of stderr without timm-ext's notes)."""
    code, out, err = run_cli(capsys, *argv)
    return code, out, [line for line in err.splitlines() if not line.startswith('timm-ext: note:')]


def refused(capsys, command: str, *argv) -> str:
    """The one error line of ``timm-ext COMMAND ARGV --dry-run``, which must exit 2 and print no command."""
    code, out, err = cli(capsys, command, *argv, '--dry-run')
    assert code == 2 and out == '' and len(err) == 1, (code, out, err)
    prefix = f'timm-ext {command}: error: '
    assert err[0].startswith(prefix), err
    return err[0][len(prefix):]


def passes(capsys, command: str, *argv) -> List[str]:
    """``timm-ext COMMAND ARGV --dry-run`` exits 0 and prints the command; its stderr lines."""
    code, out, err = cli(capsys, command, *argv, '--dry-run')
    assert code == 0 and out.strip(), (code, err)
    return err


# --- model -----------------------------------------------------------------------------------------

def test_unknown_model_names_the_close_ones(capsys, tiny):
    assert refused(capsys, 'train', '--model', 'vit_tiny_bc', '--data-dir', tiny, '--num-classes', '2', '-b', '2',
                   '--device', 'cpu') == (
        "--model 'vit_tiny_bc' is unknown to timm (with timm_ext imported): did you mean vit_tiny_cb, vit_tiny_cbs, "
        "vit_tiny_cb_all?")
    assert refused(capsys, 'train', '--model', 'qqqqqqqq', '--data-dir', tiny, '--num-classes', '2', '-b', '2',
                   '--device', 'cpu') == (
        "--model 'qqqqqqqq' is unknown to timm (with timm_ext imported): `timm-ext models` and timm.list_models() "
        "list the names")


def test_unknown_model_of_a_recipe(capsys, tiny, tmp_path):
    recipe = tmp_path / 'mine.yaml'
    recipe.write_text('device_modules: [timm_ext]\nmodel: resnet_18\n')
    error = refused(capsys, 'train', '-c', recipe, '--data-dir', tiny, '--num-classes', '2', '-b', '2',
                    '--device', 'cpu')
    # the closest three of timm's names (which ones after the first depends on the timm release)
    assert re.fullmatch(r"model 'resnet_18' of the recipe is unknown to timm \(with timm_ext imported\): did you "
                        r"mean resnet18, \w+, \w+\?", error), error


def test_a_model_registered_by_a_device_module(capsys, tiny, tmp_path, monkeypatch):
    (tmp_path / 'my_models.py').write_text(
        'from timm.models import register_model\nfrom timm.models.resnet import resnet18\n\n\n'
        '@register_model\ndef my_preflight_net(pretrained=False, **kwargs):\n    return resnet18(**kwargs)\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ['--model', 'my_preflight_net', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    passes(capsys, 'train', *args, '--device-modules', 'my_models')
    assert refused(capsys, 'train', *args, '--device-modules', 'no_such_models') == (
        "--device-modules 'no_such_models' cannot be imported (ModuleNotFoundError: No module named "
        "'no_such_models'): train.py imports it before it starts; install it or drop it")


def test_model_names_left_to_timm(capsys, tiny):
    """A pretrained tag, the Hub and a local folder: timm resolves (and reports) those itself."""
    for model in ('resnet18.a1_in1k', 'hf-hub:timm/resnet18.a1_in1k', 'local-dir:/nowhere/model'):
        passes(capsys, 'train', '--model', model, '--data-dir', tiny, '--num-classes', '2', '-b', '2',
               '--device', 'cpu')


# --- the input size --------------------------------------------------------------------------------

_VIT_AT_32 = "AssertionError: Input height (32) doesn't match model (224)."
_CONVSTEM_AT_32 = ('AssertionError: Input height 32 does not match the model img_size (224, 224); create the model '
                   'with this img_size or dynamic_img_size=True.')


def test_a_model_is_built_and_run_on_the_meta_device_once_for_many_checks(monkeypatch):
    """Checking many commands of one model (every recipe at its paper's batch, then on a laptop) builds it once and
    runs each size once; other kwargs build another; only the last few built are kept."""
    from timm_ext.launch import input_size

    builds, forwards = [], []
    build, run = input_size._build_meta_model, input_size._run_forward
    monkeypatch.setattr(input_size, '_BUILT', {})
    monkeypatch.setattr(input_size, '_build_meta_model', lambda m, kw: builds.append(m) or build(m, kw))
    monkeypatch.setattr(input_size, '_run_forward', lambda m, size: forwards.append(size) or run(m, size))
    tiny = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    a = input_size.meta_model('vit_tiny_cb', tiny)
    assert input_size.meta_model('vit_tiny_cb', dict(reversed(tiny.items()))) is a and builds == ['vit_tiny_cb']
    assert input_size._forward_error(a, (3, 32, 32)) is None and input_size._forward_error(a, (3, 32, 32)) is None
    assert input_size._forward_error(a, (3, 48, 48)).startswith('AssertionError: Input height (48)')
    assert forwards == [(3, 32, 32), (3, 48, 48)]
    assert input_size.meta_model('vit_tiny_cb', {**tiny, 'num_classes': 7}).num_classes == 7 and len(builds) == 2
    assert input_size.meta_model('no_such_model', {}) is None
    for depth in range(2, 2 + input_size._KEEP_BUILT):
        input_size.meta_model('vit_tiny_cb', {**tiny, 'depth': depth})
    assert len(input_size._BUILT) == input_size._KEEP_BUILT and input_size.meta_model('vit_tiny_cb', tiny) is not a


def test_an_input_size_a_vit_cannot_take(capsys, tiny, tmp_path):
    """The command a user types: a ViT built for 224 px at --img-size 32 is refused before train.py builds the model
    and the data (where it would stop at its first batch), with the fixes, each of them tried; and nothing is made."""
    args = ['--model', 'vit_tiny_patch16_224', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu',
            '--output', tmp_path / 'out']
    assert refused(capsys, 'train', *args, '--img-size', '32') == (
        f'--img-size 32: vit_tiny_patch16_224 does not take 32x32 images, it is built for 224x224 (train.py would '
        f'stop at its first batch: {_VIT_AT_32}): add --model-kwargs img_size=32 (or dynamic_img_size=True), or train '
        f'at its own size, --img-size 224')
    assert not (tmp_path / 'out').exists()
    passes(capsys, 'train', *args, '--img-size', '32', '--model-kwargs', 'img_size=32')
    passes(capsys, 'train', *args, '--img-size', '32', '--model-kwargs', 'dynamic_img_size=True')
    passes(capsys, 'train', *args, '--img-size', '224')
    # not square, with the user's other model_kwargs kept in the fix (a new --model-kwargs replaces them all)
    assert refused(capsys, 'train', *args, '--input-size', '3', '32', '48', '--model-kwargs', 'depth=2') == (
        "--input-size 3 32 48: vit_tiny_patch16_224 does not take 32x48 images, it is built for 224x224 (train.py "
        "would stop at its first batch: AssertionError: Input height (32) doesn't match model (224).): add "
        "--model-kwargs depth=2 img_size=(32,48) (or depth=2 dynamic_img_size=True), or train at its own size, "
        "--input-size 3 224 224")
    passes(capsys, 'train', *args, '--input-size', '3', '32', '48', '--model-kwargs', 'depth=2', 'img_size=(32,48)')


def test_an_input_size_of_the_recipe_or_of_the_pretrained_cfg(capsys, tiny, tmp_path):
    recipe = tmp_path / 'cifar_vit.yaml'
    recipe.write_text('device_modules: [timm_ext]\nmodel: vit_tiny_cb\nimg_size: 32\n')
    args = ['--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    assert refused(capsys, 'train', '-c', recipe, *args) == (
        f'img_size 32 of the recipe: vit_tiny_cb does not take 32x32 images, it is built for 224x224 (train.py would '
        f'stop at its first batch: {_VIT_AT_32}): add --model-kwargs img_size=32 (or dynamic_img_size=True), or '
        f'train at its own size, --img-size 224')
    # built for 32 px by its model_kwargs, no size given: train.py takes the pretrained cfg's 224 for the data
    assert refused(capsys, 'train', '--model', 'vit_tiny_patch16_224', '--model-kwargs', 'img_size=32', *args) == (
        "no --img-size or --input-size, so train.py feeds vit_tiny_patch16_224 224x224 images (its pretrained cfg's "
        "input_size), but the model (--model-kwargs img_size=32) is built for 32x32 and does not take them (train.py "
        "would stop at its first batch: AssertionError: Input height (224) doesn't match model (32).): add "
        "--img-size 32")
    passes(capsys, 'train', '--model', 'vit_tiny_patch16_224', '--model-kwargs', 'img_size=32', '--img-size', '32',
           *args)


# release-aware, because timm differs: timm 1.0.31's SwinTransformer takes dynamic_img_size, 1.0.23's and 1.0.28's do
# not, so there the check rightly offers one fix fewer
_SWIN_DYNAMIC = ' (or dynamic_img_size=True)' if 'dynamic_img_size' in inspect.signature(SwinTransformer).parameters \
    else ''


@pytest.mark.parametrize('model, error, fixes', [pytest.param(*case, id=case[0]) for case in [
    ('vit_tiny_patch16_224', _VIT_AT_32, 'img_size=32 (or dynamic_img_size=True)'),
    ('deit_tiny_patch16_224', _VIT_AT_32, 'img_size=32 (or dynamic_img_size=True)'),
    ('swin_tiny_patch4_window7_224', _VIT_AT_32, 'img_size=32' + _SWIN_DYNAMIC),
    ('vit_tiny_cb', _VIT_AT_32, 'img_size=32 (or dynamic_img_size=True)'),
    ('vit_small_convstem', _CONVSTEM_AT_32, 'img_size=32 (or dynamic_img_size=True)'),
    ('mixer_s16_cb', _VIT_AT_32, 'img_size=32'),  # no dynamic_img_size in MLP-Mixer: not offered
    ('pit_b_cb', 'RuntimeError', 'img_size=32'),  # a long broadcast error: its type only
    ('volo_d1_convstem', _CONVSTEM_AT_32, 'img_size=32'),
]])
def test_models_built_for_224_at_32(train_parser, tiny, model, error, fixes):
    """timm's and timm-ext's fixed-size models, each at a size it cannot take; a real forward on the CPU agrees with
    the check's meta-device one, refused and fixed."""
    import timm

    argv = ['--model', model, '--img-size', '32', '--data-dir', str(tiny), '--num-classes', '2', '-b', '2',
            '--device', 'cpu']
    assert check_train_command(train_parser, argv, cuda_available=False).problems == [
        f'--img-size 32: {model} does not take 32x32 images, it is built for 224x224 (train.py would stop at its '
        f'first batch: {error}): add --model-kwargs {fixes}, or train at its own size, --img-size 224']
    text = error.partition(': ')[2]
    with torch.no_grad(), pytest.raises(Exception, match=re.escape(text) if text else None):
        timm.create_model(model, num_classes=2).eval()(torch.zeros(1, 3, 32, 32))
    fixed = argv + ['--model-kwargs', fixes.split()[0]]
    assert check_train_command(train_parser, fixed, cuda_available=False).problems == []
    with torch.no_grad():
        assert timm.create_model(model, num_classes=2, img_size=32).eval()(torch.zeros(1, 3, 32, 32)).shape == (1, 2)


@pytest.mark.parametrize('model, size', [
    ('resnet50', ['--img-size', '32']),
    ('resnet18', ['--input-size', '3', '40', '56']),
    ('alternet_50_cifar', ['--img-size', '64']),
    ('alternet_50_cifar', ['--img-size', '224']),
    ('vit_tiny_patch16_224', ['--img-size', '48', '--model-kwargs', 'dynamic_img_size=True']),
    ('vit_tiny_cb', ['--img-size', '48', '--model-kwargs', 'dynamic_img_size=True']),
    ('vit_small_convstem', ['--img-size', '96', '--model-kwargs', 'dynamic_img_size=True']),
    ('deit_tiny_patch16_224', ['--input-size', '3', '32', '48', '--model-kwargs', 'img_size=(32,48)']),
    ('swin_tiny_patch4_window7_224', ['--img-size', '32', '--model-kwargs', 'img_size=32']),
    ('mixer_s16_cb', ['--img-size', '32', '--model-kwargs', 'img_size=32']),
    ('pit_b_cb', ['--img-size', '32', '--model-kwargs', 'img_size=32']),
    ('volo_d1_convstem', ['--img-size', '32', '--model-kwargs', 'img_size=32']),
    ('vit_tiny_cb', ['--model-kwargs', 'patch_size=8']),  # its pretrained cfg's 224, divisible by 8
])
def test_sizes_a_model_takes_pass(train_parser, tiny, model, size):
    argv = ['--model', model, *size, '--data-dir', str(tiny), '--num-classes', '2', '-b', '2', '--device', 'cpu']
    assert check_train_command(train_parser, argv, cuda_available=False).problems == []


# --- data ------------------------------------------------------------------------------------------

def test_no_data_dir(capsys):
    assert refused(capsys, 'train', '--model', 'resnet18', '--num-classes', '2', '--device', 'cpu') == (
        'no --data-dir: train.py reads an ImageFolder, add --data-dir DIR with DIR/train/<class>/<image> and '
        f'DIR/validation/<class>/<image> ({KINDS})')


def test_data_dir_that_does_not_exist(capsys, tmp_path):
    missing = tmp_path / 'imagenet'
    assert refused(capsys, 'train', '--model', 'resnet18', '--data-dir', missing, '--device', 'cpu') == (
        f'--data-dir {missing} does not exist: it should be an ImageFolder, {missing}/train/<class>/<image> and '
        f'{missing}/validation/<class>/<image>')
    file = tmp_path / 'images.zip'
    file.write_bytes(b'')
    assert refused(capsys, 'train', '--model', 'resnet18', '--data-dir', file, '--device', 'cpu') == (
        f'--data-dir {file} is a file: it should be a folder (an ImageFolder, {file}/train/<class>/<image> and '
        f'{file}/validation/<class>/<image>) or a .tar of images')


def test_missing_validation_split(capsys, tmp_path):
    data = image_folder(tmp_path / 'data', {'train': 2})
    args = ['--model', 'resnet18', '--data-dir', data, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    assert refused(capsys, 'train', *args) == (
        f'--data-dir {data} has no folder for --val-split validation (looked for validation, val, valid, eval, '
        f'evaluation) but has train/: train.py would read all of {data}, train/ included; add '
        f'{data}/validation/<class>/<image>, or pass --val-split \'\' to train without validation')
    passes(capsys, 'train', *args, '--val-split', '')


def test_missing_train_split(capsys, tmp_path):
    data = image_folder(tmp_path / 'data', {'val': 2})
    assert refused(capsys, 'train', '--model', 'resnet18', '--data-dir', data, '--num-classes', '2', '-b', '2',
                   '--device', 'cpu') == (
        f'--data-dir {data} has no folder for --train-split train (looked for train, training) but has val/: '
        f'train.py would read all of {data}, val/ included; add {data}/train/<class>/<image>')


def test_split_without_images(capsys, tmp_path):
    data = image_folder(tmp_path / 'data', {'train': 2, 'validation': 0})
    assert refused(capsys, 'train', '--model', 'resnet18', '--data-dir', data, '--num-classes', '2', '-b', '2',
                   '--device', 'cpu') == (
        f'{data}/validation (--val-split validation) has no images ({KINDS}): it should hold '
        f'{data}/validation/<class>/<image>')
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert refused(capsys, 'train', '--model', 'resnet18', '--data-dir', empty, '--num-classes', '2', '-b', '2',
                   '--device', 'cpu', '--val-split', '') == (
        f'--data-dir {empty} has no images ({KINDS}) and no folder for --train-split train: it should hold '
        f'{empty}/train/<class>/<image>')


def test_layouts_timm_reads(capsys, tmp_path):
    """The splits' synonyms (val/, training/), class folders without splits (timm reads the root for both),
    a .tar, and the datasets timm's other readers find (left to train.py)."""
    synonyms = image_folder(tmp_path / 'synonyms', {'training': 2, 'val': 1})
    flat = image_folder(tmp_path / 'flat', {'': 2})
    tar = tmp_path / 'images.tar'
    tar.write_bytes(b'')
    for data in (synonyms, flat, tar):
        passes(capsys, 'train', '--model', 'resnet18', '--data-dir', data, '--num-classes', '2', '-b', '2',
               '--device', 'cpu')
    passes(capsys, 'train', '--model', 'resnet18', '--dataset', 'torch/cifar10', '--dataset-download',
           '--data-dir', tmp_path / 'cifar', '--num-classes', '10', '--device', 'cpu')
    passes(capsys, 'train', '--model', 'resnet18', '--dataset', 'hfds/some/dataset', '--device', 'cpu')


# --- an epoch without a step -----------------------------------------------------------------------

def test_fewer_images_than_the_batch(capsys, tiny):
    args = ['--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '--device', 'cpu']
    assert refused(capsys, 'train', *args, '-b', '8') == (
        f'6 training images in {tiny}/train, fewer than --batch-size 8: train.py drops the last partial batch, '
        f'so an epoch would take no step; use --batch-size 6 or less, or more images')
    passes(capsys, 'train', *args, '-b', '6')


def test_fewer_images_per_process_than_the_batch(capsys, tiny):
    """6 images on 4 processes: DistributedSampler gives each 2 (it pads), fewer than 3."""
    args = ['--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '--device', 'cpu',
            '--nproc-per-node', '4']
    assert refused(capsys, 'train', *args, '-b', '3') == (
        f'6 training images in {tiny}/train over 4 processes are 2 per process, fewer than --batch-size 3: train.py '
        f'drops the last partial batch, so an epoch would take no step; use --batch-size 2 or less, fewer processes, '
        f'or more images')
    code, _, err = cli(capsys, 'train', *args, '-b', '2', '--dry-run')  # enough images: then train.py's own limit
    # the train.py in use, named by its release (TIMM_EXT_TIMM_TRAIN: v1.0.23's in that lane)
    assert code == 2 and re.match(r'timm-ext train: error: train\.py of v[\d.]+ cannot run DDP on the CPU', err[-1])


def test_a_paper_recipe_on_a_small_folder(capsys, tiny):
    """vit_s16_sam's batch 128 on 6 images: today train.py fails with `updates_per_epoch must be set`."""
    assert refused(capsys, 'train', '-c', 'vit-sam/imagenet/vit_s16_sam', '--data-dir', tiny, '--num-classes', '2',
                   '--device', 'cpu', '--allow-batch-change') == (
        f'6 training images in {tiny}/train, fewer than --batch-size 128: train.py drops the last partial batch, '
        f'so an epoch would take no step; use --batch-size 6 or less, or more images')


def test_repeated_augmentation_on_one_process(capsys, big):
    assert refused(capsys, 'train', '-c', 'context-broadcasting/imagenet/vit_small_cb', '--data-dir', big,
                   '--num-classes', '2', '--device', 'cpu', '--grad-accum-steps', '8') == (
        "aug_repeats 3 of the recipe (repeated augmentation) needs several processes: timm's loader asserts on one; "
        "run --nproc-per-node N on N GPUs, or pass --aug-repeats 0")


# --- the global batch of a paper recipe ------------------------------------------------------------

def test_paper_recipe_at_another_global_batch(capsys, big):
    args = ['-c', 'vit-sam/imagenet/vit_s16_sam', '--data-dir', big, '--num-classes', '2', '--device', 'cpu']
    assert refused(capsys, 'train', *args) == (
        'recipe vit-sam/imagenet/vit_s16_sam trains at global batch 4096 (vit-sam Table 2), this command at 128 x '
        '1 process x 4 accumulation steps = 512: add --grad-accum-steps 32 or --nproc-per-node 8 on 8 GPUs, or pass '
        '--allow-batch-change to train at 512 (lr 0.003 unchanged: train.py does not rescale an explicit lr)')
    assert refused(capsys, 'train', *args, '-b', '256', '--grad-accum-steps', '1') == (
        'recipe vit-sam/imagenet/vit_s16_sam trains at global batch 4096 (vit-sam Table 2), this command at 256 x '
        '1 process x 1 accumulation step = 256: add --grad-accum-steps 16, or pass --allow-batch-change to train '
        'at 256 (lr 0.003 unchanged: train.py does not rescale an explicit lr)')
    assert passes(capsys, 'train', *args, '--grad-accum-steps', '32') == []
    assert passes(capsys, 'train', *args, '--allow-batch-change') == [
        'timm-ext train: warning: recipe vit-sam/imagenet/vit_s16_sam trains at global batch 4096 (vit-sam Table 2), '
        'this command at 128 x 1 process x 4 accumulation steps = 512 (--allow-batch-change; lr 0.003 unchanged: '
        'train.py does not rescale an explicit lr)']


def test_global_batch_with_the_lr_rule_of_the_recipe(capsys, big):
    """context-broadcasting's recipes set lr_base: train.py scales the lr with the batch by the paper's rule."""
    assert refused(capsys, 'train', '-c', 'context-broadcasting/imagenet/vit_small_cb', '--data-dir', big,
                   '--num-classes', '2', '--device', 'cpu', '--aug-repeats', '0') == (
        'recipe context-broadcasting/imagenet/vit_small_cb trains at global batch 1024 (context-broadcasting '
        'Table 5), this command at 128 x 1 process x 1 accumulation step = 128: add --grad-accum-steps 8 or '
        '--nproc-per-node 8 on 8 GPUs, or pass --allow-batch-change to train at 128 (train.py scales lr_base 0.001 '
        'at 1024 (linear) to lr 0.000125)')


def test_own_recipe_has_no_paper_batch(capsys, big, tmp_path):
    """A copy of a packaged recipe is the user's own: its global batch is not checked."""
    mine = tmp_path / 'vit_s16_sam.yaml'
    mine.write_text(find_recipe('vit-sam/imagenet/vit_s16_sam').read_text())
    assert passes(capsys, 'train', '-c', mine, '--data-dir', big, '--num-classes', '2', '--device', 'cpu') == []
    packaged = find_recipe('vit-sam/imagenet/vit_s16_sam')  # the packaged file by its path: checked
    code, _, err = cli(capsys, 'train', '-c', packaged, '--data-dir', big, '--num-classes', '2', '--device', 'cpu',
                       '--dry-run')
    assert code == 2 and 'trains at global batch 4096' in err[0]


# --- device ----------------------------------------------------------------------------------------

def test_cuda_without_cuda(capsys, tiny, tmp_path, no_cuda):
    cuda_line = ("--device is 'cuda' but CUDA is not available here (timm's scripts default to cuda): "
                 "add --device cpu")
    args = ['--data-dir', tiny, '--num-classes', '2', '-b', '2']
    assert refused(capsys, 'train', '--model', 'resnet18', *args) == cuda_line  # train.py's default
    recipe = tmp_path / 'gpu.yaml'
    recipe.write_text('device_modules: [timm_ext]\nmodel: resnet18\ndevice: cuda\n')
    assert refused(capsys, 'train', '-c', recipe, *args) == cuda_line  # the recipe's
    passes(capsys, 'train', '-c', recipe, *args, '--device', 'cpu')
    assert refused(capsys, 'validate', '--model', 'resnet18', '--data-dir', tiny) == cuda_line


# --- validate --------------------------------------------------------------------------------------

def test_validate_refusals(capsys, tiny, tmp_path):
    assert refused(capsys, 'validate', '--model', 'vit_tiny_bc', '--data-dir', tiny, '--device', 'cpu') == (
        "--model 'vit_tiny_bc' is unknown to timm (with timm_ext imported): did you mean vit_tiny_cb, vit_tiny_cbs, "
        "vit_tiny_cb_all?")
    assert refused(capsys, 'validate', '--model', 'vit_tiny_x*', '--data-dir', tiny, '--device', 'cpu') == (
        "--model 'vit_tiny_x*' matches no pretrained timm model (validate.py reads a pattern as the pretrained "
        "models to validate): see `timm.list_models('vit_tiny_x*', pretrained=True)`, or name one model")
    assert refused(capsys, 'validate', '--model', 'resnet18', '--device', 'cpu') == (
        f'no --data-dir: validate.py reads an ImageFolder, add --data-dir DIR with DIR/validation/<class>/<image> '
        f'({KINDS})')
    data = image_folder(tmp_path / 'data', {'train': 1})
    assert refused(capsys, 'validate', '--model', 'resnet18', '--data-dir', data, '--device', 'cpu') == (
        f'--data-dir {data} has no folder for --split validation (looked for validation, val, valid, eval, '
        f'evaluation) but has train/: validate.py would read all of {data}, train/ included; add '
        f'{data}/validation/<class>/<image>, or name its folder with --split')
    passes(capsys, 'validate', '--model', 'resnet18', '--data-dir', data, '--split', 'train', '--device', 'cpu')
    missing = tmp_path / 'missing.pth.tar'
    assert refused(capsys, 'validate', '--model', 'resnet18', '--data-dir', tiny, '--checkpoint', missing,
                   '--device', 'cpu') == f"checkpoint '{missing}' does not exist"


def test_validate_valid_commands(capsys, tiny, tmp_path):
    """A folder of checkpoints (validate.py validates each), a pattern, the data as validate.py's positional."""
    folder = tmp_path / 'checkpoints'
    folder.mkdir()
    passes(capsys, 'validate', '--model', 'resnet18', '--checkpoint', folder, '--data-dir', tiny, '--device', 'cpu')
    passes(capsys, 'validate', '--model', 'resnet18*', '--data-dir', tiny, '--device', 'cpu')
    passes(capsys, 'validate', str(tiny), '--model', 'vit_tiny_cb', '--device', 'cpu')


# --- valid commands are not refused ----------------------------------------------------------------

@pytest.fixture(scope='module')
def enough(tmp_path_factory) -> Path:
    """Images for any packaged recipe at its paper's layout (up to 128 per process on 32 processes)."""
    return image_folder(tmp_path_factory.mktemp('enough'), {'train': 2048, 'validation': 1})


def test_every_packaged_recipe_passes(train_parser, enough):
    """Each recipe as its paper trains it (its batch, on the processes its global batch needs, on GPUs), and on
    one CPU process with a small batch (--allow-batch-change: one warning for a paper recipe, and one for fp16 AMP
    on the CPU; no problem)."""
    rows = load_paper_values()
    names = list_recipes()
    assert len(names) >= 100
    for name in names:
        path = find_recipe(name)
        config = load_recipe(path)
        row = packaged_row(path, rows)
        processes = 1
        if row is not None:  # a paper recipe: the processes its paper's global batch needs at its batch
            per_step = config['batch_size'] * config.get('grad_accum_steps', 1)
            processes = row.global_batch // per_step
            assert processes * per_step == row.global_batch, name
        data = ['--data-dir', str(enough), '--num-classes', '2']
        found = check_train_command(train_parser, data, path, config, processes=processes, cuda_available=True,
                                    script_dir=SCRIPTS_DIR)
        assert found.problems == [] and found.warnings == [], (name, found)
        laptop = data + ['--device', 'cpu', '-b', '2', '--aug-repeats', '0']
        found = check_train_command(train_parser, laptop, path, config, allow_batch_change=True,
                                    cuda_available=False, script_dir=SCRIPTS_DIR)
        fp16 = bool(config.get('amp')) and config.get('amp_dtype', 'float16') == 'float16'  # slow on a CPU: warned
        assert found.problems == [] and len(found.warnings) == (row is not None) + fp16, (name, found)


def _documented_commands(path: Path) -> List[List[str]]:
    """The ``timm-ext train`` / ``validate`` commands of the bash blocks of ``path``, as argv after ``timm-ext``."""
    commands = []
    for block in re.findall(r'```bash\n(.*?)```', path.read_text(), flags=re.S):
        for line in block.replace('\\\n', ' ').splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:2] in (['timm-ext', 'train'], ['timm-ext', 'validate']):
                commands.append(argv[1:])
    return commands


@pytest.fixture(scope='module')
def imagenet_like(tmp_path_factory) -> Path:
    """1000 classes (a paper model's default head), 2 training images each: 2000 >= 8 processes x 127 + 1."""
    root = image_folder(tmp_path_factory.mktemp('imagenet'), {'train': 2}, classes=1000)
    return image_folder(root, {'validation': 1}, classes=1)


def test_documented_commands_pass(capsys, cuda, tmp_path, monkeypatch, imagenet_like):
    """The train and validate commands of README.md and docs/cli.md, as written, with their data folders made here
    (on a machine with CUDA where they do not pass --device cpu)."""
    data = image_folder(tmp_path / 'data', {'train': 13, 'validation': 1}, classes=10)  # 130 images: batch 128
    (tmp_path / 'my_recipe.yaml').write_text(find_recipe('examples/sam_minimal').read_text())
    run = tmp_path / 'output' / 'train' / 'run'  # a run train.py wrote: its checkpoints and args.yaml
    run.mkdir(parents=True)
    import argparse

    import timm
    model = timm.create_model('vit_tiny_cb', num_classes=10, img_size=32, patch_size=16, depth=1)
    for name in ('last.pth.tar', 'model_best.pth.tar'):
        torch.save({'state_dict': model.state_dict(), 'arch': 'vit_tiny_cb', 'args': argparse.Namespace(
            model='vit_tiny_cb', num_classes=10, model_kwargs={'img_size': 32, 'patch_size': 16, 'depth': 1},
            device='cpu', data_dir='data')}, run / name)
    (run / 'args.yaml').write_text('model: vit_tiny_cb\n')
    monkeypatch.chdir(tmp_path)
    places = {'/path/to/imagenet': str(imagenet_like), '/data/imagenet': str(imagenet_like), 'data': str(data)}
    commands = _documented_commands(REPO / 'README.md') + _documented_commands(REPO / 'docs' / 'cli.md')
    assert len(commands) >= 6
    refused_commands = []
    for argv in commands:
        code, out, err = cli(capsys, *[places.get(a, a) for a in argv], '--dry-run')
        if code != 0 or not out:
            refused_commands.append((shlex.join(['timm-ext', *argv]), err))
    assert refused_commands == []


# --- optimizer arguments, the output folder, --resume ---------------------------------------------

def test_opt_kwargs_the_optimizer_does_not_take(capsys, tiny, tmp_path):
    recipe = tmp_path / 'adamw_rho.yaml'
    recipe.write_text('device_modules: [timm_ext]\nopt: adamw\nopt_kwargs:\n  rho: 0.05\n')
    args = ['-c', recipe, '--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    assert refused(capsys, 'train', *args) == (
        "opt_kwargs key 'rho' is not an argument of the optimizer timm builds for opt 'adamw' (train.py would stop "
        "with TypeError): rho is a SAM setting; for SAM write opt: samadamw, else drop rho")
    code, out, _ = cli(capsys, 'recipes', 'check', recipe)
    assert code == 1 and "opt_kwargs key 'rho' is not an argument of the optimizer" in out
    assert refused(capsys, 'train', *args, '--opt', 'samadamw', '--opt-kwargs', 'rhoo=0.1') == (
        "opt_kwargs key 'rhoo' is not an argument of the optimizer timm builds for opt 'samadamw' (train.py would "
        "stop with TypeError): did you mean 'rho'?")
    # the SAM family takes its settings and its base optimizer's; the factory's own keywords pass everywhere
    passes(capsys, 'train', *args, '--opt', 'samadamw', '--opt-kwargs', 'rho=0.1', 'betas=(0.9,0.99)',
           'layer_decay=0.75')
    passes(capsys, 'train', *args, '--opt', 'sgd', '--opt-kwargs', 'nesterov=False', 'dampening=0.1')


def test_opt_kwargs_given_twice(capsys, tiny):
    args = ['--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    assert refused(capsys, 'train', *args, '--opt', 'adamw', '--opt-kwargs', 'lr=0.1') == (
        "opt_kwargs key 'lr' is also train.py's --lr (train.py passes both and stops with TypeError): set it with "
        "--lr (a recipe: `lr:` at the top level)")


def test_an_output_folder_train_py_cannot_make(capsys, tiny, tmp_path):
    args = ['--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    (tmp_path / 'a_file').write_text('mine')
    assert refused(capsys, 'train', *args, '--output', tmp_path / 'a_file' / 'runs') == (
        f'--output {tmp_path / "a_file" / "runs"}: {tmp_path / "a_file"} is a file, so train.py cannot make its '
        f'output folder {tmp_path / "a_file" / "runs"} there: choose another --output or --experiment')
    assert (tmp_path / 'a_file').read_text() == 'mine'
    assert refused(capsys, 'train', *args, '--output', tmp_path, '--experiment', 'a_file') == (
        f'--output {tmp_path}: {tmp_path / "a_file"} is a file, so train.py cannot make its output folder '
        f'{tmp_path / "a_file"} there: choose another --output or --experiment')
    if Path('/sys').is_dir():  # a file system nobody, root included, makes folders in
        assert refused(capsys, 'train', *args, '--output', '/sys/timm-ext-runs') == (
            '--output /sys/timm-ext-runs: train.py cannot create folders in /sys (Operation not permitted): choose '
            'another --output')
    passes(capsys, 'train', *args, '--output', tmp_path / 'new' / 'runs')
    assert not (tmp_path / 'new').exists() and not list(tmp_path.glob('.timm-ext-probe-*'))  # the probe is gone


def test_amp_in_float16_on_the_cpu_is_a_warning_with_the_measured_cost(capsys, tiny, monkeypatch):
    """train.py's --amp on the CPU autocasts to float16 without a scaler: it runs, several times slower per step
    (benchmarks/bench_amp_cpu.py); one warning line, and none for bfloat16 or on CUDA."""
    from timm_ext.launch import command_checks

    monkeypatch.setattr(command_checks, 'CPU_AMP_MEASURED', {
        'cpu': 'Some CPU', 'float16': {'vit_tiny_patch16_224': 4.5, 'resnet18': 28.0},
        'bfloat16': {'vit_tiny_patch16_224': 1.15, 'resnet18': 0.91}})
    args = ['--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--opt', 'samadamw']
    warnings = [line for line in passes(capsys, 'train', *args, '--device', 'cpu', '--amp') if 'warning' in line]
    assert warnings == [
        'timm-ext train: warning: --amp on the CPU: train.py autocasts to float16 (--amp-dtype float16, its default), '
        'measured 4.5x (vit_tiny_patch16_224) to 28x (resnet18) slower per SAM step than fp32 on Some CPU '
        '(benchmarks/bench_amp_cpu.py): drop --amp, or use --amp-dtype bfloat16 (1.15x and 0.91x there)']
    for quiet in (['--device', 'cpu', '--amp', '--amp-dtype', 'bfloat16'], ['--device', 'cpu']):
        assert not [line for line in passes(capsys, 'train', *args, *quiet) if 'warning' in line], quiet
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    assert not [line for line in passes(capsys, 'train', *args, '--device', 'cuda', '--amp') if 'warning' in line]


def _checkpoint(path: Path, opt: str, sam: bool, epoch: int = 2) -> Path:
    import argparse

    import timm
    model = timm.create_model('resnet18', num_classes=2)
    optimizer = {'state': {}, 'param_groups': [{'lr': 0.1, 'params': [0]}]}
    if sam:
        optimizer['sam'] = {'step': 3}
    torch.save({'state_dict': model.state_dict(), 'arch': 'resnet18', 'epoch': epoch, 'optimizer': optimizer,
                'args': argparse.Namespace(opt=opt, model='resnet18')}, path)
    return path


def test_resume_names_the_checkpoints_optimizer_and_refuses_a_mismatch(capsys, tiny, tmp_path):
    args = ['--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    adamw = _checkpoint(tmp_path / 'adamw.pth.tar', 'adamw', sam=False)
    sam = _checkpoint(tmp_path / 'sam.pth.tar', 'samadamw', sam=True)
    assert refused(capsys, 'train', *args, '--opt', 'samadamw', '--resume', adamw) == (
        f"--resume {adamw} holds the state of adamw (plain), and this run builds samadamw (SAM): train.py would "
        f"load one optimizer's state into the other; resume with --opt adamw, or add --no-resume-opt to load the "
        f"weights and start the optimizer fresh")
    assert refused(capsys, 'train', *args, '--opt', 'adamw', '--resume', sam).startswith(
        f'--resume {sam} holds the state of samadamw (SAM), and this run builds adamw (plain)')
    assert refused(capsys, 'train', *args, '--opt', 'sgd', '--resume', adamw).startswith(
        f'--resume {adamw} holds the state of adamw (plain), and this run builds sgd (plain)')
    assert f'timm-ext train: --resume {adamw}: weights and the state of adamw (plain), epoch 2: train.py continues ' \
           f'at epoch 3' in passes(capsys, 'train', *args, '--opt', 'adamw', '--resume', adamw)
    assert f'timm-ext train: --resume {adamw}: weights of resnet18, its optimizer state is not loaded ' \
           f'(--no-resume-opt), epoch 2: train.py continues at epoch 3' in passes(
               capsys, 'train', *args, '--opt', 'samadamw', '--resume', adamw, '--no-resume-opt')



def test_resume_of_another_architecture_is_one_line_naming_both(capsys, tiny, tmp_path):
    """A vit_tiny_cb checkpoint under --model resnet18: refused before anything is built (train.py would build
    resnet18, then stop in load_state_dict); the model is the checkpoint's ``arch``, else its run's args.yaml."""
    import argparse

    args = ['--model', 'resnet18', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    vit = tmp_path / 'vit.pth.tar'
    torch.save({'state_dict': {'cls_token': torch.zeros(1, 1, 4)}, 'arch': 'vit_tiny_cb', 'epoch': 0,
                'optimizer': {'state': {}, 'param_groups': []}, 'args': argparse.Namespace(opt='adamw')}, vit)
    assert refused(capsys, 'train', *args, '--opt', 'adamw', '--resume', vit) == (
        f'--resume {vit} holds the weights of vit_tiny_cb, and this run builds --model resnet18: train.py would '
        f'build resnet18, then stop in load_state_dict (missing and unexpected keys); resume with --model '
        f'vit_tiny_cb, or drop --resume to train resnet18 from scratch')
    (tmp_path / 'run').mkdir()
    bare = tmp_path / 'run' / 'last.pth.tar'  # a state_dict alone: its run's args.yaml names the model
    torch.save({'cls_token': torch.zeros(1, 1, 4)}, bare)
    (tmp_path / 'run' / 'args.yaml').write_text('model: vit_tiny_cb\nopt: adamw\n')
    assert refused(capsys, 'train', *args, '--resume', bare).startswith(
        f'--resume {bare} holds the weights of vit_tiny_cb, and this run builds --model resnet18:')
    # a pretrained tag is the same architecture: the optimizer's note, no refusal
    same = _checkpoint(tmp_path / 'same.pth.tar', 'adamw', sam=False)
    assert f'timm-ext train: --resume {same}: weights and the state of adamw (plain), epoch 2: train.py continues ' \
           f'at epoch 3' in passes(capsys, 'train', *args[:1], 'resnet18.a1_in1k', *args[2:], '--opt', 'adamw',
                                   '--resume', same)
    # another name for the same layout (the weights fit, key for key): resumed, not refused
    import timm
    small = timm.create_model('vit_tiny_patch16_224', num_classes=2, img_size=32)
    layout = tmp_path / 'layout.pth.tar'
    torch.save({'state_dict': small.state_dict(), 'arch': 'vit_tiny_patch16_224', 'epoch': 0}, layout)
    passes(capsys, 'train', '--model', 'vit_tiny_patch16_384', '--model-kwargs', 'img_size=32', '--img-size', '32',
           *args[2:], '--resume', layout)


def test_resume_is_named_with_the_other_problems(train_parser, tmp_path):
    """check_train_command runs every check at once: the checkpoint's optimizer among the data's problems, and
    the checkpoint's note when it fits."""
    adamw = _checkpoint(tmp_path / 'adamw.pth.tar', 'adamw', sam=False)
    argv = ['--model', 'resnet18', '--data-dir', str(tmp_path / 'nowhere'), '--device', 'cpu', '--resume', str(adamw)]
    found = check_train_command(train_parser, argv + ['--opt', 'samadamw'], cuda_available=False)
    assert [p.split(':')[0] for p in found.problems] == [f'--data-dir {tmp_path / "nowhere"} does not exist',
                                                          f'--resume {adamw} holds the state of adamw (plain), and '
                                                          f'this run builds samadamw (SAM)']
    found = check_train_command(train_parser, argv + ['--opt', 'adamw'], cuda_available=False)
    assert found.notes == [f'--resume {adamw}: weights and the state of adamw (plain), epoch 2: train.py continues '
                           f'at epoch 3']

# --- --initial-checkpoint ------------------------------------------------------------------------------

def _weights(path: Path, model: str, **kwargs) -> Path:
    """A bare state_dict of ``timm.create_model(model, **kwargs)`` (timm's test models: about a megabyte)."""
    import timm

    torch.save(timm.create_model(model, **kwargs).state_dict(), path)
    return path


def test_initial_checkpoint_of_another_class_count_is_refused_with_the_pretrained_path_route(capsys, tmp_path):
    """timm's create_model loads --initial-checkpoint strictly into the model of this run's --num-classes: a
    5-class checkpoint under --num-classes 10 ended in a 19-line size-mismatch traceback after train.py started;
    refused before, naming the head key, both shapes and train.py's route to fine-tune (which does pass)."""
    ten = image_folder(tmp_path / 'ten', {'train': 1, 'validation': 1}, classes=10)
    five = image_folder(tmp_path / 'five', {'train': 1, 'validation': 1}, classes=5)
    ckpt = _weights(tmp_path / 'five.pth', 'test_vit', num_classes=5)
    args = ['--model', 'test_vit', '-b', '2', '--device', 'cpu']
    assert refused(capsys, 'train', *args, '--data-dir', ten, '--num-classes', '10', '--initial-checkpoint', ckpt) == (
        f'--initial-checkpoint {ckpt}: head.weight is (5, 64) there but (10, 64) in test_vit with --num-classes 10, '
        f'and train.py loads it strictly (a size mismatch after building the model): to fine-tune, pass --pretrained '
        f'--pretrained-path {ckpt} instead (it drops a mismatched head)')
    passes(capsys, 'train', *args, '--data-dir', ten, '--num-classes', '10', '--pretrained', '--pretrained-path', ckpt)
    passes(capsys, 'train', *args, '--data-dir', five, '--num-classes', '5', '--initial-checkpoint', ckpt)
    # train.py's own checkpoint (EMA weights first, as timm reads it; DDP's module. prefix; its args Namespace)
    import argparse
    state = {f'module.{k}': v for k, v in torch.load(ckpt).items()}
    saved = tmp_path / 'model_best.pth.tar'
    torch.save({'state_dict': {}, 'state_dict_ema': state, 'arch': 'test_vit', 'args': argparse.Namespace(lr=0.1)},
               saved)
    assert refused(capsys, 'train', *args, '--data-dir', ten, '--num-classes', '10', '--initial-checkpoint',
                   saved).startswith(f'--initial-checkpoint {saved}: head.weight is (5, 64) there but (10, 64)')
    passes(capsys, 'train', *args, '--data-dir', five, '--num-classes', '5', '--initial-checkpoint', saved)


def test_initial_checkpoint_of_another_model_missing_or_unreadable_is_one_line(capsys, tiny, tmp_path):
    args = ['--model', 'test_vit', '--data-dir', tiny, '--num-classes', '2', '-b', '2', '--device', 'cpu']
    resnet = _weights(tmp_path / 'resnet.pth', 'test_resnet', num_classes=2)
    assert refused(capsys, 'train', *args, '--initial-checkpoint', resnet) == (
        f'--initial-checkpoint {resnet} does not fit test_vit: 78 model keys missing from it (first: cls_token); '
        f'92 keys the model does not have (first: conv1.0.weight): is it a checkpoint of test_vit? train.py '
        f'loads it strictly and would stop after building the model')
    vit = _weights(tmp_path / 'vit.pth', 'test_vit', num_classes=2, img_size=96)
    assert refused(capsys, 'train', *args, '--initial-checkpoint', vit) == (
        f'--initial-checkpoint {vit} does not fit test_vit: pos_embed is (1, 37, 64) there, (1, 101, 64) in the '
        f'model (1 tensors differ): build the model as the checkpoint was built (--model-kwargs, --img-size), or '
        f'start from a checkpoint of this model')
    assert refused(capsys, 'train', *args, '--initial-checkpoint', tmp_path / 'nope.pth') == (
        f'--initial-checkpoint {tmp_path / "nope.pth"} does not exist: train.py would build the model, then stop '
        f'(FileNotFoundError); give the weights file to start from')
    (tmp_path / 'text.pth').write_text('not weights')
    assert refused(capsys, 'train', *args, '--initial-checkpoint', tmp_path / 'text.pth').startswith(
        f'--initial-checkpoint {tmp_path / "text.pth"} cannot be read as train.py reads it '
        f'(timm.models.load_state_dict, weights only): {tmp_path / "text.pth"} is not a PyTorch checkpoint (it is '
        f'text: \'not weights\')')


# --- the arguments themselves (check_train_args, check_validate_args) ------------------------------

SAM_RECIPE = {'device_modules': ['timm_ext'], 'opt': 'samadamw', 'opt_kwargs': {'rho': 0.1, 'clip_grad': 1.0}}


def test_bce_loss_on_the_command_line(train_parser):
    """The recipe's bce_loss under the command line's smoothing and mixup (train.py v1.0.28's loss branches)."""
    (problem,) = check_train_args(train_parser, ['--device', 'cpu', '--smoothing', '0'], {'bce_loss': True})
    assert problem.startswith('bce_loss is true but smoothing is 0')
    assert check_train_args(train_parser, ['--device', 'cpu', '--mixup', '0.2'],
                            {'bce_loss': True, 'smoothing': 0}) == []


def test_no_cuda_without_device(train_parser):
    expected = ("--device is 'cuda' but CUDA is not available here (timm's scripts default to cuda): "
                "add --device cpu")
    assert check_train_args(train_parser, ['--model', 'resnet18'], cuda_available=False) == [expected]
    assert check_train_args(train_parser, ['--model', 'resnet18', '--device', 'cpu'], cuda_available=False) == []
    assert check_train_args(train_parser, ['--model', 'resnet18'], {'device': 'cpu'}, cuda_available=False) == []
    assert check_train_args(train_parser, ['--model', 'resnet18'], cuda_available=True) == []


def _empty_class_folders(root: Path, classes: int) -> Path:
    for split in ('train', 'validation'):
        for c in range(classes):
            (root / split / f'class{c}').mkdir(parents=True)
    return root


def test_image_folder_class_count(train_parser, tmp_path):
    data = _empty_class_folders(tmp_path / 'data', 3)
    base = ['--data-dir', str(data), '--device', 'cpu', '--model', 'test_resnet']
    assert check_train_args(train_parser, base + ['--num-classes', '3']) == []
    assert check_train_args(train_parser, base + ['--num-classes', '2']) == [
        f'the ImageFolder {data / "train"} has 3 classes but --num-classes is 2: add --num-classes 3']
    # not given: train.py keeps the model's own head (test_resnet has 1000 outputs)
    assert check_train_args(train_parser, base) == [
        f'the ImageFolder {data / "train"} has 3 classes but --num-classes is not given, so train.py keeps the '
        f'model\'s default of 1000: add --num-classes 3']
    assert check_train_args(train_parser, base, {'num_classes': 3}) == []  # from the recipe
    # a recipe's text is read as train.py reads it: set_defaults, then parse_args converts '3' to 3
    assert check_train_args(train_parser, base, {'num_classes': '3'}) == []
    assert check_train_args(train_parser, base, {'num_classes': '2'}) == [
        f'the ImageFolder {data / "train"} has 3 classes but --num-classes is 2: add --num-classes 3']
    assert check_train_args(train_parser, base + ['--num-classes', '2', '--class-map', 'map.txt']) == []  # mapped
    assert check_train_args(train_parser, base + ['--num-classes', '2', '--dataset', 'torch/cifar10']) == []


def test_baseline_over_a_sam_recipe(train_parser):
    argv = ['--device', 'cpu', '--opt', 'adamw']
    assert check_train_args(train_parser, argv, SAM_RECIPE) == [
        "--opt adamw replaces the recipe's SAM optimizer 'samadamw', but opt_kwargs still carry SAM's rho, "
        "clip_grad, which adamw does not take: give the baseline its own --opt-kwargs (a bare `--opt-kwargs` "
        "clears them; train.py's --clip-grad clips)"]
    assert check_train_args(train_parser, argv + ['--opt-kwargs'], SAM_RECIPE) == []
    assert check_train_args(train_parser, ['--device', 'cpu', '--opt', 'asamsgd'], SAM_RECIPE) == []  # still SAM
    assert check_train_args(train_parser, ['--device', 'cpu'], SAM_RECIPE) == []


@pytest.mark.parametrize('recipe_opt, opt_kwargs', [
    ('samadamw', {'interval': 5}),
    ('samadamw', {'m_sharpness': 32}),
    ('gsamadamw', {'rho_max': 0.05, 'rho_min': 0.0, 'alpha': 0.4}),
    ('looksamadamw', {'interval': 5, 'alpha': 0.7}),
])
def test_baseline_over_a_sam_recipe_every_sam_setting(train_parser, recipe_opt, opt_kwargs):
    """Every SAM-family setting left in opt_kwargs under a plain --opt is caught, not only rho and clipping."""
    recipe = {'device_modules': ['timm_ext'], 'opt': recipe_opt, 'opt_kwargs': opt_kwargs}
    problems = check_train_args(train_parser, ['--device', 'cpu', '--opt', 'adamw'], recipe)
    assert problems == [
        f"--opt adamw replaces the recipe's SAM optimizer {recipe_opt!r}, but opt_kwargs still carry SAM's "
        f"{', '.join(opt_kwargs)}, which adamw does not take: give the baseline its own --opt-kwargs (a bare "
        f"`--opt-kwargs` clears them; train.py's --clip-grad clips)"]


def test_baseline_that_takes_the_setting_is_not_refused(train_parser):
    """RMSprop has an ``alpha`` of its own: GSAM's alpha left in opt_kwargs is a valid (if odd) RMSprop argument."""
    recipe = {'device_modules': ['timm_ext'], 'opt': 'gsamadamw', 'opt_kwargs': {'alpha': 0.9, 'rho_max': 0.05}}
    assert check_train_args(train_parser, ['--device', 'cpu', '--opt', 'rmsprop'], recipe) == [
        "--opt rmsprop replaces the recipe's SAM optimizer 'gsamadamw', but opt_kwargs still carry SAM's rho_max, "
        "which rmsprop does not take: give the baseline its own --opt-kwargs (a bare `--opt-kwargs` clears them; "
        "train.py's --clip-grad clips)"]


@pytest.mark.parametrize('case', BAD, ids=case_id)
def test_a_bad_sam_setting_is_refused_in_the_optimizers_own_words(train_parser, case):
    """The settings' own checks, before train.py builds anything: each bad value is the one line (the text
    create_optimizer_v2 raises), from the recipe's opt_kwargs and from --opt-kwargs alike."""
    opt, opt_kwargs = case
    line = (f'opt_kwargs: {factory_error(opt, opt_kwargs)} (train.py would stop with this ValueError when it builds '
            f'the optimizer, after the model and the data)')
    assert check_train_args(train_parser, ['--device', 'cpu'], {'opt': opt, 'opt_kwargs': opt_kwargs}) == [line]
    if all(isinstance(v, (int, str)) or v is None for v in opt_kwargs.values()):  # what the command line can spell
        argv = ['--device', 'cpu', '--opt', opt, '--opt-kwargs', *[f'{k}={v!r}' for k, v in opt_kwargs.items()]]
        assert check_train_args(train_parser, argv) == [line]


@pytest.mark.parametrize('case', GOOD, ids=case_id)
def test_good_sam_settings_pass(train_parser, case):
    opt, opt_kwargs = case
    assert check_train_args(train_parser, ['--device', 'cpu'], {'opt': opt, 'opt_kwargs': opt_kwargs}) == []


def test_sam_settings_of_a_recipe_under_the_command_lines_optimizer(train_parser):
    """The settings are checked for the optimizer the command builds: a baseline --opt over a SAM recipe gets the
    leftover line, not the settings' (it does not take them at all); --opt-kwargs replaces the recipe's."""
    recipe = {'device_modules': ['timm_ext'], 'opt': 'samadamw', 'opt_kwargs': {'rho': -0.05}}
    assert check_train_args(train_parser, ['--device', 'cpu', '--opt', 'adamw'], recipe) == [
        "--opt adamw replaces the recipe's SAM optimizer 'samadamw', but opt_kwargs still carry SAM's rho, which "
        "adamw does not take: give the baseline its own --opt-kwargs (a bare `--opt-kwargs` clears them; train.py's "
        "--clip-grad clips)"]
    assert check_train_args(train_parser, ['--device', 'cpu', '--opt-kwargs', 'rho=0.05'], recipe) == []
    assert check_train_args(train_parser, ['--device', 'cpu', '--opt', 'gsamsgd'], recipe) == [  # GSAM has no rho
        "opt_kwargs key 'rho' is not an argument of the optimizer timm builds for opt 'gsamsgd' (train.py would stop "
        "with TypeError): did you mean 'rho_min'?"]


def test_command_line_sam_underscore_and_rejected_arguments(train_parser):
    assert check_train_args(train_parser, ['--device', 'cpu', '--opt', 'sam_sgd']) == [
        "opt 'sam_sgd' builds plain sgd in timm's optimizer factory (it keeps only the text after the last "
        "underscore), not SAM: write 'samsgd'"]
    assert check_train_args(train_parser, ['--no-such-argument']) == []  # train.py reports it itself


def test_validate_checks(tmp_path):
    parser = require_timm_script(VALIDATE_PY)
    missing = tmp_path / 'nope.pth.tar'
    assert check_validate_args(parser, ['--checkpoint', str(missing), '--device', 'cpu']) == [
        f'checkpoint {str(missing)!r} does not exist']
    missing.write_bytes(b'')
    assert check_validate_args(parser, ['--checkpoint', str(missing), '--device', 'cpu']) == []
    assert len(check_validate_args(parser, ['--model', 'resnet18'], cuda_available=False)) == 1
