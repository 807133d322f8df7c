"""timm_ext.machine: the CPU every figure names, read as lscpu reads it."""
import platform
from pathlib import Path

import pytest

from timm_ext import machine

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def test_cpu_name_is_the_model_name_line_of_cpuinfo(monkeypatch, tmp_path):
    cpuinfo = tmp_path / 'cpuinfo'
    cpuinfo.write_text('processor\t: 0\nmodel name\t: AMD EPYC 7B13 64-Core Processor\nflags\t: fpu\n')
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        return real(cpuinfo if str(self) == '/proc/cpuinfo' else self, *args, **kwargs)
    monkeypatch.setattr(Path, 'read_text', read_text)
    assert machine.cpu_name() == 'AMD EPYC 7B13 64-Core Processor'


def test_without_cpuinfo_platform_answers(monkeypatch):
    def missing(self, *args, **kwargs):
        raise OSError('no /proc here')
    monkeypatch.setattr(Path, 'read_text', missing)
    assert machine.cpu_name() == (platform.processor() or platform.machine()) != ''
