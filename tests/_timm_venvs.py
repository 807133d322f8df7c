"""Throwaway virtualenvs with another timm release over this interpreter's packages, for the tests that
check timm-ext (or timm's scripts) under a timm version other than the installed one."""
import fcntl
import hashlib
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

__all__ = ['venv_python']


def venv_python(version: str) -> Path:
    """A virtualenv with timm==version over this interpreter's packages (torch, timm-ext's deps), cached in
    the temp dir per timm version and interpreter; the test is skipped when pip cannot install that timm."""
    key = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    root = Path(tempfile.gettempdir()) / f'timm-ext-venv-timm-{version}-{key}'
    python = root / 'bin' / 'python'
    ready = root / '.timm-ext-ready'
    if ready.is_file():
        return python
    # one maker at a time: pytest-xdist's workers (-n) may ask for the same release at once
    with open(root.with_name(root.name + '.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file():
            return python
        return _make(root, python, ready, version)


def _make(root: Path, python: Path, ready: Path, version: str) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(root)], check=True, capture_output=True)
    site_dir = subprocess.run([str(python), '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
                              check=True, capture_output=True, text=True).stdout.strip()
    parents = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    # later on sys.path than the venv's own site-packages: the venv's timm wins, the rest is shared
    Path(site_dir, '_timm_ext_parent_site.pth').write_text(
        ''.join(f'import site; site.addsitedir({p!r})\n' for p in parents))
    proc = subprocess.run([str(python), '-m', 'pip', 'install', '--quiet', '--no-deps', f'timm=={version}'],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f'pip could not install timm=={version}: {(proc.stderr.strip().splitlines() or ["?"])[-1]}')
    ready.write_text(version)
    return python
