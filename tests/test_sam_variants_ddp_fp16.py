"""The variants added after SAM, GSAM and LookSAM (WSAM, FriendlySAM, SAM-ON, ESAM, Momentum-SAM, bSAM, MESA) through
timm's train.py route under DDP (2 gloo processes, each half of the batch) equal one process on the whole batch,
and under fp16 loss scaling (timm's NativeScaler) equal fp32."""
import copy

import pytest
import torch
import torch.nn as nn
from _sam_reference import flat, images, spawn_gloo, tiny_vit, train_py_fp16
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask
from timm.utils import NativeScaler

from timm_ext.optim import SAM, replay_timm_task

# name -> its settings; ESAM's data_fraction stays 1 under DDP (each process ranks its own samples, as the paper's
# code does, so a selection over half-batches is not one over the whole batch)
VARIANTS = {
    'wsamsgd': dict(rho=0.2, gamma=0.8),
    'friendlysamsgd': dict(rho=0.2, sigma=0.5, lmbda=0.6),
    'samonsgd': dict(rho=0.2),
    'esamsgd': dict(rho=0.2, weight_fraction=0.5),
    'msamsgd': dict(rho=0.5),
    'bsam': dict(num_data=1000, rho=0.01),
    'mesasgd': dict(kl_weight=0.8, ema_decay=0.9, start_step=1),
}
STEPS = 3


def _run(model, name, data, distributed=False):
    opt = create_optimizer_v2(model, name, lr=0.1, **VARIANTS[name])  # the factory hands it the model
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    if distributed:
        task = task.prepare_distributed(device_ids=None)
    if isinstance(opt, SAM):  # MESA finds its task itself
        replay_timm_task(opt, task)
    for x, y in data:
        task(x, y)['loss'].backward()
        opt.step()
        opt.zero_grad()
    return flat(model.parameters()).detach()


def _ddp_worker(rank, world_size, port):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world_size)
    try:
        base, data = tiny_vit(), images(STEPS)
        halves = [(x.chunk(2)[rank], y.chunk(2)[rank]) for x, y in data]
        for name in VARIANTS:
            one_process = _run(copy.deepcopy(base), name, data)
            two = _run(copy.deepcopy(base), name, halves, distributed=True)
            torch.testing.assert_close(two, one_process, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f'{n}: {m}')
    finally:
        dist.destroy_process_group()


def test_ddp_on_two_processes_equals_one_process_on_the_whole_batch():
    spawn_gloo(_ddp_worker, nprocs=2)


@pytest.mark.parametrize('name', list(VARIANTS))
def test_fp16_loss_scaling_through_timms_native_scaler_equals_fp32(name):
    model, data = tiny_vit(), images(STEPS)
    expected = _run(copy.deepcopy(model), name, data)
    scaled = copy.deepcopy(model)
    opt = create_optimizer_v2(scaled, name, lr=0.1, **VARIANTS[name])
    if isinstance(opt, SAM):
        train_py_fp16(scaled, opt, data)
    else:  # train.py's fp16 route without the SAM replay train_py_fp16 opts in to
        task = ClassificationTask(scaled, nn.CrossEntropyLoss(), verbose=False)
        scaler = NativeScaler(device='cpu')
        scaler._scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
        for x, y in data:
            scaler(task(x, y)['loss'], opt, parameters=scaled.parameters())
            opt.zero_grad()
    torch.testing.assert_close(flat(scaled.parameters()).detach(), expected)
