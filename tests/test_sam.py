"""SAM optimizer: semantics against an independent two-pass reference, the three ways to drive it,
AMP, clipping, accumulation, state_dict/resume, schedulers/EMA, bad input."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.scheduler import CosineLRScheduler
from timm.task import ClassificationTask
from timm.utils import ModelEmaV3, NativeScaler

from timm_ext.optim import SAM


def _mlp(bn: bool = False) -> nn.Module:
    layers = [nn.Linear(6, 8)] + ([nn.BatchNorm1d(8)] if bn else []) + [nn.GELU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def _batch(n: int = 8, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _reference_sam(model, x, y, rho, adaptive=False, eta=0.0, base_cls=torch.optim.SGD, steps=1, **base_kw):
    """Independent SAM: flattened global norm, perturbation on a deep copy, base step with the copy's grad."""
    model = copy.deepcopy(model)
    opt = base_cls(model.parameters(), **base_kw)
    perturbations = []
    for _ in range(steps):
        params = list(model.parameters())
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        g = _flat(grads)
        if adaptive:
            t = _flat([p.detach().abs() + eta for p in params])
            e = rho * t * t * g / (t * g).norm()
        else:
            e = rho * g / g.norm()
        perturbed = copy.deepcopy(model)
        with torch.no_grad():
            offset = 0
            for p in perturbed.parameters():
                p.add_(e[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        grads2 = torch.autograd.grad(F.cross_entropy(perturbed(x), y), list(perturbed.parameters()))
        for p, g2 in zip(model.parameters(), grads2):
            p.grad = g2.clone()
        opt.step()
        opt.zero_grad()
        perturbations.append(e)
    return model, perturbations


def _closure(model, opt, x, y, seen=None):
    def closure():
        opt.zero_grad()
        if seen is not None:
            seen.append(_flat([p.detach().clone() for p in model.parameters()]))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss
    return closure


# ---- semantics -----------------------------------------------------------------------------------

@pytest.mark.parametrize('adaptive', [False, True])
def test_perturbation_is_global_l2_and_update_matches_reference(adaptive):
    model = _mlp()
    x, y = _batch()
    w0 = _flat([p.detach().clone() for p in model.parameters()])
    ref_model, (e_ref,) = _reference_sam(model, x, y, rho=0.3, adaptive=adaptive, eta=0.02, lr=0.1, momentum=0.9)

    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.3, adaptive=adaptive, eta=0.02)
    seen = []
    loss = opt.step(_closure(model, opt, x, y, seen))
    torch.testing.assert_close(seen[0], w0, rtol=0, atol=0)
    torch.testing.assert_close(seen[1] - w0, e_ref)
    assert math.isclose((seen[1] - w0).norm().item(), 0.3, rel_tol=1e-5) != adaptive
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)
    assert torch.isclose(loss, F.cross_entropy(_mlp_copy_at(model, w0)(x), y))


def _mlp_copy_at(model, flat_w):
    out = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(flat_w, out.parameters())
    return out


def test_per_group_rho_uses_one_global_norm():
    model = _mlp()
    x, y = _batch()
    groups = [{'params': model[0].parameters(), 'rho': 0.5}, {'params': model[2].parameters()}]
    opt = SAM(torch.optim.SGD(groups, lr=0.0), rho=0.1)
    F.cross_entropy(model(x), y).backward()
    g = [p.grad.clone() for p in model.parameters()]
    norm = _flat(g).norm()
    w0 = [p.detach().clone() for p in model.parameters()]
    opt.first_step()
    rhos = [0.5, 0.5, 0.1, 0.1]
    for p, p0, gi, rho in zip(model.parameters(), w0, g, rhos):
        torch.testing.assert_close(p - p0, rho * gi / norm)
    F.cross_entropy(model(x), y).backward()
    opt.second_step()


@pytest.mark.parametrize('bad', [0.0, float('inf'), float('nan')])
def test_zero_or_nonfinite_grad_norm_perturbs_nothing(bad):
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.0), rho=0.2)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    model[0].weight.grad[0, 0] = bad
    w0 = [p.detach().clone() for p in model.parameters()]
    opt.first_step()
    for p, p0 in zip(model.parameters(), w0):
        assert torch.equal(p, p0)
    F.cross_entropy(model(x), y).backward()
    opt.second_step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_restore_is_bit_exact():
    torch.manual_seed(3)
    model = nn.Linear(64, 64)
    with torch.no_grad():
        model.weight.mul_(1e3)  # large weights: w + e - e would not round-trip
    x = torch.randn(16, 64)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.0), rho=0.7)
    w0 = [p.detach().clone() for p in model.parameters()]
    opt.step(lambda: model(x).square().mean().backward())
    assert all(torch.equal(p, p0) for p, p0 in zip(model.parameters(), w0))


def test_batchnorm_stats_come_from_first_pass_only():
    model = _mlp(bn=True)
    x, y = _batch()
    ref = copy.deepcopy(model)
    ref(x)  # one train-mode forward at w: the expected statistics
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.5, model=model)
    opt.step(_closure(model, opt, x, y))
    bn, bn_ref = model[1], ref[1]
    assert bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(bn.running_mean, bn_ref.running_mean, rtol=0, atol=0)
    torch.testing.assert_close(bn.running_var, bn_ref.running_var, rtol=0, atol=0)


def test_explicit_closure_and_task_replay_agree():
    x, y = _batch()
    base = _mlp(bn=True)
    results = []
    for mode in ('explicit', 'closure', 'task'):
        model = copy.deepcopy(base)
        opt = SAM(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1), rho=0.2, model=model)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
        for _ in range(3):
            if mode == 'explicit':
                F.cross_entropy(model(x), y).backward()
                opt.first_step()
                F.cross_entropy(model(x), y).backward()
                opt.second_step()
            elif mode == 'closure':
                opt.step(_closure(model, opt, x, y))
            else:
                task(x, y)['loss'].backward()
                opt.step()
            opt.zero_grad()
        results.append(model)
    for other in results[1:]:
        for p, q in zip(results[0].state_dict().values(), other.state_dict().values()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_task_replay_matches_reference_over_steps():
    model = _mlp()
    x, y = _batch()
    ref_model, _ = _reference_sam(model, x, y, rho=0.1, base_cls=torch.optim.AdamW, steps=3, lr=0.01)
    opt = SAM(torch.optim.AdamW(model.parameters(), lr=0.01), rho=0.1)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    for _ in range(3):
        task(x, y)['loss'].backward()
        opt.step()
        opt.zero_grad()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)


def test_gradient_accumulation_is_sam_over_the_whole_window():
    model = _mlp()
    x, y = _batch(8)
    ref_model, _ = _reference_sam(model, x, y, rho=0.2, lr=0.5)  # full batch = mean of 2 halves
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.2)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    for xs, ys in zip(x.chunk(2), y.chunk(2)):  # what train.py does with --grad-accum-steps 2
        (task(xs, ys)['loss'] / 2).backward()
    opt.step()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)


# ---- clipping ------------------------------------------------------------------------------------

def test_clip_applies_to_second_pass_gradient():
    model = _mlp()
    x, y = _batch()
    _, (e,) = _reference_sam(model, x, y, rho=0.3, lr=0.0)
    at_e = _mlp_copy_at(model, _flat(model.parameters()).detach() + e)
    g2 = _flat(torch.autograd.grad(F.cross_entropy(at_e(x), y), list(at_e.parameters())))
    clip = 0.01 * g2.norm().item()
    w0 = _flat(model.parameters()).detach().clone()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=1.0), rho=0.3, clip_grad=clip)
    opt.step(_closure(model, opt, x, y))
    update = w0 - _flat(model.parameters()).detach()
    torch.testing.assert_close(update, g2 * clip / (g2.norm() + 1e-6))


def test_first_pass_norm_clip_does_not_change_perturbation():
    model = _mlp()
    x, y = _batch()
    w0 = _flat(model.parameters()).detach().clone()
    _, (e,) = _reference_sam(model, x, y, rho=0.3, lr=0.0)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.0), rho=0.3)
    F.cross_entropy(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # what train.py's --clip-grad does
    opt.first_step()
    torch.testing.assert_close(_flat(model.parameters()).detach() - w0, e)
    F.cross_entropy(model(x), y).backward()
    opt.second_step()


# ---- AMP -----------------------------------------------------------------------------------------

class _AutocastProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.states = []

    def forward(self, x):
        self.states.append((torch.is_autocast_enabled('cpu'), torch.get_autocast_dtype('cpu')))
        return x


def test_bf16_autocast_state_is_replayed():
    model = nn.Sequential(_mlp(), _AutocastProbe())
    x, y = _batch()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.1)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = task(x, y)['loss']
    loss.backward()
    opt.step()
    assert model[1].states == [(True, torch.bfloat16)] * 2
    assert all(p.dtype == torch.float32 for p in model.parameters())


def _scaled_run(scale, steps=2, inf_at=None, train_clip=1.0, sam_clip=0.5):
    """train.py's fp16 path on CPU: NativeScaler(loss, optimizer) -> GradScaler.step(sam)."""
    torch.manual_seed(0)
    model = _mlp()
    x, y = _batch()
    calls = {'n': 0}

    def criterion(out, target):
        calls['n'] += 1
        loss = F.cross_entropy(out, target)
        return loss * float('inf') if calls['n'] == inf_at else loss

    task = ClassificationTask(model, criterion, verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2, clip_grad=sam_clip)
    scaler = NativeScaler(device='cpu')
    scaler._scaler = torch.amp.GradScaler('cpu', init_scale=scale)
    weights = []
    for _ in range(steps):
        weights.append([p.detach().clone() for p in model.parameters()])
        scaler(task(x, y)['loss'], opt, clip_grad=train_clip, parameters=model.parameters())
        opt.zero_grad()
    weights.append([p.detach().clone() for p in model.parameters()])
    return weights, scaler._scaler.get_scale()


@pytest.mark.parametrize('train_clip', [None, 100.0])  # train.py unscales before its clip, or step() does
def test_grad_scaler_second_backward_is_scaled_and_unscaled(train_clip):
    torch.manual_seed(0)
    x, y = _batch()
    ref_model, _ = _reference_sam(_mlp(), x, y, rho=0.2, steps=2, lr=0.1, momentum=0.9)
    weights, scale = _scaled_run(2.0 ** 12, train_clip=train_clip, sam_clip=None)
    for p, q in zip(ref_model.parameters(), weights[-1]):
        torch.testing.assert_close(p, q)
    assert scale == 2.0 ** 12


@pytest.mark.parametrize('mode', ['closure', 'explicit'])
def test_grad_scaler_in_custom_loops(mode):
    x, y = _batch()
    ref_model, _ = _reference_sam(_mlp(), x, y, rho=0.2, steps=2, lr=0.1, momentum=0.9)
    torch.manual_seed(0)
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2)
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    for _ in range(2):
        if mode == 'closure':
            def closure():
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
                return loss
            opt.step(closure, grad_scaler=scaler)
        else:
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            opt.first_step(grad_scaler=scaler)
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            opt.second_step(grad_scaler=scaler, zero_grad=True)
        scaler.update()
    for p, q in zip(ref_model.parameters(), model.parameters()):
        torch.testing.assert_close(p, q)
    assert scaler.get_scale() == 2.0 ** 10


@pytest.mark.parametrize('inf_at', [1, 2])  # overflow in the first pass (1) or only in the replay (2)
def test_grad_scaler_skips_overflow_step_restores_weights_and_backs_off(inf_at):
    weights, scale = _scaled_run(2.0 ** 12, steps=2, inf_at=inf_at)
    assert all(torch.equal(p, q) for p, q in zip(weights[0], weights[1]))  # skipped, restored bit-exactly
    assert not all(torch.equal(p, q) for p, q in zip(weights[1], weights[2]))  # next step runs
    assert scale == 2.0 ** 11


# ---- state_dict / resume / schedulers / EMA -------------------------------------------------------

def _train(model, opt, task, batches):
    for x, y in batches:
        task(x, y)['loss'].backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize('base_cls,kw', [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9)), (torch.optim.AdamW, dict(lr=1e-2))])
def test_state_dict_round_trip_and_bit_identical_resume(base_cls, kw):
    batches = [_batch(8, seed=s) for s in range(6)]
    torch.manual_seed(0)
    model = _mlp(bn=True)
    init = copy.deepcopy(model.state_dict())

    def make(m):
        return SAM(base_cls(m.parameters(), **kw), rho=0.15, adaptive=True, clip_grad=2.0), \
            ClassificationTask(m, nn.CrossEntropyLoss(), verbose=False)

    opt, task = make(model)
    _train(model, opt, task, batches)
    uninterrupted = copy.deepcopy(model.state_dict())

    model = _mlp(bn=True)
    model.load_state_dict(init)
    opt, task = make(model)
    _train(model, opt, task, batches[:3])
    sd = copy.deepcopy(opt.state_dict())
    model_sd = copy.deepcopy(model.state_dict())
    assert sd['sam'] == {'clip_grad': 2.0, 'clip_mode': 'norm'}
    assert all(g['rho'] == 0.15 and g['adaptive'] for g in sd['param_groups'])
    key = 'momentum_buffer' if base_cls is torch.optim.SGD else 'exp_avg_sq'
    assert all(key in s for s in sd['state'].values()) and len(sd['state']) == 6

    resumed = _mlp(bn=True)
    resumed.load_state_dict(model_sd)
    opt2 = SAM(base_cls(resumed.parameters(), **kw), rho=0.9)
    opt2.load_state_dict(sd)
    assert opt2.param_groups is opt2.base_optimizer.param_groups
    assert opt2.param_groups[0]['rho'] == 0.15 and opt2.clip_grad == 2.0
    _train(resumed, opt2, ClassificationTask(resumed, nn.CrossEntropyLoss(), verbose=False), batches[3:])
    for k, v in uninterrupted.items():
        assert torch.equal(v, resumed.state_dict()[k]), k


def test_plain_base_state_dict_loads_into_sam():
    model = _mlp()
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    F.cross_entropy(model(_batch()[0]), _batch()[1]).backward()
    adamw.step()
    opt = SAM(torch.optim.AdamW(model.parameters(), lr=1e-3), rho=0.3)
    opt.load_state_dict(adamw.state_dict())
    assert opt.param_groups[0]['rho'] == 0.3 and len(opt.state) == 4


def test_timm_scheduler_drives_base_lr_and_ema_sees_restored_weights():
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.5)
    sched = CosineLRScheduler(opt, t_initial=10, warmup_t=2, warmup_lr_init=0.01)
    assert opt.base_optimizer.param_groups[0]['lr'] == 0.01
    sched.step(1)
    assert opt.base_optimizer.param_groups[0]['lr'] == pytest.approx(0.01 + (0.1 - 0.01) / 2)
    ema = ModelEmaV3(model, decay=0.5)
    ema_ref = [p.detach().clone() for p in model.parameters()]
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    task(x, y)['loss'].backward()
    opt.step()
    ema.update(model)
    for e, p, r in zip(ema.module.parameters(), model.parameters(), ema_ref):
        torch.testing.assert_close(e, 0.5 * r + 0.5 * p.detach())


def test_torch_lr_scheduler_sees_the_step_without_order_warning():
    import warnings
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        task(x, y)['loss'].backward()
        opt.step()
        sched.step()
    assert opt.base_optimizer.param_groups[0]['lr'] == pytest.approx(0.05)


# ---- bad input -----------------------------------------------------------------------------------

def _sgd():
    return torch.optim.SGD(_mlp().parameters(), lr=0.1)


@pytest.mark.parametrize('kwargs,match', [
    (dict(rho=-0.1), r'rho must be a finite number >= 0, got rho=-0.1'),
    (dict(rho=float('nan')), r'rho=nan'),
    (dict(eta=-1.0), r'eta must be >= 0, got eta=-1.0'),
    (dict(clip_grad=0.0), r'clip_grad must be > 0 or None, got clip_grad=0.0'),
    (dict(clip_mode='l1'), r"clip_mode must be one of \('norm', 'value', 'agc'\), got clip_mode='l1'"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SAM(_sgd(), **kwargs)


def test_bad_group_rho_and_bad_base():
    model = _mlp()
    with pytest.raises(ValueError, match=r'got rho=-1 in param group 1'):
        SAM(torch.optim.SGD([{'params': model[0].parameters()}, {'params': model[2].parameters(), 'rho': -1}],
                            lr=0.1))
    with pytest.raises(ValueError, match=r'SAM needs an optimizer instance to wrap, got type'):
        SAM(torch.optim.SGD)


def test_step_without_closure_grads_or_task_says_how_to_use():
    opt = SAM(_sgd())
    with pytest.raises(RuntimeError, match=r'no closure, no gradients and no captured training-task call: pass a '
                                           r'closure \(optimizer.step\(closure\)\), call first_step\(\)'):
        opt.step()


def test_auto_replay_outside_task_api_is_an_error_not_a_plain_step():
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    F.cross_entropy(model(x), y).backward()
    w0 = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"can only re-evaluate the loss inside timm's train.py task API"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), w0))


def test_step_after_task_call_without_backward():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)(*_batch())
    with pytest.raises(RuntimeError, match=r'the training task ran but no gradients exist'):
        opt.step()


def test_second_step_before_first_step_and_double_first_step():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match=r'second_step\(\) was called before first_step\(\)'):
        opt.second_step()
    F.cross_entropy(model(_batch()[0]), _batch()[1]).backward()
    opt.first_step(zero_grad=False)
    with pytest.raises(RuntimeError, match=r'first_step\(\) was called twice'):
        opt.first_step()


def test_failed_second_pass_leaves_weights_at_w():
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.5)
    w0 = [p.detach().clone() for p in model.parameters()]
    calls = {'n': 0}

    def closure():
        calls['n'] += 1
        if calls['n'] == 2:
            raise MemoryError('out of memory in the second pass')
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with pytest.raises(MemoryError):
        opt.step(closure)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), w0))


# ---- DDP: 2 gloo CPU processes ------------------------------------------------------------------

def _ref_m_sharpness(model, shards, rho, lr):
    """Per-worker perturbation from each shard's own gradient; second-pass gradients averaged."""
    model = copy.deepcopy(model)
    grads2 = []
    for x, y in shards:
        params = list(model.parameters())
        g = _flat(torch.autograd.grad(F.cross_entropy(model(x), y), params))
        at_e = _mlp_copy_at(model, _flat(params).detach() + rho * g / g.norm())
        grads2.append(_flat(torch.autograd.grad(F.cross_entropy(at_e(x), y), list(at_e.parameters()))))
    g2 = torch.stack(grads2).mean(0)
    return _mlp_copy_at(model, _flat(model.parameters()).detach() - lr * g2)


def _ddp_worker(rank, world_size, port):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        base = _mlp()
        x, y = _batch(16, seed=5)
        halves = list(zip(x.chunk(2), y.chunk(2)))
        quarters = list(zip(x.chunk(4), y.chunk(4)))

        def same_on_all_ranks(model):
            flat = _flat(model.parameters()).detach()
            others = [torch.empty_like(flat) for _ in range(world_size)]
            dist.all_gather(others, flat)
            return all(torch.equal(o, others[0]) for o in others)

        # (a) train.py's task API under DDP: global SAM == single-process SAM on the whole batch
        model = copy.deepcopy(base)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False).prepare_distributed(device_ids=None)
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho=0.2)
        for _ in range(2):
            task(*halves[rank])['loss'].backward()
            opt.step()
            opt.zero_grad()
        ref, _ = _reference_sam(base, x, y, rho=0.2, steps=2, lr=0.5, momentum=0.9)
        torch.testing.assert_close(_flat(model.parameters()), _flat(ref.parameters()))
        assert same_on_all_ranks(model)

        # (b) + gradient accumulation (2 micro-batches per rank, the first inside no_sync like train.py)
        model = copy.deepcopy(base)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False).prepare_distributed(device_ids=None)
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.2)
        mine = quarters[2 * rank:2 * rank + 2]
        # newer timm tasks have no_sync(); timm 1.0.23's keeps the DDP module in task.model
        no_sync = task.no_sync if hasattr(task, 'no_sync') else task.model.no_sync
        with no_sync():
            (task(*mine[0])['loss'] / 2).backward()
        (task(*mine[1])['loss'] / 2).backward()
        opt.step()
        ref, _ = _reference_sam(base, x, y, rho=0.2, lr=0.5)
        torch.testing.assert_close(_flat(model.parameters()), _flat(ref.parameters()))
        assert same_on_all_ranks(model)

        # (c) m-sharpness with step(closure, no_sync=...) and (d) with the explicit steps
        ref = _ref_m_sharpness(base, halves, rho=0.3, lr=0.5)
        for mode in ('closure', 'explicit'):
            model = copy.deepcopy(base)
            ddp = DDP(model)
            opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3)
            xs, ys = halves[rank]
            if mode == 'closure':
                def closure(opt=opt, ddp=ddp, xs=xs, ys=ys):
                    opt.zero_grad()
                    loss = F.cross_entropy(ddp(xs), ys)
                    loss.backward()
                    return loss
                opt.step(closure, no_sync=ddp.no_sync)
            else:
                with ddp.no_sync():
                    F.cross_entropy(ddp(xs), ys).backward()
                opt.first_step()
                F.cross_entropy(ddp(xs), ys).backward()
                opt.second_step()
            torch.testing.assert_close(_flat(model.parameters()), _flat(ref.parameters()))
            assert same_on_all_ranks(model)
    finally:
        dist.destroy_process_group()


def test_ddp_two_gloo_processes():
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    # fork: the workers reuse the imported torch/timm instead of importing them again (seconds on 2 cores)
    mp.start_processes(_ddp_worker, args=(2, port), nprocs=2, join=True, start_method='fork')
