"""Side-by-side timing helpers shared by the benchmark scripts (interleaved, median of repeats).

Every script that times two models imports its steps and its machine line from here, so a ratio printed
by one script means what the same ratio means in another (``gpu_report.py`` reuses them on CUDA).
"""
import statistics
import time
from typing import Callable, Dict, Tuple

import torch

from timm_ext.machine import cpu_name


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name as lscpu gives it (from /proc/cpuinfo on Linux)."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return cpu_name()


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


def imagenet_batch(batch_size: int, device: torch.device, size: int = 224) -> Tuple[torch.Tensor, torch.Tensor]:
    """A seeded batch of ``batch_size`` random 3 x ``size`` x ``size`` images and ImageNet labels on ``device``."""
    torch.manual_seed(0)
    x = torch.randn(batch_size, 3, size, size, device=device)
    return x, torch.randint(0, 1000, (batch_size,), device=device)


def train_step(
        model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
) -> Callable[[], None]:
    """One classification train step (forward, cross-entropy, backward, optimizer step) as a closure."""
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def forward_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """Forward, cross-entropy and backward, no optimizer step (its cost is the same for the models compared)."""
    def step() -> None:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return step


def inference_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """One forward under ``torch.inference_mode()``."""
    def run() -> None:
        with torch.inference_mode():
            model(x)
    return run
