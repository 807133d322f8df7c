"""Threads for a test's child process (train.py, validate.py): under pytest-xdist its worker's share of the cores,
as conftest.py gives each worker in-process, at most 2. N workers each starting 2-thread children on N cores would
wait on each other at every operator (docs/cli.md#cpu-threads).

A child whose numbers are compared bit for bit with this process's gets ``same_threads()``: float sums split over
another number of threads may add in another order (an AMD EPYC does, under ``pytest -n 2`` against a 2-thread
child), and an exact comparison across processes means the same kernels on the same split on both sides."""
import os

import torch

__all__ = ['child_threads', 'same_threads']


def child_threads() -> str:
    """``OMP_NUM_THREADS`` for a child process: 2 alone, the worker's share under ``pytest -n N``; of the threads
    pytest itself was given (``OMP_NUM_THREADS``: .ci/run gives each of the lanes it runs side by side one), else
    of the cores."""
    workers = max(1, int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '0') or 0))
    given = os.environ.get('OMP_NUM_THREADS', '')
    threads = int(given) if given.isdigit() and int(given) > 0 else (os.cpu_count() or 1)
    return str(max(1, min(2, threads // workers)))


def same_threads() -> str:
    """``OMP_NUM_THREADS`` for a child whose results are compared exactly with this process's: this process's own
    torch thread count (conftest.py's share under ``pytest -n N``, torch's default alone)."""
    return str(torch.get_num_threads())
