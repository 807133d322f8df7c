"""One worker of tests/test_multinode_sam.py, started by torchrun (``python -m torch.distributed.run``).

Trains a seeded MLP with ``samsgd`` through timm's ``ClassificationTask`` wrapped in DDP (gloo, CPU), the way
timm's train.py drives it (task, optimizer from ``create_optimizer_v2``, ``replay_timm_task``, ``loss.backward()``,
``step()``), once without and once with ``m_sharpness``, each process on its half of every batch (by its global
rank).
Writes ``worker-<pid>.pid`` at once (so the test can kill it), then ``rank<RANK>.pt``: the final flat
parameters of each run and the environment torchrun gave it.
The test imports :func:`train` to run the same loop in one process on the whole batch.

Usage: ``_multinode_worker.py OUT_DIR`` (under torchrun, which sets RANK, WORLD_SIZE, MASTER_ADDR, ...).
"""
import faulthandler
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from _sam_reference import batch, flat, mlp
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask

import timm_ext  # noqa: F401  (registers samsgd with timm's optimizer factory, as train.py's --device-modules)
from timm_ext.optim import replay_timm_task

BATCH = 16  # the global batch of every step: 8 images on each of two processes
STEPS = 3
M_SHARPNESS = 4  # images per perturbation: 2 chunks on each of two processes, 4 in one process
RUNS = (None, M_SHARPNESS)
SELF_DESTRUCT_S = 150  # a worker stuck in a collective exits by itself (the test also kills it)
ENV = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE')


def train(m_sharpness: Optional[int], rank: int = 0, world_size: int = 1) -> torch.Tensor:
    """SAM-SGD for ``STEPS`` steps on process ``rank``'s rows of each global batch; the final flat weights."""
    model = mlp()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), device=torch.device('cpu'), verbose=False)
    model = task.get_trainable_module()
    optimizer = create_optimizer_v2(model, 'samsgd', lr=0.5, momentum=0.9, rho=0.3, m_sharpness=m_sharpness)
    if world_size > 1:
        task.prepare_distributed(device_ids=None)  # CPU: no device_ids (train.py passes them, so cannot run here)
    replay_timm_task(optimizer, task)  # train.py's hooks do this for it; a loop of its own calls it once
    for step in range(STEPS):
        x, y = batch(BATCH, seed=10 + step)
        rows = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
        task(x[rows], y[rows])['loss'].backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat(model.parameters()).detach().clone()


def main(out_dir: Path) -> None:
    faulthandler.dump_traceback_later(SELF_DESTRUCT_S, exit=True)
    (out_dir / f'worker-{os.getpid()}.pid').write_text(str(os.getpid()))  # torchrun starts it in its own session
    torch.set_num_threads(1)
    dist.init_process_group('gloo', timeout=timedelta(seconds=120))
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        result: Dict[str, object] = {'env': {k: os.environ.get(k) for k in ENV}, 'pid': os.getpid()}
        for m in RUNS:
            result[f'm={m}'] = train(m, rank, world_size)
        torch.save(result, out_dir / f'rank{rank}.pt')
    finally:
        dist.destroy_process_group()


if __name__ == '__main__':
    main(Path(sys.argv[1]))
