"""timm_ext._timm_backports: bugs of older timm releases, shown under them and fixed by ``import timm_ext``.

Each fix is checked in a throwaway virtualenv holding the timm release that has the bug (tests/_timm_venvs.py):
the bug shows without timm_ext, and the user's route works with it.
"""
import os
import subprocess
from pathlib import Path

import pytest
import timm
import torch
from _timm_venvs import venv_python

from timm_ext._timm_backports import LOADER_FIXED_IN, LOCAL_DIR_FIXED_IN, apply_backports, needs_fix

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / 'shared' / 'timm-train'


def _run(python: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE='1', PYTHONPATH=str(REPO), PYTHONWARNINGS='ignore::FutureWarning')
    return subprocess.run([str(python), '-c', code, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize('version, fixed_in, needed', [
    ('1.0.23', LOADER_FIXED_IN, True), ('1.0.28', LOADER_FIXED_IN, True), ('1.0.29', LOADER_FIXED_IN, False),
    ('1.0.29.dev0', LOADER_FIXED_IN, False), ('1.0.31', LOADER_FIXED_IN, False), ('1.1.0', LOADER_FIXED_IN, False),
    ('1.0.25', LOCAL_DIR_FIXED_IN, True), ('1.0.26', LOCAL_DIR_FIXED_IN, False),
    ('not-a-version', LOADER_FIXED_IN, False),
])
def test_which_releases_need_a_fix(version, fixed_in, needed):
    assert needs_fix(fixed_in, version) is needed


def test_the_installed_timm_gets_exactly_the_fixes_it_needs():
    """A current timm is left alone; an older one has the fixed functions in place of timm's (import timm_ext)."""
    import timm.data
    from timm.models import _builder
    expected = [name for name, fixed_in in (('timm.data.create_loader', LOADER_FIXED_IN),
                                            ('timm.models._builder.load_state_dict_from_path', LOCAL_DIR_FIXED_IN))
                if needs_fix(fixed_in)]
    assert apply_backports() == expected
    assert hasattr(timm.data.create_loader, '_timm_ext_backport') == ('timm.data.create_loader' in expected)
    assert hasattr(_builder.load_state_dict_from_path, '_timm_ext_backport') == (
        'timm.models._builder.load_state_dict_from_path' in expected)


LOADER = '''
import sys, torch, timm
from torch.utils.data import TensorDataset
if sys.argv[1] == 'timm_ext':
    import timm_ext
from timm.data import create_loader
dataset = TensorDataset(torch.rand(4, 3, 8, 8), torch.arange(4))
try:
    loader = create_loader(dataset, (3, 8, 8), batch_size=2, num_workers=0, use_prefetcher=False)
except ValueError as e:
    print('refused:', e)
else:
    print('batches:', sum(1 for _ in loader), 'persistent:', loader.persistent_workers)
    loader = create_loader(dataset, (3, 8, 8), batch_size=2, num_workers=1, use_prefetcher=False)
    print('with workers persistent:', loader.persistent_workers)
'''


@pytest.mark.slow
def test_create_loader_without_workers_under_timm_1_0_28():
    python = venv_python('1.0.28')
    bare = _run(python, LOADER, 'bare')
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert bare.stdout.strip() == 'refused: persistent_workers option needs num_workers > 0'  # timm's bug
    fixed = _run(python, LOADER, 'timm_ext')
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert fixed.stdout.split('\n')[:2] == ['batches: 2 persistent: False', 'with workers persistent: True']


def _torch_load_reads_safetensors(tmp_path: Path) -> bool:
    from safetensors.torch import save_file
    save_file({'x': torch.ones(1)}, tmp_path / 'probe.safetensors')
    try:
        return torch.equal(torch.load(tmp_path / 'probe.safetensors', weights_only=False)['x'], torch.ones(1))
    except Exception:
        return False


LOCAL_DIR = '''
import sys, timm, torch
from safetensors.torch import load_file
if sys.argv[2] == 'timm_ext':
    import timm_ext
try:
    model = timm.create_model('local-dir:' + sys.argv[1], pretrained=True)
except Exception as e:
    print('refused:', type(e).__name__, str(e).splitlines()[0])
else:
    saved = load_file(sys.argv[1] + '/model.safetensors')
    print('equal:', all(torch.equal(saved[k], v) for k, v in model.state_dict().items()))
'''


@pytest.mark.slow
def test_local_dir_safetensors_under_timm_1_0_23(tmp_path):
    from timm.models import save_for_hf
    model = timm.create_model('test_vit', num_classes=3)
    torch.nn.init.normal_(model.head.weight)
    save_for_hf(model, str(tmp_path / 'folder'), safe_serialization='both')
    (tmp_path / 'folder' / 'pytorch_model.bin').unlink()  # a folder as timm-ext export writes it: safetensors only
    python = venv_python('1.0.23')
    bare = _run(python, LOCAL_DIR, str(tmp_path / 'folder'), 'bare')
    if _torch_load_reads_safetensors(tmp_path):  # newer torch reads safetensors itself: no bug to show
        assert bare.stdout.strip() == 'equal: True', bare.stdout + bare.stderr[-2000:]
    else:  # timm's bug: torch.load unpickles the safetensors file
        assert bare.stdout.startswith('refused: UnpicklingError'), bare.stdout + bare.stderr[-2000:]
    fixed = _run(python, LOCAL_DIR, str(tmp_path / 'folder'), 'timm_ext')
    assert fixed.stdout.strip() == 'equal: True', fixed.stdout + fixed.stderr[-2000:]
