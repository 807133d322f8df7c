"""timm_ext._requirements: a torch or timm outside the declared range gets one line at ``import timm_ext``."""
import os
import subprocess
from pathlib import Path

import pytest
from _timm_venvs import venv_python
from packaging.requirements import Requirement

from timm_ext import _requirements
from timm_ext._requirements import TimmExtVersionWarning, check_installed_versions, version_problem

REPO = Path(__file__).resolve().parents[1]
DECLARED = {'torch': Requirement('torch>=2.4'), 'timm': Requirement('timm>=1.0.23')}


@pytest.mark.parametrize('dist, version, line', [
    ('torch', '2.3.1', 'timm-ext needs torch>=2.4, found torch 2.3.1: pip install "torch>=2.4"'),
    ('torch', '2.3.1+cpu', 'timm-ext needs torch>=2.4, found torch 2.3.1+cpu: pip install "torch>=2.4"'),
    ('timm', '1.0.22', 'timm-ext needs timm>=1.0.23, found timm 1.0.22: pip install "timm>=1.0.23"'),
    ('torch', '2.4.0', None), ('torch', '2.4.1+cu121', None), ('torch', '2.14.1', None), ('timm', '1.0.23', None),
    ('timm', '1.1.0.dev0', None),  # a pre-release above the floor is fine
    ('torch', 'unknown-build', None),  # not a release number: nothing to compare
    ('torch', None, None),  # not installed: torch's own import says so
    ('pillow', '1.0', None),  # not declared
])
def test_version_problem(dist, version, line):
    assert version_problem(dist, version, DECLARED) == line


def _installed(monkeypatch, **versions):
    monkeypatch.setattr(_requirements, 'declared_requirements', lambda: DECLARED)
    monkeypatch.setattr(_requirements, 'installed_version', lambda dist: versions.get(dist))


def test_old_torch_is_refused_in_one_line(monkeypatch):
    _installed(monkeypatch, torch='2.3.1', timm='1.0.31')
    with pytest.raises(ImportError) as e:
        check_installed_versions()
    assert str(e.value) == 'timm-ext needs torch>=2.4, found torch 2.3.1: pip install "torch>=2.4"'


def test_old_timm_warns_once_and_names_the_patch_route(monkeypatch):
    _installed(monkeypatch, torch='2.14.1', timm='1.0.22')
    with pytest.warns(TimmExtVersionWarning) as record:
        check_installed_versions()
    assert [str(w.message) for w in record] == [
        'timm-ext needs timm>=1.0.23, found timm 1.0.22: pip install "timm>=1.0.23" (train.py of timm 1.0.15 ... '
        '1.0.22 needs `timm-ext patch`, which `timm-ext train` applies)']


def test_versions_in_range_say_nothing(monkeypatch, recwarn):
    _installed(monkeypatch, torch='2.4.0', timm='1.0.23')
    check_installed_versions()
    assert not [w for w in recwarn if issubclass(w.category, TimmExtVersionWarning)]


@pytest.mark.slow
def test_import_under_timm_1_0_22_prints_the_line():
    if _requirements.declared_requirements().get('timm') is None:
        pytest.skip('timm-ext is not installed (no package metadata): its requirements are unknown')
    python = venv_python('1.0.22')
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS='ignore::FutureWarning')
    proc = subprocess.run([str(python), '-c', 'import timm_ext, timm; print(timm.__version__)'], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == '1.0.22', proc.stderr[-2000:]
    warned = [line for line in proc.stderr.splitlines() if 'TimmExtVersionWarning' in line]
    assert len(warned) == 1 and warned[0].endswith(
        'TimmExtVersionWarning: timm-ext needs timm>=1.0.23, found timm 1.0.22: pip install "timm>=1.0.23" '
        '(train.py of timm 1.0.15 ... 1.0.22 needs `timm-ext patch`, which `timm-ext train` applies)'), proc.stderr
