"""How many CPU threads each train.py process of ``timm-ext train`` gets when it trains on the CPU.

torch starts one intra-op thread per core, and its threads wait for each other at every operator. On an idle
machine that is the fastest; once the cores are busy with anything else (another user's job, a compile, the other
processes of the same torchrun) the waiting dominates: measured on 2 cores of an AMD EPYC
(``benchmarks/bench_cpu_threads.py``, docs/cli.md#cpu-threads), SAM on a small ViT took 0.64x the time of one
thread when idle, 2.8x with one busy process beside it, and 18x as two torchrun processes of 2 threads each.
So on the CPU each process gets the cores that are free when it starts: the cores this process may run on,
less the busy ones by the 1-minute load average, shared among the processes on this node, at least one and
at most torch's own default. ``--threads N`` or ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the environment
(which torchrun, OpenMP and MKL read too) choose instead. On CUDA nothing is set: the GPU does the work.
"""
import os
from typing import Dict, Mapping, Optional, Tuple

__all__ = ['THREAD_VARIABLES', 'cpu_thread_env', 'free_cores', 'free_cpu_threads']

THREAD_VARIABLES = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')


def free_cores() -> Tuple[int, float]:
    """``(cores this process may run on, the 1-minute load average)``; the load is 0.0 where the OS has none."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, cores), load


def free_cpu_threads(processes: int = 1, cores: Optional[int] = None, load: Optional[float] = None,
                     torch_default: Optional[int] = None) -> int:
    """The CPU threads each of ``processes`` processes on this node should use now: the cores free by the 1-minute
    load average, shared out, between 1 and torch's default. For your own loop on a CPU:
    ``torch.set_num_threads(free_cpu_threads())`` (docs/cli.md#cpu-threads gives the measurements)."""
    if cores is None or load is None:
        found_cores, found_load = free_cores()
        cores = found_cores if cores is None else cores
        load = found_load if load is None else load
    if torch_default is None:
        import torch

        torch_default = torch.get_num_threads()
    busy = min(cores, int(load + 0.5))
    return max(1, min(torch_default, (cores - busy) // max(1, processes)))


def cpu_thread_env(
        threads: Optional[int],
        environ: Mapping[str, str],
        on_cpu: bool,
        processes: int = 1,
        cores: Optional[int] = None,
        load: Optional[float] = None,
        torch_default: Optional[int] = None,
) -> Tuple[Dict[str, str], str]:
    """``(variables to set in train.py's environment, the note that says how many threads and why)``.

    ``threads`` (``--threads N``) wins; then the user's own ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``; then, on the
    CPU, the free cores per process (``processes`` on this node): ``cores`` less ``round(load)``, divided by
    ``processes``, between 1 and ``torch_default`` (``cores``, ``load`` and ``torch_default`` default to this
    machine's). The note is empty when there is nothing to say (CUDA, or the user chose)."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f'--threads {threads}: give a positive number of CPU threads per train.py process')
        return {name: str(threads) for name in THREAD_VARIABLES}, ''
    if not on_cpu or any(environ.get(name) for name in THREAD_VARIABLES):
        return {}, ''
    if cores is None or load is None:
        found_cores, found_load = free_cores()
        cores = found_cores if cores is None else cores
        load = found_load if load is None else load
    count = free_cpu_threads(processes, cores, load, torch_default)
    env = {name: str(count) for name in THREAD_VARIABLES}
    per = f', {processes} processes' if processes > 1 else ''
    note = (f'{count} CPU thread{"s" if count > 1 else ""} per train.py process ({cores} cores, load average '
            f'{load:.1f}{per}; docs/cli.md#cpu-threads): --threads N or OMP_NUM_THREADS=N to choose')
    return env, note
