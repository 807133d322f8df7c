"""The mode a new file of the user gets (``0o666`` less the umask), for files written through temporary files.

``tempfile`` creates ``0600`` files and ``0700`` folders, and a file renamed into place keeps that
mode; what timm-ext writes for the user (exports, cached scripts, the digits folder) should be as
readable as anything else the user writes.
"""
import os
from pathlib import Path

__all__ = ['user_dir_mode', 'user_file_mode']


def user_file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less the process umask."""
    return 0o666 & ~_umask()


def user_dir_mode() -> int:
    """The mode ``os.mkdir`` gives a new folder: ``0o777`` less the process umask."""
    return 0o777 & ~_umask()


def _umask() -> int:
    try:  # Linux reports it without changing it
        for line in Path('/proc/self/status').read_text().splitlines():
            if line.startswith('Umask:'):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere reading it means setting it, and at once back
    os.umask(mask)
    return mask
