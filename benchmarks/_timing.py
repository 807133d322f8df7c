"""Side-by-side timing helpers shared by the benchmark scripts (interleaved, median of repeats)."""
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Dict

import torch


def cpu_name() -> str:
    """The CPU's model name as lscpu gives it (from /proc/cpuinfo on Linux): every CPU figure names its machine."""
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def interleaved_median_seconds(fns: Dict[str, Callable[[], None]], device: torch.device, warmup: int = 2,
                               reps: int = 7) -> Dict[str, float]:
    """Median wall time per call of each fn, run in turn (A, B, A, B, ...) so machine noise hits both."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync(device)
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def train_step(
        model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
) -> Callable[[], None]:
    """One classification train step (forward, cross-entropy, backward, optimizer step) as a closure."""
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step
