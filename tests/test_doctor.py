"""timm_ext.doctor and ``timm-ext doctor``: the report's values are the installed ones, and exit 1 says what to fix.

timm's scripts are synthetic files whose sha256 replaces the shipped table, so nothing depends on
../shared; the network is never used (``offline_scripts`` makes any download fail the test).
"""
import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import safetensors
import timm
import torch
import torchvision
from _cli import run_cli
from packaging.version import Version

import timm_ext
from timm_ext import doctor
from timm_ext._requirements import declared_requirements
from timm_ext.cli import main
from timm_ext.launch import release_table

TRAIN, VALIDATE = 'print("train")\n', 'print("validate")\n'
TAG = f'v{Version(timm.__version__).public}'  # the table's one release is the installed timm's
CHECKS = ['python', 'platform', 'torch', 'torchvision', 'timm', 'timm-ext', 'safetensors', 'huggingface-hub',
          'devices', 'train.py', 'validate.py', 'cache', 'offline']
URL = f'https://raw.githubusercontent.com/huggingface/pytorch-image-models/{TAG}/{{}}'


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(autouse=True)
def table(offline_scripts, tmp_path, monkeypatch):
    """The table holds one release, the installed timm's, whose scripts are TRAIN and VALIDATE."""
    path = tmp_path / 'table.tsv'
    path.write_text('tag\ttrain.py_sha256\tvalidate.py_sha256\thas_task_api\thas_device_modules\n'
                    f'{TAG}\t{_sha(TRAIN)}\t{_sha(VALIDATE)}\tyes\tyes\n')
    monkeypatch.setattr(release_table, 'TABLE_PATH', path)
    release_table.release_table.cache_clear()
    yield
    release_table.release_table.cache_clear()


@pytest.fixture
def online(monkeypatch):
    for var in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE'):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', False)


@pytest.fixture
def release(tmp_path):
    """A folder with the table's (synthetic) train.py and validate.py."""
    folder = tmp_path / 'timm'
    folder.mkdir()
    (folder / 'train.py').write_text(TRAIN)
    (folder / 'validate.py').write_text(VALIDATE)
    return folder


def cli(capsys, *argv):
    return run_cli(capsys, 'doctor', *argv)


def _cache(tmp_path) -> Path:
    return tmp_path / 'cache' / 'timm-train'


# --- the report ----------------------------------------------------------------------------------

def test_json_holds_the_installed_versions(capsys, monkeypatch, release):
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(release))
    code, out, err = cli(capsys, '--json')
    report = json.loads(out)
    assert (code, err, report['ok'], report['fix']) == (0, '', True, None)
    checks = report['checks']
    assert list(checks) == CHECKS
    versions = {name: checks[name]['version'] for name in CHECKS if 'version' in checks[name]}
    assert versions == {
        'python': platform.python_version(), 'torch': torch.__version__, 'torchvision': torchvision.__version__,
        'timm': timm.__version__, 'timm-ext': timm_ext.__version__, 'safetensors': safetensors.__version__,
        'huggingface-hub': huggingface_hub.__version__}
    assert checks['torch']['threads'] == torch.get_num_threads() and checks['torch']['cuda_build'] == torch.version.cuda
    assert checks['platform']['cpu_count'] == os.cpu_count() and checks['torchvision']['ops'] is True
    assert len(checks['devices']['cuda']) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for name in CHECKS:
        assert set(checks[name]) >= {'value', 'ok', 'required', 'fix'} and checks[name]['ok'] is True
    assert [name for name in CHECKS if checks[name]['required']] == [
        'python', 'torch', 'torchvision', 'timm', 'timm-ext', 'safetensors', 'huggingface-hub', 'train.py']


def test_text_table_and_ready_line(capsys, monkeypatch, release):
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(release))
    code, out, _ = cli(capsys)
    lines = out.splitlines()
    assert code == 0 and lines[-1] == 'ready: everything a training run needs is there'
    assert [line.split()[:2] for line in lines[:-1]] == [['ok', name] for name in CHECKS]
    assert f'  {torch.__version__} (' in lines[2] and lines[3].endswith(
        f'{torchvision.__version__} (torchvision.ops.nms runs)')


def test_torchvision_built_for_another_torch(capsys, monkeypatch, release):
    def missing_op(*args, **kwargs):
        raise RuntimeError('operator torchvision::nms does not exist')

    monkeypatch.setattr(torchvision.ops, 'nms', missing_op)
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(release))
    fix = (f'torchvision {torchvision.__version__} does not match torch {torch.__version__}: reinstall both from '
           f'the same index (pip install --force-reinstall torch torchvision)')
    code, out, _ = cli(capsys)
    lines = out.splitlines()
    assert code == 1 and lines[-1] == f'not ready: {fix}'
    assert lines[3].split()[:2] == ['FAIL', 'torchvision'] and lines[3].endswith(
        'torchvision.ops.nms fails: RuntimeError: operator torchvision::nms does not exist')
    assert lines[4].strip() == f'fix: {fix}'
    code, out, err = cli(capsys, '--json')
    report = json.loads(out)
    assert (code, report['ok'], report['fix'], err) == (1, False, fix, f'timm-ext doctor: not ready: {fix}\n')
    assert report['checks']['torchvision']['ops'] is False and report['checks']['torchvision']['required']


def test_a_missing_package_names_the_install_line(monkeypatch, release):
    monkeypatch.setitem(sys.modules, 'safetensors', None)  # what Python does with a package that cannot import
    report = doctor.collect(timm_train=str(release))
    check = report['safetensors']
    halted = 'import of safetensors halted; None in sys.modules'
    assert not report.ok and check.value == f'not importable: ModuleNotFoundError: {halted}'
    assert report.fix == check.fix and check.fix.startswith(f'safetensors cannot be imported ({halted}): '
                                                            f'pip install "safetensors')


def test_timm_older_than_timm_ext_declares(monkeypatch, release):
    needed = declared_requirements().get('timm')
    if needed is None:
        pytest.skip('timm-ext is not installed (no package metadata): its requirements are unknown')
    monkeypatch.setattr(timm, '__version__', '1.0.20')
    report = doctor.collect(timm_train=str(release))
    assert not report['timm'].ok and report['timm'].value == '1.0.20'
    assert report.fix == f'timm-ext needs {needed}, found timm 1.0.20: pip install "{needed}"'


def test_cuda_devices_are_listed(monkeypatch, release):
    props = [SimpleNamespace(name='NVIDIA H100 80GB HBM3', major=9, minor=0, total_memory=85 * 2 ** 30),
             SimpleNamespace(name='NVIDIA A100-SXM4-40GB', major=8, minor=0, total_memory=40 * 2 ** 30)]
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda i: props[i])
    check = doctor.collect(timm_train=str(release))['devices']
    assert check.value.startswith('cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 85.0 GiB), '
                                  'cuda:1 NVIDIA A100-SXM4-40GB (sm_80, 40.0 GiB)')
    assert check.details['cuda'][1] == {'index': 1, 'name': 'NVIDIA A100-SXM4-40GB', 'capability': '8.0',
                                        'memory_gib': 40.0}


# --- which train.py / validate.py ----------------------------------------------------------------

def test_given_file_with_a_known_sha256_is_reported_and_not_cached(capsys, tmp_path, release):
    code, out, _ = cli(capsys, '--json', '--timm-train', release / 'train.py', '--timm-validate', release)
    checks = json.loads(out)['checks']
    assert code == 0
    for name, text in (('train.py', TRAIN), ('validate.py', VALIDATE)):
        check = checks[name]
        assert (check['source'], check['path'], check['tag']) == (
            '--timm-train' if name == 'train.py' else '--timm-validate', str(release / name), TAG)
        assert (check['sha256'], check['sha256_known'], check['url']) == (_sha(text), True, None)
    assert checks['train.py']['value'] == (f'{release / "train.py"} (from --timm-train; sha256 known: train.py of '
                                           f'{TAG})')
    assert not _cache(tmp_path).exists()  # the doctor writes nothing (train and validate cache the file)


def test_cached_file_is_found(capsys, tmp_path):
    cached = _cache(tmp_path) / TAG / 'train.py'
    cached.parent.mkdir(parents=True)
    cached.write_text(TRAIN)
    code, out, _ = cli(capsys, '--json')
    checks = json.loads(out)['checks']
    assert code == 0 and (checks['train.py']['source'], checks['train.py']['path']) == ('cache', str(cached))
    assert checks['cache']['tags'] == [TAG] and checks['cache']['value'].endswith(f'(holds {TAG})')
    assert checks['validate.py']['source'] == 'download' and not checks['validate.py']['ok']  # offline: a warning


def test_unknown_sha256_fails_unless_allowed(capsys, tmp_path):
    edited = tmp_path / 'train.py'
    edited.write_text('print("edited")\n')
    digest = _sha('print("edited")\n')
    code, out, _ = cli(capsys, '--timm-train', edited)
    refusal = (f'--timm-train {edited}: its sha256 {digest[:16]}... is not the train.py of any timm release '
               f'timm-ext knows ({TAG}); pass --allow-unverified to run it anyway')
    assert code == 1 and out.splitlines()[-1] == f'not ready: {refusal}'
    code, out, _ = cli(capsys, '--json', '--timm-train', edited, '--allow-unverified')
    check = json.loads(out)['checks']['train.py']
    assert code == 0 and check['ok'] and (check['sha256'], check['sha256_known'], check['tag']) == (digest, False, None)
    assert check['value'] == (f'{edited} (from --timm-train; sha256 {digest[:16]}... unknown: runs only with '
                              f'--allow-unverified)')


def test_not_found_online_would_download(capsys, tmp_path, online):
    code, out, _ = cli(capsys, '--json')
    report = json.loads(out)
    check = report['checks']['train.py']
    target = _cache(tmp_path) / TAG / 'train.py'
    assert code == 0 and report['ok'] and report['checks']['offline']['value'] == 'no'
    assert (check['source'], check['path'], check['url'], check['download_to']) == (
        'download', None, URL.format('train.py'), str(target))
    assert check['value'] == f'not found: would download {URL.format("train.py")} on first use (saved as {target})'
    assert check['notes'] == []


def test_not_found_offline_is_the_one_thing_to_fix(capsys, tmp_path, online, monkeypatch):
    monkeypatch.setenv('TRANSFORMERS_OFFLINE', 'yes')
    code, out, _ = cli(capsys)
    target = _cache(tmp_path) / TAG / 'train.py'
    assert code == 1 and out.splitlines()[-1] == (
        f'not ready: train.py is not on this machine and TRANSFORMERS_OFFLINE=yes is set (offline): give it once '
        f'with --timm-train PATH or TIMM_EXT_TIMM_TRAIN=PATH (it is then cached), or save the train.py of {TAG} '
        f'as {target}')
    assert 'ok    offline          yes (TRANSFORMERS_OFFLINE=yes)' in out.splitlines()


def test_offline_setting(online, monkeypatch, release):
    assert doctor.collect(timm_train=str(release))['offline'].details == {'offline': False, 'reasons': []}
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)  # set in code, not in the environment
    assert doctor.collect(timm_train=str(release))['offline'].value == 'yes (huggingface_hub.constants.HF_HUB_OFFLINE)'
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    assert doctor.collect(timm_train=str(release))['offline'].details == {'offline': True,
                                                                         'reasons': ['HF_HUB_OFFLINE=1']}


def test_unwritable_cache_is_a_warning(tmp_path, monkeypatch, release):
    (tmp_path / 'file').write_text('not a folder\n')
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'file' / 'cache'))
    report = doctor.collect(timm_train=str(release))
    assert report.ok and report['cache'].status == 'warn'
    assert report['cache'].fix == f'{tmp_path / "file"} is not a writable folder: set TIMM_EXT_CACHE to one'


def test_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(['doctor', '--help'])
    assert info.value.code == 0 and capsys.readouterr().out.startswith('usage: timm-ext doctor')
