"""timm_ext.doctor and ``timm-ext doctor``: the report's values are the installed ones, and exit 1 says what to fix.

timm's scripts are synthetic files whose sha256 replaces the shipped table, so nothing depends on
../shared; the network is never used (``offline_scripts`` makes any download, or any question to the
server, fail the test; the ``online`` tests replace ``probe_url`` with the server's answer).
"""
import hashlib
import json
import os
import platform
import sys
import threading
import time
import urllib.error
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
from timm_ext.launch import release_table, timm_scripts

TRAIN, VALIDATE = 'print("train")\n', 'print("validate")\n'
TAG = f'v{Version(timm.__version__).public}'  # the table's one release is the installed timm's
CHECKS = ['python', 'platform', 'torch', 'torchvision', 'timm', 'timm-ext', 'safetensors', 'huggingface-hub',
          'devices', 'train.py', 'validate.py', 'cache', 'offline']
URL = f'https://raw.githubusercontent.com/huggingface/pytorch-image-models/{TAG}/{{}}'
READY = 'ready: everything a training run needs is there'
PAD = ' ' * 23  # under the status and the name: where a check's fix line starts


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
    """No offline setting, and a server that answers every question (a test replaces it to fail): the URLs asked."""
    for var in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE'):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', False)
    asked = []
    monkeypatch.setattr(timm_scripts, 'probe_url', lambda url, timeout=None: asked.append((url, timeout)))
    return asked


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
    assert report['summary'] == READY and report['commands'] == {'train': True, 'validate': True, 'demo': True}
    assert (checks['train.py']['downloadable'], checks['train.py']['download_error']) == (None, None)


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
    assert report['commands'] == {'train': False, 'validate': False, 'demo': False}  # nothing starts
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
    # validate.py is neither given nor cached, and offline (the tests' HF_HUB_OFFLINE=1): it cannot start either
    assert code == 1 and out.splitlines()[-1] == f'not ready: timm-ext train and validate cannot start: {refusal}'
    code, out, _ = cli(capsys, '--json', '--timm-train', edited, '--allow-unverified')
    check = json.loads(out)['checks']['train.py']
    assert code == 0 and check['ok'] and (check['sha256'], check['sha256_known'], check['tag']) == (digest, False, None)
    assert check['value'] == (f'{edited} (from --timm-train; sha256 {digest[:16]}... unknown: runs only with '
                              f'--allow-unverified)')


def _give(name, tmp_path):
    """The fix of a script neither given, cached nor downloadable (train.py's is spelt out in the tests)."""
    flag, other = ('--timm-train', 'validate.py') if name == 'train.py' else ('--timm-validate', 'train.py')
    return (f'give {name} once with {flag} PATH or TIMM_EXT_TIMM_TRAIN=PATH (timm\'s {name} or its folder; it is '
            f'then cached, with the {other} beside it), or save the {name} of {TAG} as '
            f'{_cache(tmp_path) / TAG / name}; timm-ext demo runs without it (built-in loop)')


def test_not_found_online_is_downloadable_now(capsys, tmp_path, online):
    code, out, _ = cli(capsys, '--json')
    report = json.loads(out)
    check = report['checks']['train.py']
    target = _cache(tmp_path) / TAG / 'train.py'
    assert code == 0 and report['ok'] and report['checks']['offline']['value'] == 'no'
    assert (check['source'], check['path'], check['url'], check['download_to']) == (
        'download', None, URL.format('train.py'), str(target))
    assert (check['downloadable'], check['download_error'], check['notes']) == (True, None, [])
    assert check['value'] == (f'not given or cached; downloadable now from {URL.format("train.py")} (saved as '
                              f'{target} on first use)')
    assert report['summary'] == READY and report['commands'] == {'train': True, 'validate': True, 'demo': True}
    # both asked (HEAD, with the short timeout), nothing downloaded or written
    assert sorted(online) == [(URL.format('train.py'), 4.0), (URL.format('validate.py'), 4.0)]
    assert not (tmp_path / 'cache').exists()


@pytest.mark.parametrize('error, reason', [
    (urllib.error.URLError(OSError(-2, 'Name or service not known')), '[Errno -2] Name or service not known'),
    (urllib.error.HTTPError(URL.format('train.py'), 404, 'Not Found', None, None), 'HTTP 404 Not Found'),
    (urllib.error.URLError(TimeoutError('timed out')), 'no answer within 4 s'),  # the connection timed out
    (TimeoutError('The read operation timed out'), 'no answer within 4 s'),  # the answer did
], ids=['dns', 'http-404', 'connect-timeout', 'read-timeout'])
def test_not_downloadable_now_names_why_and_what_to_do(capsys, tmp_path, online, monkeypatch, error, reason):
    def fails(url, timeout=None):
        raise error

    monkeypatch.setattr(timm_scripts, 'probe_url', fails)
    fix = (f'give train.py once with --timm-train PATH or TIMM_EXT_TIMM_TRAIN=PATH (timm\'s train.py or its folder; '
           f'it is then cached, with the validate.py beside it), or save the train.py of {TAG} as '
           f'{_cache(tmp_path) / TAG / "train.py"}; timm-ext demo runs without it (built-in loop)')
    assert fix == _give('train.py', tmp_path)
    summary = f'not ready: timm-ext train and validate cannot start: {fix}'
    code, out, _ = cli(capsys)
    assert code == 1 and out.splitlines()[9:] == [
        f'FAIL  train.py         not given or cached, and not downloadable now: {URL.format("train.py")} ({reason})',
        f'{PAD}fix: {fix}',
        f'warn  validate.py      not given or cached, and not downloadable now: {URL.format("validate.py")} '
        f'({reason})',
        f'{PAD}fix: {_give("validate.py", tmp_path)}',
        f'ok    cache            {_cache(tmp_path)} (not created yet)',
        'ok    offline          no',
        summary]
    code, out, err = cli(capsys, '--json')
    report = json.loads(out)
    assert (code, report['ok'], report['fix'], report['summary'], err) == (
        1, False, fix, summary, f'timm-ext doctor: {summary}\n')
    assert report['commands'] == {'train': False, 'validate': False, 'demo': True}
    for name in ('train.py', 'validate.py'):
        check = report['checks'][name]
        assert (check['ok'], check['required'], check['source'], check['downloadable'], check['download_error']) == (
            False, name == 'train.py', 'download', False, reason)
        assert check['fix'] == _give(name, tmp_path)


def test_a_server_that_does_not_answer_costs_the_timeout_once(capsys, tmp_path, online, monkeypatch):
    """Both scripts are asked at once and waited for together: a hanging lookup costs the timeout, not twice it."""
    released = threading.Event()

    def hangs(url, timeout=None):
        released.wait(10)
        raise urllib.error.URLError('too late')

    monkeypatch.setattr(timm_scripts, 'probe_url', hangs)
    monkeypatch.setattr(timm_scripts, 'PROBE_TIMEOUT_S', 0.5)
    try:
        started = time.monotonic()
        report = doctor.collect()
        elapsed = time.monotonic() - started
        started = time.monotonic()
        answers = timm_scripts.download_problems([URL.format('train.py')], timeout=0.2)
        waited = time.monotonic() - started
    finally:
        released.set()
    assert report['train.py'].value == (f'not given or cached, and not downloadable now: {URL.format("train.py")} '
                                        f'(no answer within 0.5 s)')
    assert report['validate.py'].details['download_error'] == 'no answer within 0.5 s'
    assert 0.5 <= elapsed < 0.5 + 2.0  # the rest of collect() takes well under a second
    assert answers == {URL.format('train.py'): 'no answer within 0.2 s'} and 0.2 <= waited < 0.2 + 0.5


def test_validate_py_alone_missing_keeps_ready(capsys, tmp_path, online, monkeypatch, release):
    def offline(url, timeout=None):
        raise urllib.error.URLError('no network')

    monkeypatch.setattr(timm_scripts, 'probe_url', offline)
    code, out, _ = cli(capsys, '--timm-train', release / 'train.py')
    assert code == 0 and out.splitlines()[-1] == (
        f'{READY}; timm-ext validate cannot start: {_give("validate.py", tmp_path)}')
    assert out.splitlines()[9].startswith('ok    train.py         ')
    assert out.splitlines()[10].startswith('warn  validate.py      not given or cached, and not downloadable now: ')
    code, out, err = cli(capsys, '--json', '--timm-train', release / 'train.py')
    report = json.loads(out)
    assert (code, report['ok'], report['fix'], err) == (0, True, None, '')
    assert report['commands'] == {'train': True, 'validate': False, 'demo': True}


def test_not_found_offline_is_the_one_thing_to_fix(capsys, tmp_path, online, monkeypatch):
    monkeypatch.setenv('TRANSFORMERS_OFFLINE', 'yes')
    code, out, _ = cli(capsys)
    fix = _give('train.py', tmp_path)
    assert code == 1 and out.splitlines()[9:11] == [
        'FAIL  train.py         not given or cached; a download was not tried: offline (TRANSFORMERS_OFFLINE=yes)',
        f'{PAD}fix: {fix}']
    assert out.splitlines()[-1] == f'not ready: timm-ext train and validate cannot start: {fix}'
    assert 'ok    offline          yes (TRANSFORMERS_OFFLINE=yes)' in out.splitlines()
    assert online == []  # offline: the network was not asked
    check = json.loads(cli(capsys, '--json')[1])['checks']['train.py']
    assert (check['downloadable'], check['download_error'], check['fix']) == (None, None, fix)


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
