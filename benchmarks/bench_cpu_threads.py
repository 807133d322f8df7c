"""Step time of SAM training on the CPU with torch's default thread count (one per core) and with one thread per
process, on an idle and on a loaded machine, single-process and under torchrun.

* **single process**: ``timm-ext train`` as a user types it (``samadamw`` on a small ViT, ``--device cpu``,
  ``--log-interval 1``, the thread count by ``--threads N``); the step time is the median of the per-update
  ``Time:`` train.py logs, the first updates (start-up, allocator warm-up) dropped.
* **torchrun, 2 processes**: timm's train.py refuses DDP on the CPU (it passes ``device_ids`` to
  DistributedDataParallel), so this case runs the same model and optimizer as a DDP loop of its own under
  ``python -m torch.distributed.run --nproc-per-node 2`` (gloo; ``OMP_NUM_THREADS`` per process, as torchrun
  reads it), timing each update on rank 0: what a CPU torchrun of the Lightning or Accelerate routes sees.
* **load**: ``--load N`` busy processes (a pure Python loop each) run beside the loaded cases, as another
  user's job or a second run would; the rows say how many and the load average.

The thread counts go in turn (A, B, A, B, ...) so that machine noise hits both alike. Prints one row per case:
the median seconds per update with each thread count, their ratio, and the count ``timm-ext train`` picks by
default at a load of that many busy processes (:func:`timm_ext.launch.cpu_threads.cpu_thread_env`); the CPU is
named. Needs timm's train.py
for the single-process case (``--timm-train PATH`` or ``$TIMM_EXT_TIMM_TRAIN``).

    python benchmarks/bench_cpu_threads.py [--timm-train PATH] [--updates 14] [--reps 3] [--loads 0,1,2]
"""
import argparse
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from timm_ext.launch.cpu_threads import cpu_thread_env
from timm_ext.machine import cpu_name

_TIME = re.compile(r'Train: \d+ \[\s*(\d+)/\d+.*?Time: ([0-9.]+)s')
_DDP_TIME = re.compile(r'^ddp update (\d+): ([0-9.]+)$', re.M)
SKIP_UPDATES = 3  # start-up: the first updates allocate and warm the caches
MODEL, IMG = 'vit_tiny_patch16_224', 64


def cli() -> List[str]:
    found = shutil.which('timm-ext')
    return [found] if found else [sys.executable, '-m', 'timm_ext']


def _busy() -> None:  # pragma: no cover - runs in a child process until terminated
    while True:
        pass


def image_folder(root: Path, images: int) -> Path:
    """A small ImageFolder of random 32 px images, 2 classes (the data's content does not change a step's time)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ('train', 'validation'):
        for c in range(2):
            folder = root / split / f'class{c}'
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(images // 2 if split == 'train' else 4):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f'{i}.png')
    return root


def _median_after_start(pairs) -> float:
    times = [float(t) for index, t in pairs if int(index) >= SKIP_UPDATES]
    if not times:
        raise SystemExit('no update times after the start-up updates: raise --updates')
    return statistics.median(times)


def _clean_env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')}


def single_process(data: Path, out: Path, name: str, threads: int, batch: int, timm_train: Optional[str]) -> float:
    """Median s/update of ``timm-ext train --threads N`` (one process)."""
    argv = cli() + ['train', '--device', 'cpu', '--data-dir', str(data), '--output', str(out), '--experiment', name,
                    '--epochs', '1', '--batch-size', str(batch), '--workers', '0', '--log-interval', '1',
                    '--threads', str(threads), '--opt', 'samadamw', '--lr', '1e-3', '--num-classes', '2',
                    '--model', MODEL, '--model-kwargs', f'img_size={IMG}', '--input-size', '3', str(IMG), str(IMG)]
    if timm_train:
        argv += ['--timm-train', timm_train]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_clean_env())
    if proc.returncode != 0:
        raise SystemExit(f'{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}')
    return _median_after_start(_TIME.findall(proc.stdout + proc.stderr))


def torchrun(threads: int, batch: int, updates: int) -> float:
    """Median s/update on rank 0 of this file's DDP loop under torchrun, 2 processes of ``threads`` threads."""
    argv = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', __file__,
            '--ddp-worker', '--updates', str(updates), '--batch-size', str(batch)]
    env = dict(_clean_env(), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f'torchrun with {threads} threads failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}')
    return _median_after_start(_DDP_TIME.findall(proc.stdout))


def ddp_worker(updates: int, batch: int) -> None:
    """One torchrun process: the single-process case's model and optimizer in a DDP loop (SAM's closure)."""
    import timm
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from timm.optim import create_optimizer_v2

    import timm_ext  # noqa: F401  (registers samadamw)

    dist.init_process_group('gloo')
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(timm.create_model(MODEL, img_size=IMG, num_classes=2))
    optimizer = create_optimizer_v2(model, 'samadamw', lr=1e-3)
    x, y = torch.randn(batch, 3, IMG, IMG), torch.randint(0, 2, (batch,))

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for update in range(updates):
        start = time.perf_counter()
        optimizer.step(closure)
        if dist.get_rank() == 0:
            print(f'ddp update {update}: {time.perf_counter() - start:.4f}', flush=True)
    dist.destroy_process_group()


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--timm-train', default=os.environ.get('TIMM_EXT_TIMM_TRAIN'))
    parser.add_argument('--updates', type=int, default=14, help='updates per run (the first 3 are dropped)')
    parser.add_argument('--batch-size', type=int, default=16, help='images per process and update')
    parser.add_argument('--reps', type=int, default=3, help='runs of each case, interleaved')
    parser.add_argument('--loads', default='0,1,2', help='busy processes beside the cases, one row set per value')
    parser.add_argument('--ddp-worker', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ddp_worker:
        return ddp_worker(args.updates, args.batch_size)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    print(f'CPU: {cpu_name()}, {cores} cores; torch\'s default: {cores} threads per process')
    print(f'samadamw, {MODEL} at {IMG} px, batch {args.batch_size} per process; median s/update over updates '
          f'{SKIP_UPDATES}..{args.updates - 1}, median of {args.reps} interleaved runs per cell')
    print()
    print(f'| busy processes beside | launch | {cores} threads (s/update) | 1 thread (s/update) | {cores} threads / 1 '
          f'| load avg (1 / 5 min) | timm-ext train\'s default at the busy processes\' load |')
    print('|---:|---|---:|---:|---:|---|---:|')
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = image_folder(tmp / 'data', args.updates * args.batch_size)
        for load in (int(n) for n in args.loads.split(',')):
            busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(load)]
            for p in busy:
                p.start()
            try:
                if busy:
                    time.sleep(5)
                for launch in ('timm-ext train, 1 process', 'torchrun, 2 processes'):
                    results: Dict[int, List[float]] = {cores: [], 1: []}
                    for rep in range(args.reps):
                        for threads in results:
                            if launch.startswith('torchrun'):
                                results[threads].append(torchrun(threads, args.batch_size, args.updates))
                            else:
                                name = f'load{load}-t{threads}-r{rep}'
                                results[threads].append(single_process(data, tmp / 'out', name, threads,
                                                                       args.batch_size, args.timm_train))
                    many, one = statistics.median(results[cores]), statistics.median(results[1])
                    one_min, five_min, _ = os.getloadavg()
                    processes = 2 if launch.startswith('torchrun') else 1
                    chosen = cpu_thread_env(None, {}, on_cpu=True, processes=processes, cores=cores, load=load)[0]
                    print(f'| {load} | {launch} | {many:.3f} | {one:.3f} | {many / one:.2f}x | '
                          f'{one_min:.2f} / {five_min:.2f} | {chosen["OMP_NUM_THREADS"]} |', flush=True)
            finally:
                for p in busy:
                    p.terminate()


if __name__ == '__main__':
    main()
