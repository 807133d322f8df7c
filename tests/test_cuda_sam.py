"""The SAM family on CUDA (marker `cuda`): the same dropout / drop-path masks in both passes with the CUDA
generator, fp16 with GradScaler, bf16 autocast, and 2 processes sharing one GPU under DDP (gloo), each against an
independent reference as the CPU tests check them. ``TIMM_EXT_CUDA_TESTS_ON=cpu`` runs the bodies on the CPU."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _cuda import chosen_device, manual_seed, spawn
from _sam_reference import at, flat, grad, mlp, sgd_reference
from timm.models.vision_transformer import VisionTransformer
from timm.task import ClassificationTask
from timm.utils import NativeScaler

from timm_ext.optim import GSAM, SAM, LookSAM, replay_timm_task

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings('ignore:SAM does not know the model')]


# ---- the same random masks in both passes -------------------------------------------------------------

def _dropout_vit(device):
    torch.manual_seed(0)
    return VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2., num_classes=3,
        drop_rate=0.1, pos_drop_rate=0.1, proj_drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.2).to(device)


def _image_batches(device, n=3):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(4, 3, 8, 8, generator=g).to(device), torch.randint(0, 3, (4,), generator=g).to(device))
            for _ in range(n)]


def _perturbation(model, g, rho, adaptive, eta=0.01):
    if not adaptive:
        return rho * g / g.norm()
    t = flat([p.detach().abs() + eta for p in model.parameters()])
    return rho * t * t * g / (t * g).norm()


def _reference_masks(model, batches, rho, adaptive, same_masks, lr=0.1):
    """Independent two-pass SAM / ASAM (SGD) in train mode: with ``same_masks`` the second pass starts from the
    device's generator state of the first and leaves it as the first left it, otherwise it draws new masks."""
    device = next(model.parameters()).device

    def state():
        return torch.cuda.get_rng_state(device) if device.type == 'cuda' else torch.get_rng_state()

    def restore(s):
        if device.type == 'cuda':
            torch.cuda.set_rng_state(s, device)
        else:
            torch.set_rng_state(s)

    def direction(model, t, xy):
        x, y = xy
        before = state()
        g = grad(model, x, y)
        after = state()
        if same_masks:
            restore(before)
        h = grad(at(model, flat(model.parameters()).detach() + _perturbation(model, g, rho, adaptive)), x, y)
        if same_masks:
            restore(after)
        return h

    manual_seed(device, 123)
    return sgd_reference(model, batches, direction, lr, momentum=0.0)


@pytest.mark.parametrize('adaptive', [False, True], ids=['sam', 'asam'])
def test_both_passes_draw_the_same_dropout_and_drop_path_masks(device, adaptive):
    model, batches = _dropout_vit(device), _image_batches(device)
    ours = copy.deepcopy(model)
    opt = SAM(torch.optim.SGD(ours.parameters(), lr=0.1), rho=0.3, adaptive=adaptive, model=ours)
    task = ClassificationTask(ours, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    manual_seed(device, 123)
    for x, y in batches:
        task(x, y)['loss'].backward()
        opt.step()
        opt.zero_grad()
    ours = flat(ours.parameters()).detach()
    same = _reference_masks(model, batches, rho=0.3, adaptive=adaptive, same_masks=True)
    fresh = _reference_masks(model, batches, rho=0.3, adaptive=adaptive, same_masks=False)
    torch.testing.assert_close(ours, same)
    assert (ours - fresh).abs().max() > 1e-3  # new masks in the second pass would be a different update


class _MaskProbe(nn.Module):
    """Dropout that keeps each forward's mask (drawn from the device's generator)."""

    def __init__(self):
        super().__init__()
        self.masks = []

    def forward(self, x):
        out = F.dropout(x, 0.3, self.training)
        self.masks.append((out != 0).cpu())
        return out


_VARIANTS = {
    'sam': lambda opt, m: SAM(opt, rho=0.3, model=m),
    'asam': lambda opt, m: SAM(opt, rho=1.0, adaptive=True, model=m),
    'gsam': lambda opt, m: GSAM(opt, rho_max=0.3, rho_min=0.1, alpha=0.5, model=m),
    'looksam': lambda opt, m: LookSAM(opt, rho=0.3, interval=2, model=m),
    'interval': lambda opt, m: SAM(opt, rho=0.3, interval=2, model=m),
    'm_sharpness': lambda opt, m: SAM(opt, rho=0.3, m_sharpness=4, model=m),
}


@pytest.mark.parametrize('variant', list(_VARIANTS))
def test_every_variant_replays_each_pass_with_its_masks(device, variant):
    """train.py's route (task, backward, step): every pass SAM adds sees the masks of the pass it repeats
    (m-sharpness: each chunk's two passes share masks), and every step draws new ones."""
    torch.manual_seed(0)
    probe = _MaskProbe()
    model = nn.Sequential(nn.Linear(6, 16), probe, nn.GELU(), nn.Linear(16, 3)).to(device)
    opt = _VARIANTS[variant](torch.optim.SGD(model.parameters(), lr=0.1), model)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    manual_seed(device, 123)
    per_step = []
    for s in range(4):
        x, y = (t.to(device) for t in mlp_batch(s))
        before = len(probe.masks)
        task(x, y)['loss'].backward()
        opt.step()
        opt.zero_grad()
        per_step.append(probe.masks[before:])
    sam_steps = [0, 2] if variant in ('looksam', 'interval') else [0, 1, 2, 3]
    for s, masks in enumerate(per_step):
        if s not in sam_steps:
            assert len(masks) == 1  # a plain step: train.py's pass only
        elif variant == 'm_sharpness':  # train.py's pass, then per chunk of 4 rows: at w and at w + e
            assert [m.shape[0] for m in masks] == [8, 4, 4, 4, 4]
            assert torch.equal(masks[1], masks[2]) and torch.equal(masks[3], masks[4])
            assert not torch.equal(masks[1], masks[3])
        else:
            assert len(masks) == 2 and torch.equal(masks[0], masks[1])
    assert not torch.equal(per_step[0][0], per_step[1][0])  # each step draws new masks


def mlp_batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


# ---- AMP ----------------------------------------------------------------------------------------------

def _sam_reference(model, batches, rho, lr, momentum=0.9):
    """Two-pass SAM in float32, no autocast: the update the mixed-precision runs approximate."""
    def direction(model, t, xy):
        g = grad(model, *xy)
        return grad(at(model, flat(model.parameters()).detach() + rho * g / g.norm()), *xy)
    return sgd_reference(model, batches, direction, lr, momentum)


class _Probe(nn.Module):
    """Identity recording the autocast state of each forward and the summed |gradient| of each backward."""

    def __init__(self, device_type):
        super().__init__()
        self.device_type, self.states, self.grad_sums = device_type, [], []

    def forward(self, x):
        self.states.append((torch.is_autocast_enabled(self.device_type), torch.get_autocast_dtype(self.device_type)))
        if x.requires_grad:
            x.register_hook(lambda g: self.grad_sums.append(g.abs().sum().item()))
        return x


def _amp_run(device, dtype, scale=None, inf_at=None, steps=2):
    """train.py's AMP path: autocast around the task, NativeScaler(loss, optimizer) for fp16."""
    torch.manual_seed(0)
    model = nn.Sequential(mlp(), _Probe(device.type)).to(device)
    calls = {'n': 0}

    def criterion(out, target):
        calls['n'] += 1
        loss = F.cross_entropy(out.float(), target)
        return loss * float('inf') if calls['n'] == inf_at else loss

    task = ClassificationTask(model, criterion, verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2, model=model)
    replay_timm_task(opt, task)
    scaler = None
    if scale is not None:
        scaler = NativeScaler(device=device.type)
        scaler._scaler = torch.amp.GradScaler(device.type, init_scale=scale)
    weights = [flat(model.parameters()).detach().clone()]
    x, y = (t.to(device) for t in mlp_batch(1))
    for _ in range(steps):
        with torch.autocast(device.type, dtype=dtype):
            loss = task(x, y)['loss']
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler(loss, opt, clip_grad=None, parameters=model.parameters())
        opt.zero_grad()
        weights.append(flat(model.parameters()).detach().clone())
    return model, weights, scaler


@pytest.mark.filterwarnings('ignore:GradScaler is going to stop passing itself:FutureWarning')
def test_fp16_grad_scaler_scales_the_second_pass_and_matches_float32_sam(device):
    model, weights, scaler = _amp_run(device, torch.float16, scale=2.0 ** 12)
    x, y = (t.to(device) for t in mlp_batch(1))
    expected = _sam_reference(mlp().to(device), [(x, y)] * 2, rho=0.2, lr=0.1)
    torch.testing.assert_close(weights[-1], expected, rtol=1e-2, atol=2e-3)  # fp16 matmuls: ~1e-3
    assert scaler._scaler.get_scale() == 2.0 ** 12
    sums = model[1].grad_sums
    assert len(sums) == 4 and sums[0] > 2.0 ** 8  # |d loss / d logits| summed is <= 2 unscaled: scaled ...
    assert sums[1] / sums[0] == pytest.approx(1.0, rel=0.2)  # ... and the replay with the same scale
    assert model[1].states == [(True, torch.float16)] * 4


@pytest.mark.filterwarnings('ignore:GradScaler is going to stop passing itself:FutureWarning')
@pytest.mark.parametrize('inf_at', [1, 2])  # overflow in train.py's pass (1) or only in the replay (2)
def test_fp16_overflow_skips_the_step_with_the_weights_bit_exact(device, inf_at):
    _, weights, scaler = _amp_run(device, torch.float16, scale=2.0 ** 12, inf_at=inf_at)
    assert torch.equal(weights[0], weights[1])  # skipped, restored bit-exactly
    assert not torch.equal(weights[1], weights[2])  # the next step runs
    assert scaler._scaler.get_scale() == 2.0 ** 11


def test_bf16_autocast_is_replayed_and_matches_float32_sam(device):
    model, weights, _ = _amp_run(device, torch.bfloat16)
    assert model[1].states == [(True, torch.bfloat16)] * 4
    assert all(p.dtype == torch.float32 for p in model.parameters())
    x, y = (t.to(device) for t in mlp_batch(1))
    expected = _sam_reference(mlp().to(device), [(x, y)] * 2, rho=0.2, lr=0.1)
    torch.testing.assert_close(weights[-1], expected, rtol=5e-2, atol=2e-2)  # bf16 has 8 bits of mantissa
    assert (weights[-1] - weights[0]).norm() > 10 * (weights[-1] - expected).norm()


# ---- DDP: 2 processes on one device (gloo; NCCL refuses two ranks on one GPU) ---------------------------

def _ddp_worker(rank, world_size, port):
    import torch.distributed as dist
    torch.set_num_threads(1)
    device = chosen_device()
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world_size)
    try:
        base = mlp().to(device)
        x, y = (t.to(device) for t in mlp_batch(5))
        model = copy.deepcopy(base)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False).prepare_distributed(
            device_ids=[device.index or 0] if device.type == 'cuda' else None)
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho=0.2, model=model)
        replay_timm_task(opt, task)  # the DDP-wrapped task prepare_distributed returned
        for _ in range(2):
            task(x.chunk(2)[rank], y.chunk(2)[rank])['loss'].backward()
            opt.step()
            opt.zero_grad()
        ours = flat(model.parameters()).detach()
        torch.testing.assert_close(ours, _sam_reference(base, [(x, y)] * 2, rho=0.2, lr=0.5))
        gathered = [torch.empty_like(ours.cpu()) for _ in range(world_size)]
        dist.all_gather(gathered, ours.cpu())
        assert all(torch.equal(g, gathered[0]) for g in gathered)
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_on_one_device_equal_one_process_on_the_whole_batch(device):
    spawn(_ddp_worker, nprocs=2)
