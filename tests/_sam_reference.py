"""Shared pieces of the SAM-family tests (GSAM, LookSAM, interval, m-sharpness): a tiny seeded MLP, batches,
flattened-vector helpers for the independent references, and one driver for the closure / explicit / task
routes. The references built from these use only torch, never timm_ext, so they stay independent of the
code under test."""
import copy
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.task import ClassificationTask
from timm.utils import NativeScaler

from timm_ext.optim import replay_timm_task

Batch = Tuple[torch.Tensor, torch.Tensor]


def mlp(bn: bool = False) -> nn.Module:
    """Same seed, same weights: the optimizer and its reference start from one point."""
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8)] + ([nn.BatchNorm1d(8)] if bn else []) + [nn.GELU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def batch(n: int = 8, seed: int = 1) -> Batch:
    """A seeded batch for :func:`mlp` (6 features, 3 classes)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def batches(n: int = 5) -> List[Batch]:
    """``n`` batches of 8, seeded 0 .. n - 1, so that consecutive steps see different data."""
    return [batch(8, seed=s) for s in range(n)]


def flat(tensors) -> torch.Tensor:
    """The references work on one flattened vector, as the papers write the updates."""
    return torch.cat([t.reshape(-1) for t in tensors])


def at(model: nn.Module, flat_w: torch.Tensor) -> nn.Module:
    """A copy of ``model`` at the flat weights ``flat_w`` (e.g. w + e), leaving ``model`` untouched."""
    out = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(flat_w, out.parameters())
    return out


def grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The flat cross-entropy gradient at the model's weights, without touching ``.grad``."""
    return flat(torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters())))


def sgd_reference(model: nn.Module, data: Sequence[Batch], direction: Callable[[nn.Module, int, Batch], torch.Tensor],
                  lr: float, momentum: float = 0.9) -> torch.Tensor:
    """Torch SGD on a copy of ``model``, stepping along ``direction(model, t, (x, y))`` (a flat vector written
    into ``.grad``) on each batch; the final flat weights. The caller's direction is the reference update."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for t, xy in enumerate(data):
        d = direction(model, t, xy)
        offset = 0
        for p in model.parameters():
            p.grad = d[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
        opt.zero_grad()
    return flat(model.parameters()).detach()


def closure(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
            y: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The closure contract of ``step(closure)``: zero, forward, backward, return the loss."""
    def fn():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss
    return fn


def replayed_step_draws_nothing(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                                y: torch.Tensor) -> bool:
    """One step over a timm task replayed (``replay_timm_task``): the random state after it is the one the first
    pass left, i.e. SAM's second pass consumed no randomness of the run."""
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    task(x, y)['loss'].backward()
    after_first_pass = torch.get_rng_state()
    opt.step()
    return torch.equal(torch.get_rng_state(), after_first_pass)


def drive(model: nn.Module, opt: torch.optim.Optimizer, data: Sequence[Batch], route: str,
          make_closure: Optional[Callable] = None) -> None:
    """Train on ``data`` through one route: ``closure`` (``step(closure)``), ``explicit`` (first/second step
    when a SAM step is due, else a plain ``step()``) or ``task`` (timm's train.py: task backward, ``step()``).
    The task route opts in with ``replay_timm_task(opt)`` before building its task, as train.py's hooks do: the
    replay takes that task at its first call."""
    make_closure = make_closure or closure
    if route == 'task':
        replay_timm_task(opt)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    for x, y in data:
        if route == 'closure':
            opt.step(make_closure(model, opt, x, y))
        elif route == 'explicit':
            F.cross_entropy(model(x), y).backward()
            if opt.sam_step_due:
                opt.first_step()
                F.cross_entropy(model(x), y).backward()
                opt.second_step()
            else:
                opt.step()  # a plain step needs no closure and no task
        else:
            task(x, y)['loss'].backward()
            opt.step()
        opt.zero_grad()


def train_py_fp16(model: nn.Module, opt: torch.optim.Optimizer, data: Sequence[Batch],
                  clip_grad: Optional[float] = None) -> Tuple[ClassificationTask, NativeScaler]:
    """timm's train.py fp16 route: the task's loss through ``NativeScaler(loss, optimizer)`` (which calls
    ``GradScaler.step``), on a CPU GradScaler starting at 2 ** 10 so that tests can read its scale back. As in
    :func:`drive`, it opts in with ``replay_timm_task(opt)`` before building its task."""
    replay_timm_task(opt)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    scaler = NativeScaler(device='cpu')
    scaler._scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    for x, y in data:
        scaler(task(x, y)['loss'], opt, clip_grad=clip_grad, parameters=model.parameters())
        opt.zero_grad()
    return task, scaler


def spawn_gloo(worker: Callable, nprocs: int = 2, *args: Any) -> None:
    """Run ``worker(rank, nprocs, port, *args)`` (a module-level function) in ``nprocs`` processes on a free local
    port (gloo, CPU). They are forked from a fork server, a fresh process that imports torch, timm and timm_ext once
    per pytest worker, not from the pytest worker itself: PyTorch refuses a backward in a child forked from a process
    whose autograd engine has started its threads (a torch.compile backward does), and the worker may have run such
    a test first. The server keeps the environment of its start: what a worker needs goes in ``args``."""
    import multiprocessing
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    multiprocessing.set_forkserver_preload(['torch', 'timm', 'timm_ext'])
    mp.start_processes(worker, args=(nprocs, port, *args), nprocs=nprocs, join=True, start_method='forkserver')


# a small real timm model for the comparisons against pytorch_optimizer (WSAM, FriendlySAM)
def tiny_vit() -> nn.Module:
    """A seeded 2-block ViT on 16 px images, 3 classes."""
    import timm

    torch.manual_seed(0)
    return timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                             num_classes=3)


def images(n: int = 4) -> List[Batch]:
    """``n`` seeded batches of eight 16 px images for :func:`tiny_vit`."""
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def train(model: nn.Module, opt: torch.optim.Optimizer, data: Sequence[Batch],
          first_pass_outside: bool = False) -> torch.Tensor:
    """``opt.step(closure)`` over ``data`` (the gradient at w computed first where a reference's ``step`` expects
    it, ``first_pass_outside``); the final flat weights."""
    for x, y in data:
        fn = closure(model, opt, x, y)
        if first_pass_outside:
            fn()
        opt.step(fn)
        opt.zero_grad()
    return flat(model.parameters()).detach()


# AdamW in float32 turns rounding into visible differences (its update divides by sqrt(v)): plain SAM against
# pytorch_optimizer's SAM differs by 5e-5 there, so AdamW is compared in float64
REFERENCE_BASES = {'sgd-float32': (torch.optim.SGD, dict(lr=0.1, momentum=0.9), torch.float32),
                   'adamw-float64': (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.05), torch.float64)}
