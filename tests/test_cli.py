"""The ``timm-ext`` command line: wiring of every subcommand and every error message.

Commands run in-process through ``timm_ext.cli.main`` (``--dry-run`` prints the command train or
validate would run); one test runs ``python -m timm_ext``. Training with timm's real train.py and
validating the checkpoint with its real validate.py, the logged top-1 given back, is
tests/test_launch_from_run.py's. Scripts come from TIMM_EXT_TIMM_TRAIN (default
../shared/timm-train/v1.0.28); the network is never used.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
import timm
import torch
from _cli import run_cli, train_py_argv
from _timm_train import SCRIPTS_DIR, TRAIN_PY, VALIDATE_PY
from conftest import require_timm_script

from timm_ext.launch import timm_scripts as script_finder

REPO = Path(__file__).resolve().parents[1]
_TIMM_VERSION = tuple(int(p) for p in timm.__version__.split('.')[:3] if p.isdigit())
OWN_SUBCOMMANDS = ('train', 'validate', 'recipes', 'models', 'convert')


@pytest.fixture(autouse=True)
def _offline(offline_scripts):
    """Every test here runs with a private cache and no network."""


@pytest.fixture
def timm_scripts(monkeypatch):
    """TIMM_EXT_TIMM_TRAIN set to timm's real scripts (v1.0.28 by default), or skip."""
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(SCRIPTS_DIR))
    return SCRIPTS_DIR


@pytest.fixture
def data(tmp_path):
    """A tiny ImageFolder (train/ and validation/, two classes of two 8x8 PNGs each): the commands here need one
    (timm-ext refuses a train or validate command without its data, see tests/test_launch_command_checks.py)."""
    from PIL import Image

    for split in ('train', 'validation'):
        for cls in ('a', 'b'):
            (tmp_path / 'data' / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new('RGB', (8, 8)).save(tmp_path / 'data' / split / cls / f'{i}.png')
    return tmp_path / 'data'


@pytest.fixture
def module_mine(tmp_path, monkeypatch):
    """An importable module ``mine`` (a user's own models): timm-ext imports what the script would."""
    (tmp_path / 'mine.py').write_text('')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mine', raising=False)


cli = run_cli


def _errors(err: str, command: str):
    """The error lines of stderr (notes, e.g. which train.py runs, are left out)."""
    lines = [line for line in err.splitlines() if not line.startswith('timm-ext: note:')]
    assert all(line.startswith(f'timm-ext {command}: error: ') for line in lines), err
    return [line[len(f'timm-ext {command}: error: '):] for line in lines]


# --- wiring --------------------------------------------------------------------------------------

@pytest.mark.parametrize('command', OWN_SUBCOMMANDS)
def test_every_subcommand_has_help(capsys, command):
    code, out, _ = cli(capsys, command, '--help')
    assert code == 0 and out.startswith(f'usage: timm-ext {command}')


def test_unknown_subcommand(capsys):
    code, _, err = cli(capsys, 'frobnicate')
    assert code == 2 and "invalid choice: 'frobnicate'" in err


def test_extra_arguments_only_for_train_and_validate(capsys):
    code, _, err = cli(capsys, 'recipes', 'list', '--bogus')
    assert code == 2 and "unrecognized arguments for 'recipes': --bogus" in err


@pytest.mark.slow
def test_a_reader_that_leaves_early_gets_no_traceback():
    """``timm-ext recipes list | head -1``: the closed pipe ends the command quietly, as it does ``cat``."""
    proc = subprocess.Popen([sys.executable, '-m', 'timm_ext', 'recipes', 'list'], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, HF_HUB_OFFLINE='1'), bufsize=0)
    proc.stdout.close()  # the reader leaves before the table is written: the child's first write fails
    _, err = proc.communicate(timeout=120)
    assert b'Traceback' not in err and proc.returncode in (0, 141), err.decode()


def test_pyproject_ships_the_cli_and_every_package():
    tomllib = pytest.importorskip('tomllib')
    config = tomllib.loads((REPO / 'pyproject.toml').read_text())
    assert config['project']['scripts'] == {'timm-ext': 'timm_ext_cli:main'}
    setup = config['tool']['setuptools']
    # the entry point is a package beside timm_ext (its commands module is what timm_ext imports), not a module
    assert 'py-modules' not in setup and not (REPO / 'timm_ext_cli.py').exists()
    assert {'__init__.py', 'commands.py'} <= {p.name for p in (REPO / 'timm_ext_cli').glob('*.py')}
    dirs = {'timm_ext': REPO / 'timm_ext', 'timm_ext_cli': REPO / 'timm_ext_cli'}
    dirs.update({name: REPO / folder for name, folder in setup['package-dir'].items()})
    assert dirs['timm_ext._recipes'] == REPO / 'recipes' and dirs['timm_ext._patches'] == REPO / 'patches'
    # every folder Python could import as a package must be listed, or setuptools leaves it out (or warns)
    importable = set()
    for name, root in dirs.items():
        importable.add(name)
        for sub in root.rglob('*'):
            parts = sub.relative_to(root).parts
            if sub.is_dir() and all(p.isidentifier() for p in parts) and '__pycache__' not in parts:
                importable.add('.'.join((name,) + parts))
    assert set(setup['packages']) == importable
    assert '*.tsv' in setup['package-data']['timm_ext._data']
    assert '**/*.yaml' in setup['package-data']['timm_ext._recipes']


# --- train ---------------------------------------------------------------------------------------

def test_train_command_adds_timm_ext(capsys, timm_scripts, data, module_mine):
    small = ['--data-dir', str(data), '--num-classes', '2', '-b', '2']
    code, out, err = cli(capsys, 'train', '--dry-run', '--device', 'cpu', '--model', 'resnet18', *small)
    assert code == 0 and _errors(err, 'train') == []
    assert shlex.split(out) == [sys.executable, *train_py_argv(TRAIN_PY), '--device', 'cpu', '--model', 'resnet18',
                                *small, '--device-modules', 'timm_ext']
    code, out, _ = cli(capsys, 'train', '--dry-run', '--device', 'cpu', *small, '--device-modules', 'mine')
    assert shlex.split(out)[-5:] == ['--device-modules', 'mine', '--device-modules', 'timm_ext', 'mine']


def test_train_with_a_packaged_recipe(capsys, timm_scripts, data):
    small = ['--data-dir', str(data), '--num-classes', '2', '-b', '2']
    code, out, _ = cli(capsys, 'train', '-c', 'examples/sam_minimal', '--dry-run', '--device', 'cpu', *small)
    recipe = REPO / 'recipes' / 'examples' / 'sam_minimal.yaml'
    # the recipe loads timm_ext itself (device_modules: [timm_ext]): nothing added
    assert code == 0 and shlex.split(out) == [sys.executable, *train_py_argv(TRAIN_PY), '-c', str(recipe), '--device',
                                              'cpu', *small]


def test_train_nproc_runs_torchrun(capsys, timm_scripts):
    code, out, _ = cli(capsys, 'train', '--nproc-per-node', '2', '--no-check', '--dry-run', '--device', 'cuda')
    assert code == 0 and shlex.split(out) == [
        sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2', *train_py_argv(TRAIN_PY),
        '--device', 'cuda', '--device-modules', 'timm_ext']


def test_train_ddp_on_cpu_is_one_line(capsys, timm_scripts, data):
    code, _, err = cli(capsys, 'train', '--nproc-per-node', '2', '--dry-run', '--device', 'cpu', '--data-dir', data,
                       '--num-classes', '2', '-b', '2')
    assert code == 2 and [re.sub(r'^train\.py of v[\d.]+ ', 'train.py of vX ', e) for e in _errors(err, 'train')] == [
        'train.py of vX cannot run DDP on the CPU (it passes device_ids to DistributedDataParallel, which '
        'torch refuses for a CPU model): drop --nproc-per-node or train on GPUs']  # vX: TIMM_EXT_TIMM_TRAIN's release
    code, _, err = cli(capsys, 'train', '--nproc-per-node', '0', '--device', 'cpu')
    assert code == 2 and _errors(err, 'train') == ['--nproc-per-node must be at least 1, got 0']


def test_train_unknown_recipe(capsys, timm_scripts):
    code, out, err = cli(capsys, 'train', '-c', 'vit-sam/imagenet/nope', '--device', 'cpu')
    assert code == 2 and out == ''
    assert _errors(err, 'train') == [
        "unknown recipe 'vit-sam/imagenet/nope': not a file and not one of the "
        f"{len(list((REPO / 'recipes').rglob('*.yaml')))} packaged recipes (`timm-ext recipes list`)"]


def test_train_misconfigurations_stop_before_train_py(capsys, timm_scripts, tmp_path, data):
    recipe = tmp_path / 'recipe.yaml'
    recipe.write_text('device_modules: [timm_ext]\nopt: sam_adamw\nrho: 0.05\n')
    code, out, err = cli(capsys, 'train', '-c', recipe, '--dry-run', '--data-dir', data, '--num-classes', '2',
                         '-b', '2')
    errors = _errors(err, 'train')
    assert code == 2 and out == '' and len(errors) == 2 + (not torch.cuda.is_available())
    assert errors[0].startswith("recipe key 'rho' is not a train.py argument")
    assert errors[1].startswith("opt 'sam_adamw' builds plain adamw") and errors[1].endswith("write 'samadamw'")
    if not torch.cuda.is_available():
        assert errors[2].startswith("--device is 'cuda' but CUDA is not available here")
    code, out, _ = cli(capsys, 'train', '-c', recipe, '--dry-run', '--no-check')  # the user overrides
    start = 1 + len(train_py_argv(TRAIN_PY))
    assert code == 0 and shlex.split(out)[start:start + 2] == ['-c', str(recipe)]


def test_train_py_missing_offline(capsys, monkeypatch):
    def offline(url, timeout=30.0):
        raise urllib.error.URLError('no network')

    monkeypatch.setattr(script_finder, 'fetch_url', offline)
    code, _, err = cli(capsys, 'train', '--device', 'cpu')
    (error,) = _errors(err, 'train')
    assert code == 2 and error.startswith('could not download train.py of timm v1.0.')
    assert re.search(r'from https://raw\.githubusercontent\.com/huggingface/pytorch-image-models/v1\.0\.\d+/train\.py '
                     r'\(no network\); provide it in one of three other ways: --timm-train PATH, '
                     r'TIMM_EXT_TIMM_TRAIN=PATH .*, or save it as \S+/timm-train/v1\.0\.\d+/train\.py$', error)


def test_train_py_hash_mismatch(capsys, tmp_path):
    edited = tmp_path / 'train.py'
    edited.write_text('print("not timm")\n')
    code, _, err = cli(capsys, 'train', '--timm-train', edited, '--device', 'cpu')
    (error,) = _errors(err, 'train')
    assert code == 2 and error.startswith(f'--timm-train {edited}: its sha256 ')
    assert error.endswith('; pass --allow-unverified to run it anyway')


# --- validate ------------------------------------------------------------------------------------

def test_validate_command_imports_timm_ext_first(capsys, timm_scripts, tmp_path, data, module_mine):
    checkpoint = tmp_path / 'model.pth.tar'
    checkpoint.write_bytes(b'')
    code, out, _ = cli(capsys, 'validate', '--dry-run', '--no-run-args', '--import', 'mine', '--checkpoint',
                       checkpoint, '--device', 'cpu', '--data-dir', data)
    assert code == 0 and shlex.split(out) == [
        sys.executable, '-m', 'timm_ext.cli._child', 'timm_ext,mine', str(VALIDATE_PY),
        '--checkpoint', str(checkpoint), '--device', 'cpu', '--data-dir', str(data)]


def test_validate_nonexistent_checkpoint(capsys, timm_scripts, tmp_path, data):
    code, _, err = cli(capsys, 'validate', '--checkpoint', tmp_path / 'missing.pth.tar', '--device', 'cpu',
                       '--data-dir', data)
    assert code == 2 and _errors(err, 'validate') == [f"checkpoint '{tmp_path / 'missing.pth.tar'}' does not exist"]


def test_validate_py_hash_mismatch(capsys, timm_scripts):
    code, _, err = cli(capsys, 'validate', '--timm-validate', TRAIN_PY, '--device', 'cpu')
    (error,) = _errors(err, 'validate')
    assert code == 2 and error.startswith(f'--timm-validate {TRAIN_PY}: this is train.py of ')
    assert 'not validate.py' in error


# --- recipes -------------------------------------------------------------------------------------

def test_recipes_list_and_show(capsys):
    code, out, _ = cli(capsys, 'recipes', 'list', '--names')
    names = out.split()
    assert code == 0 and 'examples/sam_minimal' in names
    assert len(names) == len(list((REPO / 'recipes').rglob('*.yaml')))
    code, out, _ = cli(capsys, 'recipes', 'show', 'examples/sam_minimal')
    path = REPO / 'recipes' / 'examples' / 'sam_minimal.yaml'
    assert code == 0 and out == f'# {path}\n' + path.read_text()
    code, _, err = cli(capsys, 'recipes', 'show', 'examples/sam')
    assert code == 2 and 'did you mean examples/sam_minimal' in _errors(err, 'recipes')[0]


def test_recipes_check(capsys, timm_scripts, tmp_path):
    code, out, _ = cli(capsys, 'recipes', 'check')
    assert code == 0 and out.count('ok ') == len(list((REPO / 'recipes').rglob('*.yaml')))
    bad = tmp_path / 'bad.yaml'
    bad.write_text('device_modules: timm_ext\n')
    code, out, _ = cli(capsys, 'recipes', 'check', 'examples/sam_minimal', bad)
    assert code == 1 and out.splitlines() == [
        f'ok   {REPO / "recipes" / "examples" / "sam_minimal.yaml"}', f'FAIL {bad}',
        "     device_modules is the string 'timm_ext': train.py would import each of its characters; "
        "write a list: `device_modules: [timm_ext]`"]



def test_a_sam_setting_out_of_range_stops_recipes_check_and_train(capsys, timm_scripts, tmp_path, data):
    """`rho: -0.05` used to pass `recipes check` ("ok") and the pre-flight, then stop train.py when it built the
    optimizer, after the model and the data: now one line in both, the words create_optimizer_v2 raises."""
    from timm.optim import create_optimizer_v2

    with pytest.raises(ValueError) as raised:
        create_optimizer_v2(torch.nn.Linear(2, 2), 'samadamw', lr=0.1, rho=-0.05)
    line = (f'opt_kwargs: {raised.value} (train.py would stop with this ValueError when it builds the optimizer, after '
            f'the model and the data)')
    assert str(raised.value) == 'SAM rho must be a finite number >= 0, got rho=-0.05'
    recipe = tmp_path / 'bad_rho.yaml'
    recipe.write_text('device_modules: [timm_ext]\nmodel: resnet18\nopt: samadamw\nopt_kwargs:\n  rho: -0.05\n')
    code, out, _ = cli(capsys, 'recipes', 'check', recipe)
    assert code == 1 and out.splitlines() == [f'FAIL {recipe}', f'     {line}']
    small = ['--data-dir', str(data), '--num-classes', '2', '-b', '2', '--device', 'cpu', '--output', tmp_path / 'out']
    code, out, err = cli(capsys, 'train', '-c', recipe, *small)
    assert code == 2 and out == '' and _errors(err, 'train') == [line]
    code, out, err = cli(capsys, 'train', '--model', 'resnet18', '--opt', 'gsamsgd', '--opt-kwargs', 'rho_min=0.1',
                         'rho_max=0.04', *small)
    assert code == 2 and _errors(err, 'train') == [
        'opt_kwargs: GSAM rho_min must be <= rho_max, got rho_min=0.1 > rho_max=0.04 (train.py would stop with this '
        'ValueError when it builds the optimizer, after the model and the data)']
    assert not (tmp_path / 'out').exists()


# --- models --------------------------------------------------------------------------------------

def test_models_json_counts_against_independent_numbers(capsys):
    code, out, _ = cli(capsys, 'models', 'vit_tiny_cb', '--json')
    (info,) = json.loads(out)
    model = timm.create_model('vit_tiny_cb')
    # MACs of ViT-Ti/16 at 224 by hand: patch embedding, 12 blocks of (qkv, QK^T and AV, proj, MLP), head
    tokens, dim, hidden = 197, 192, 768
    block = tokens * dim * 3 * dim + 2 * tokens * tokens * dim + tokens * dim * dim + 2 * tokens * dim * hidden
    macs = 196 * (3 * 16 * 16) * dim + 12 * block + dim * 1000
    assert code == 0 and info['params'] == sum(p.numel() for p in model.parameters()) == 5_717_416
    assert info['gmacs'] == round(macs / 1e9, 4) == 1.2537
    assert (info['family'], info['input_size'], info['arxiv']) == ('Context Broadcasting', [3, 224, 224], '2210.08457')


def test_models_table_and_pattern(capsys):
    code, out, _ = cli(capsys, 'models', 'alternet_18*cifar')
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ['model', 'family', 'params', '(M)', 'GMACs', 'input', 'paper']
    assert [line.split()[0] for line in lines[1:]] == ['alternet_18_cifar', 'alternet_18_nomsa_cifar']
    assert all('32x32' in line and 'Park & Kim, ICLR 2022' in line for line in lines[1:])
    code, _, err = cli(capsys, 'models', 'convnext*')
    assert code == 2 and _errors(err, 'models')[0].startswith("no timm-ext model matches 'convnext*'")


def test_every_model_family_has_its_paper():
    from timm.models import model_entrypoint

    from timm_ext.catalog import FAMILIES, list_timm_ext_models
    modules = {model_entrypoint(name).__module__ for name in list_timm_ext_models()}
    assert modules <= set(FAMILIES), f'add to timm_ext.catalog.FAMILIES: {modules - set(FAMILIES)}'


# --- convert -------------------------------------------------------------------------------------

def _official_layout(ours):
    """Our AlterNet (basic-block) state_dict in the official code's layout, written from the converter's
    documented key map: stem, pre-activation conv blocks, MSA blocks (q/kv 1x1 convs, flipped relative
    position table), classifier."""
    official = {}
    blocks = {}
    for key, value in ours.items():
        match = re.match(r'stages\.(\d+)\.blocks\.(\d+)\.(.+)$', key)
        if match:
            blocks.setdefault((int(match.group(1)), int(match.group(2))), {})[match.group(3)] = value
        elif key == 'stem.conv.weight':
            official['layer0.layer0.0.weight'] = value
        else:
            official[key.replace('norm.', 'classifier.0.bn.').replace('head.fc.', 'classifier.0.dense.')] = value
    for (stage, index), block in blocks.items():
        prefix = f'layer{stage + 1}.{index}.'
        msa = 'attn.qkv.weight' in block
        for key, value in block.items():
            if key == 'attn.qkv.weight':
                inner = value.shape[0] // 3
                official[prefix + 'attn.attn.to_q.weight'] = value[:inner, :, None, None]
                official[prefix + 'attn.attn.to_kv.weight'] = value[inner:, :, None, None]
            elif key == 'attn.relative_position_bias_table':
                side = int(round(value.numel() ** 0.5))
                official[prefix + 'attn.pos_embedding'] = value.reshape(side, side).flip(0, 1)
            elif key.startswith('attn.proj.'):
                official[prefix + 'attn.attn.to_out.0.' + key.split('.')[-1]] = (
                    value[:, :, None, None] if value.ndim == 2 else value)
            else:
                renames = {'proj_in.': 'conv.'} if msa else {
                    'norm1.': 'bn.', 'norm2.': 'conv2.0.', 'conv2.': 'conv2.2.', 'downsample.conv.': 'shortcut.0.'}
                old = next((o for o in renames if key.startswith(o)), '')
                official[prefix + renames.get(old, '') + key[len(old):]] = value
    return official


def test_convert_official_checkpoint_round_trip(capsys, tmp_path):
    from safetensors.torch import load_file
    model = timm.create_model('alternet_18_cifar', num_classes=10)
    ours = {k: v.clone() for k, v in model.state_dict().items()}
    for v in ours.values():  # distinct values everywhere, so that any misplaced tensor shows
        if v.is_floating_point():
            v.copy_(torch.randn_like(v))
    snapshot = {'name': 'alternet_18', 'state_dict': _official_layout(ours), 'optimizer': {'state': {}}}
    assert not set(snapshot['state_dict']) & set(ours)  # really the other layout
    source, output = tmp_path / 'official.pth.tar', tmp_path / 'out' / 'alternet.safetensors'
    torch.save(snapshot, source)
    code, out, _ = cli(capsys, 'convert', source, output, '--model', 'alternet_18_cifar')
    assert code == 0 and out.startswith(f'wrote {output}: {len(ours)} tensors')  # num_classes=10 read from the head
    converted = load_file(str(output))
    assert set(converted) == set(ours) and all(torch.equal(converted[k], ours[k]) for k in ours)
    # the line convert prints to load the file builds the model with exactly these weights (head included)
    hint = out.splitlines()[1]
    assert hint.startswith('load it with timm.create_model(')
    loaded = eval(hint[len('load it with '):], {'timm': timm}).state_dict()
    assert all(torch.equal(loaded[k], ours[k]) for k in ours)
    code, _, err = cli(capsys, 'convert', source, output, '--model', 'alternet_18_cifar')
    assert code == 2 and _errors(err, 'convert') == [f"OUTPUT '{output}' exists; pass --force to overwrite it"]
    code, _, err = cli(capsys, 'convert', source, output, '--model', 'alternet_18_cifar', '--num-classes', '5',
                       '--force')
    assert code == 2 and 'does not match AlterNet' in _errors(err, 'convert')[0]  # the converter's own listing


def test_convert_bad_inputs(capsys, tmp_path):
    target = tmp_path / 'x.safetensors'
    code, _, err = cli(capsys, 'convert', tmp_path / 'missing.pth', target, '--model', 'alternet_18')
    assert code == 2 and _errors(err, 'convert') == [f"checkpoint '{tmp_path / 'missing.pth'}' does not exist"]
    source = tmp_path / 'pickled.pth'
    torch.save({'state_dict': {}, 'callback': _Opaque()}, source)  # an object weights_only refuses to unpickle
    code, _, err = cli(capsys, 'convert', source, target, '--model', 'alternet_18')
    (error,) = _errors(err, 'convert')
    assert code == 2 and error.startswith(f'cannot read {source} with torch.load(weights_only=True): ')
    code, _, err = cli(capsys, 'convert', source, tmp_path / 'x.pth', '--model', 'alternet_18')
    assert code == 2 and _errors(err, 'convert') == [f"OUTPUT '{tmp_path / 'x.pth'}' must end with .safetensors"]


class _Opaque:
    pass
