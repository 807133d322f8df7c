"""The machine a figure was measured on, named the same way by every benchmark and report."""
import platform
from pathlib import Path

__all__ = ['cpu_name']


def cpu_name() -> str:
    """The CPU's model name as lscpu gives it (from /proc/cpuinfo on Linux), else what ``platform`` knows."""
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
