"""Timing and peak memory for the GPU report: CUDA events on CUDA, perf_counter on CPU; a time budget.

A measurement builds its candidates one at a time, each inside its own memory window (what the candidate
allocates, from its weights to its activations' peak), then times them interleaved (A, B, A, B, ...) until
its share of the budget is spent (at least ``min_reps``, at most ``max_reps`` rounds) and takes the median.
"""
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from timing import sync

Step = Callable[[], None]


class Budget:
    """A total time budget shared by named measurements in proportion to their weights."""

    def __init__(self, total_s: float, weights: Dict[str, float], start: Optional[float] = None) -> None:
        self.total_s = total_s
        self.start = time.perf_counter() if start is None else start
        self._weights = dict(weights)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return max(0., self.total_s - self.elapsed())

    def take(self, name: str) -> float:
        """Seconds for measurement ``name``: its weight's part of what is left; it leaves the pool."""
        total = sum(self._weights.values())
        weight = self._weights.pop(name)
        return self.left() * weight / total if total > 0 else 0.


def _round(fns: Dict[str, Step], device: torch.device) -> Dict[str, float]:
    """One call of each fn, in turn; seconds per fn (CUDA events on CUDA: the GPU's time between the calls' ends)."""
    if device.type == 'cuda':
        events = {}
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events[name] = (start, end)
        torch.cuda.synchronize(device)
        return {name: start.elapsed_time(end) / 1e3 for name, (start, end) in events.items()}
    out = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        out[name] = time.perf_counter() - t0
    return out


def interleaved_medians(
        fns: Dict[str, Step], device: torch.device, seconds: float, warmup: int = 1, min_reps: int = 3,
        max_reps: int = 50,
) -> Tuple[Dict[str, float], int]:
    """Median seconds per call of each fn over interleaved rounds, and the number of rounds.

    Rounds continue while another one fits in ``seconds`` (from the call), between ``min_reps`` and ``max_reps``.
    """
    t_end = time.perf_counter() + seconds
    for _ in range(warmup):
        _round(fns, device)
    sync(device)
    times: Dict[str, List[float]] = {name: [] for name in fns}
    reps = 0
    while reps < max_reps:
        t0 = time.perf_counter()
        for name, s in _round(fns, device).items():
            times[name].append(s)
        reps += 1
        if reps >= min_reps and time.perf_counter() + (time.perf_counter() - t0) > t_end:
            break
    return {name: statistics.median(ts) for name, ts in times.items()}, reps


def build_in_memory_windows(
        builders: Dict[str, Callable[[], Step]], device: torch.device, warmup: int = 1,
) -> Tuple[Dict[str, Step], Dict[str, Optional[int]]]:
    """Build each candidate and run its warm-up alone; its peak bytes above what was allocated before (CUDA only).

    The window holds the candidate's weights, gradients, optimizer state and its activations' peak, so two
    candidates' peaks differ by exactly what one keeps or allocates more than the other. CPU: ``None``.
    """
    fns: Dict[str, Step] = {}
    peaks: Dict[str, Optional[int]] = {}
    for name, build in builders.items():
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        fns[name] = build()
        for _ in range(warmup):
            fns[name]()
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
            peaks[name] = torch.cuda.max_memory_allocated(device) - before
        else:
            peaks[name] = None
    return fns, peaks
