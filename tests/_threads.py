"""Threads for a test's child process (train.py, validate.py): under pytest-xdist its worker's share of the cores,
as conftest.py gives each worker in-process, at most 2. N workers each starting 2-thread children on N cores would
wait on each other at every operator (docs/cli.md#cpu-threads)."""
import os

__all__ = ['child_threads']


def child_threads() -> str:
    """``OMP_NUM_THREADS`` for a child process: 2 alone, the worker's share under ``pytest -n N``."""
    workers = max(1, int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '0') or 0))
    return str(max(1, min(2, (os.cpu_count() or 1) // workers)))
