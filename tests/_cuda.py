"""The device the `cuda`-marked tests run on: CUDA by default (skipped with the reason without one), or the CPU
with ``TIMM_EXT_CUDA_TESTS_ON=cpu`` so that the same test bodies can be checked on a machine without a GPU
wherever the feature exists on the CPU (features that exist only on CUDA skip there with the reason)."""
import os
from typing import Optional

import pytest
import torch

ENV = 'TIMM_EXT_CUDA_TESTS_ON'
NO_CUDA = 'no CUDA device (torch.cuda.is_available() is False)'


def chosen_device() -> Optional[torch.device]:
    """``cpu`` when the environment asks for it, ``cuda`` when there is one, else None."""
    wanted = os.environ.get(ENV, 'cuda')
    if wanted not in ('cuda', 'cpu'):
        raise ValueError(f'{ENV}={wanted!r}: use cpu (or leave it unset for cuda)')
    if wanted == 'cpu':
        return torch.device('cpu')
    return torch.device('cuda') if torch.cuda.is_available() else None


@pytest.fixture
def device() -> torch.device:
    """The device of a `cuda` test; skips with the reason when there is none."""
    chosen = chosen_device()
    if chosen is None:
        pytest.skip(NO_CUDA)
    return chosen


def only_on_cuda(device: torch.device, what: str) -> None:
    """Skip a feature that exists only on CUDA when the bodies run on the CPU."""
    if device.type != 'cuda':
        pytest.skip(f'{what} needs CUDA ({ENV}=cpu runs the test bodies on the CPU)')


def no_tf32():
    """Plain float32 for comparisons on CUDA (cuDNN and matmul would otherwise use TF32 with ~1e-3 error)."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return ctx()


def manual_seed(device: torch.device, seed: int) -> None:
    """Seed the generator the device's random masks come from (the CPU one, plus CUDA's on CUDA)."""
    torch.manual_seed(seed)
    if device.type == 'cuda':
        torch.cuda.manual_seed(seed)


def spawn(worker, nprocs: int = 2) -> None:
    """``worker(rank, nprocs, port)`` in ``nprocs`` spawned processes on a free local port. Spawn, not fork: a
    process that has used CUDA cannot fork children that use it."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(nprocs, port), nprocs=nprocs, join=True, start_method='spawn')
