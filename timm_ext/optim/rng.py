"""Random-number-generator state of one forward pass, so SAM's second pass draws the same masks.

The paper's implementation (JAX) evaluates both SAM passes with one PRNG key: dropout and
drop-path masks at ``w + e`` are those drawn at ``w``. In torch the masks come from the global
generators (CPU, and one per CUDA device). Where SAM runs both passes itself (``step(closure)``) it runs
the first inside ``torch.random.fork_rng``, so the second starts where the first did. Where the first pass
ran before SAM was called (train.py's task call, the Hugging Face Trainer's micro-batches), its state is
recorded here and the second pass re-runs inside ``torch.random.fork_rng`` restored to it: the second pass
consumes no randomness, and the rest of the run draws what it would have drawn without it.
"""
from contextlib import contextmanager
from typing import Iterable, Iterator, Tuple

import torch

from timm_ext.optim.sam_functional import cuda_devices_of

__all__ = ['RngState', 'cuda_devices_of']


class RngState:
    """The CPU generator's state and, for the given CUDA devices, theirs."""
    __slots__ = ('cpu', 'cuda')

    def __init__(self, cpu: torch.Tensor, cuda: Tuple[Tuple[int, torch.Tensor], ...] = ()) -> None:
        self.cpu = cpu
        self.cuda = cuda

    @classmethod
    def capture(cls, cuda_devices: Iterable[int] = ()) -> 'RngState':
        return cls(torch.get_rng_state(), tuple((d, torch.cuda.get_rng_state(d)) for d in cuda_devices))

    def apply(self) -> None:
        """Set the generators to this state (the caller forks them first if the change must not leak)."""
        torch.set_rng_state(self.cpu)
        for device, state in self.cuda:
            torch.cuda.set_rng_state(state, device)

    @contextmanager
    def restored(self) -> Iterator[None]:
        """Run the block with the generators at this state; afterwards they are as they were before it."""
        with torch.random.fork_rng(devices=[d for d, _ in self.cuda]):
            self.apply()
            yield
