"""SAM optimizer: semantics against an independent two-pass reference, the three ways to drive it,
random masks, AMP (both GradScaler contracts), clipping, accumulation, state_dict/resume, torch
optimizer machinery (hooks, copy, pickle), schedulers/EMA, bad input."""
import copy
import gc
import inspect
import logging
import math
import pickle
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import closure as closure_of
from _sam_reference import replayed_step_draws_nothing, spawn_gloo
from timm.models.vision_transformer import VisionTransformer
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.task import ClassificationTask, TrainingTask
from timm.utils import ModelEmaV3, NativeScaler, adaptive_clip_grad
from torch.optim.optimizer import register_optimizer_step_post_hook

from timm_ext.optim import SAM, replay_timm_task

# most tests drive SAM without model= on models without buffers; the warning has its own test
pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')
# train.py's fp16 path with SAM.step declaring grad_scaler: torch's (deprecated) argument contract
_SCALER_ARGUMENT_WARNING = 'ignore:GradScaler is going to stop passing itself:FutureWarning'
_TASK_CALL = TrainingTask.__call__  # what building a SAM must leave timm's task class with


def _watching():
    """Whether TrainingTask.__call__ is wrapped to find a task (replay_timm_task without a task)."""
    return TrainingTask.__call__ is not _TASK_CALL


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

@pytest.mark.timm_free
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
        if mode == 'task':
            replay_timm_task(opt, task)
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
    replay_timm_task(opt, task)
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
    replay_timm_task(opt, task)
    for xs, ys in zip(x.chunk(2), y.chunk(2)):  # what train.py does with --grad-accum-steps 2
        (task(xs, ys)['loss'] / 2).backward()
    opt.step()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)


# ---- the same random masks in both passes -------------------------------------------------------------

def _dropout_vit(device='cpu'):
    torch.manual_seed(0)
    return VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2., num_classes=3,
        drop_rate=0.1, pos_drop_rate=0.1, proj_drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.2).to(device)


def _image_batches(device='cpu', n=3):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(4, 3, 8, 8, generator=g).to(device), torch.randint(0, 3, (4,), generator=g).to(device))
            for _ in range(n)]


def _rng_states(device):
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == 'cuda' else None)


def _set_rng_states(device, states):
    torch.set_rng_state(states[0])
    if device.type == 'cuda':
        torch.cuda.set_rng_state(states[1], device)


def _reference_sam_masks(model, batches, rho, lr, same_masks):
    """Independent two-pass SAM (SGD) on a train-mode model; with ``same_masks`` the second pass starts from
    the generators' state of the first (the JAX code's one key per step) and leaves them as the first left
    them, otherwise it simply draws the next masks."""
    model = copy.deepcopy(model)
    device = next(model.parameters()).device
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    torch.manual_seed(123)
    if device.type == 'cuda':
        torch.cuda.manual_seed(123)
    for x, y in batches:
        before = _rng_states(device)
        params = list(model.parameters())
        g = _flat(torch.autograd.grad(F.cross_entropy(model(x), y), params))
        after = _rng_states(device)
        perturbed = _mlp_copy_at(model, _flat(params).detach() + rho * g / g.norm())
        if same_masks:
            _set_rng_states(device, before)
        grads2 = torch.autograd.grad(F.cross_entropy(perturbed(x), y), list(perturbed.parameters()))
        if same_masks:
            _set_rng_states(device, after)
        for p, g2 in zip(params, grads2):
            p.grad = g2.clone()
        opt.step()
        opt.zero_grad()
    return _flat(model.parameters()).detach()


def _sam_masks_run(model, batches, rho, lr, mode):
    model = copy.deepcopy(model)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=lr), rho=rho, model=model)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    if mode == 'task':
        replay_timm_task(opt, task)
    torch.manual_seed(123)
    if next(model.parameters()).device.type == 'cuda':
        torch.cuda.manual_seed(123)
    for x, y in batches:
        if mode == 'task':
            task(x, y)['loss'].backward()
            opt.step()
        else:
            opt.step(_closure(model, opt, x, y))
        opt.zero_grad()
    return _flat(model.parameters()).detach()


_DEVICES = ['cpu', pytest.param('cuda', marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA')])]


@pytest.mark.parametrize('device', _DEVICES)
@pytest.mark.parametrize('mode', ['task', 'closure'])
def test_both_passes_draw_the_same_dropout_and_drop_path_masks(mode, device):
    device = torch.device(device)
    model, batches = _dropout_vit(device), _image_batches(device)
    ours = _sam_masks_run(model, batches, rho=0.3, lr=0.1, mode=mode)
    same = _reference_sam_masks(model, batches, rho=0.3, lr=0.1, same_masks=True)
    fresh = _reference_sam_masks(model, batches, rho=0.3, lr=0.1, same_masks=False)
    torch.testing.assert_close(ours, same)
    assert (ours - fresh).abs().max() > 1e-3  # new masks in the second pass would be a different update


def test_random_state_after_a_step_is_as_without_the_second_pass():
    """The replay consumes no randomness: what the run draws next does not depend on SAM's second pass."""
    model, (x, y) = _dropout_vit(), _image_batches(n=1)[0]
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.3, model=model)
    assert replayed_step_draws_nothing(model, opt, x, y)


# ---- nothing held across steps -------------------------------------------------------------------------

def _run_and_watch_batches(step_fn, steps=5):
    refs = []
    for i in range(steps):
        x, y = _batch(seed=10 + i)
        refs.append(weakref.ref(x))
        step_fn(x, y)
    del x, y
    return [r() is not None for r in refs]


def test_explicit_steps_in_a_task_loop_hold_no_batch():
    model = _mlp()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    replay_timm_task(opt)  # opted in (as train.py's hooks do): the replay looks for the task
    assert _watching()

    def step(x, y):
        task(x, y)['loss'].backward()
        opt.first_step()
        task(x, y)['loss'].backward()
        opt.second_step()
        opt.zero_grad()

    assert _run_and_watch_batches(step) == [False] * 5
    assert not _watching()  # the explicit loop closed the capture: nothing looks for a task any more


def test_stale_sam_superseded_by_a_newer_one_holds_no_batch():
    model = _mlp()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    stale = SAM(torch.optim.SGD(model.parameters(), lr=0.1))  # created, still referenced, never stepped
    live = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    for opt in (stale, live):  # train.py's hooks opt in every SAM the factory builds
        replay_timm_task(opt)

    def step(x, y):
        task(x, y)['loss'].backward()
        live.step()
        live.zero_grad()

    assert _run_and_watch_batches(step) == [False] * 5
    task(*_batch())['loss'].backward()
    with pytest.raises(RuntimeError, match='no timm TrainingTask call was captured'):
        stale.step()  # superseded: it records nothing


def test_stale_sam_beside_a_plain_optimizer_holds_one_window_at_most():
    model = _mlp()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    stale = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    replay_timm_task(stale)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        task(x, y)['loss'].backward()
        plain.step()
        plain.zero_grad()

    held = _run_and_watch_batches(step)
    assert held == [False] * 4 + [True]  # only the latest window is still referenced (by the stale SAM)
    del stale
    gc.collect()
    assert _run_and_watch_batches(step, steps=1) == [False]  # and nothing once it is gone


def test_collected_sam_leaves_no_hook_on_the_task():
    model = _mlp()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    replay_timm_task(opt)  # the replay binds to the task at its first call below
    seen = []
    task.register_forward_pre_hook(lambda module, args: seen.append(len(args)))  # the user's own hook
    task(*_batch())['loss'].backward()
    ref = weakref.ref(opt)
    del opt
    gc.collect()
    x, y = _batch()
    x_ref = weakref.ref(x)
    task(x, y)['loss'].backward()
    del x, y
    assert ref() is None and x_ref() is None  # no hook of SAM's recorded the call
    assert seen == [2, 2]  # the user's hook is as they left it


# ---- a real torch optimizer: hooks, copy, pickle -------------------------------------------------------

def test_step_hooks_fire_around_every_route():
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    events = []
    opt.register_step_pre_hook(lambda o, args, kwargs: events.append(('pre', o)))
    opt.register_step_post_hook(lambda o, args, kwargs: events.append(('post', o)))
    handle = register_optimizer_step_post_hook(
        lambda o, args, kwargs: events.append(('global', o)) if o is opt else None)
    try:
        opt.step(_closure(model, opt, x, y))
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
        opt2 = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
        replay_timm_task(opt2, task)
        opt2.register_step_post_hook(lambda o, args, kwargs: events.append(('post', o)))
        task(x, y)['loss'].backward()
        opt2.step()
    finally:
        handle.remove()
    assert events == [('pre', opt), ('post', opt), ('global', opt), ('post', opt2)]


def test_state_dict_hooks():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.2)
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append('save'))
    opt.register_state_dict_post_hook(lambda o, sd: dict(sd, note='hooked'))
    sd = opt.state_dict()
    assert seen == ['save'] and sd['note'] == 'hooked' and sd['sam'] == {
        'clip_grad': None, 'clip_mode': 'norm', 'interval': 1, 'm_sharpness': None, 'use_gc': False, 'step': 0}

    def raise_clip(o, sd):
        sd = copy.deepcopy(sd)
        sd['sam']['clip_grad'] = 3.0
        return sd

    opt.register_load_state_dict_pre_hook(raise_clip)
    opt.register_load_state_dict_post_hook(lambda o: seen.append(('loaded', o.settings.clip_grad)))
    opt.load_state_dict(sd)
    assert seen == ['save', ('loaded', 3.0)]


def _train_closure_steps(model, opt, steps=2, seed=0):
    for i in range(steps):
        x, y = _batch(seed=seed + i)
        opt.step(_closure(model, opt, x, y))


@pytest.mark.parametrize('copier', ['deepcopy', 'pickle'])
def test_copy_and_pickle_continue_identically(copier):
    model = _mlp(bn=True)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2, adaptive=True, clip_grad=1.0,
              model=model)
    fired = []
    opt.register_step_post_hook(lambda o, args, kwargs: fired.append(o))  # not copied, as for torch optimizers
    torch.optim.lr_scheduler.StepLR(opt, step_size=100)  # it wraps opt.step on the instance: not copied either
    _train_closure_steps(model, opt)
    if copier == 'deepcopy':
        model2, opt2 = copy.deepcopy((model, opt))
    else:
        model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    assert isinstance(opt2, SAM) and opt2.model is model2 and opt2.base_optimizer is not opt.base_optimizer
    assert all(p is q for p, q in zip(opt2.param_groups[0]['params'], model2.parameters()))
    assert (opt2.settings.clip_grad, opt2.param_groups[0]['rho'], opt2.param_groups[0]['adaptive']) == (1.0, 0.2, True)
    # a copy watches for no task (building or copying a SAM leaves timm's TrainingTask alone): opt in again
    assert opt2.replay is None and not _watching() and TrainingTask.__call__ is _TASK_CALL
    model3, opt3 = copy.deepcopy((model, opt))  # deepcopy shares the hook function: a copied hook would fire
    _train_closure_steps(model3, opt3, seed=5)
    assert fired == [opt, opt]  # copies have none of the original's hooks
    _train_closure_steps(model, opt, seed=5)
    _train_closure_steps(model2, opt2, seed=5)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)


def test_copy_between_first_and_second_step_is_refused():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    F.cross_entropy(model(_batch()[0]), _batch()[1]).backward()
    opt.first_step()
    with pytest.raises(RuntimeError, match=r'cannot be copied or pickled between first_step\(\) and second_step'):
        copy.deepcopy(opt)


# ---- model unknown -------------------------------------------------------------------------------------

@pytest.mark.filterwarnings('default:SAM does not know the model')
def test_unknown_model_warns_once_naming_model_and_set_model():
    model = _mlp(bn=True)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.warns(UserWarning) as record:
        _train_closure_steps(model, opt, steps=3)
    messages = [str(w.message) for w in record if 'does not know the model' in str(w.message)]
    assert len(messages) == 1
    assert 'buffers (BatchNorm statistics) are updated by both passes' in messages[0]
    assert 'pass model= to SAM or to create_optimizer_v2' in messages[0] and 'set_model(model)' in messages[0]


def _closure_loop(forward, opt, steps=3):
    for i in range(steps):
        opt.step(closure_of(forward, opt, *_batch(seed=i)))


@pytest.mark.filterwarnings('default:SAM does not know the model')
def test_unknown_model_warns_only_where_the_closure_may_move_buffers():
    """No module at all (plain nn.Parameters): no batch norm in the loss's graph, nothing SAM could hold, no
    warning; a model with BatchNorm that SAM was not given still warns once; the model given to
    create_optimizer_v2 is SAM's, so nothing to warn about."""
    torch.manual_seed(0)
    w, b = nn.Parameter(torch.randn(3, 6) * 0.1), nn.Parameter(torch.zeros(3))
    opt = SAM(torch.optim.SGD([w, b], lr=0.1), rho=0.1)
    w0 = w.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        _closure_loop(lambda x: x @ w.T + b, opt)
    assert not torch.equal(w, w0) and opt.state_dict()['sam']['step'] == 3  # three SAM steps ran

    model = _mlp(bn=True)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.1)
    with pytest.warns(UserWarning) as record:
        _closure_loop(model, opt)
    assert len([r for r in record if 'SAM does not know the model' in str(r.message)]) == 1

    model = _mlp(bn=True)
    opt = create_optimizer_v2(model, 'samsgd', lr=0.1, rho=0.1)
    assert opt.model is model
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        _closure_loop(model, opt)


# ---- replay_timm_task ------------------------------------------------------------------------------

def test_building_a_sam_leaves_timm_alone_and_replay_timm_task_opts_in():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.1)
    assert opt.replay is None and not _watching() and TrainingTask.__call__ is _TASK_CALL
    replay_timm_task(opt)  # no task: wait for the first called task that owns the parameters
    assert _watching() and TrainingTask.__call__ is not _TASK_CALL
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    task(*_batch())['loss'].backward()
    assert not _watching() and TrainingTask.__call__ is _TASK_CALL  # found: the class is restored
    assert opt.replay.task is task and opt.model is model  # the task's trainable module became SAM's model
    opt.step()


def test_replay_timm_task_refuses_what_it_cannot_replay_in_one_line():
    model = _mlp()
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r'^replay_timm_task needs a SAM-family optimizer .*got SGD$') as raised:
        replay_timm_task(plain)
    assert '\n' not in str(raised.value)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.1)
    other = ClassificationTask(_mlp(), nn.CrossEntropyLoss(), verbose=False)  # over other parameters
    with pytest.raises(ValueError, match=r"^replay_timm_task: the ClassificationTask's trainable module \(Sequential\) "
                                         r"holds none of the optimizer's parameters") as raised:
        replay_timm_task(opt, other)
    assert '\n' not in str(raised.value)
    with pytest.raises(ValueError, match=r'^replay_timm_task: task must be a timm.task.TrainingTask .*got str$'):
        replay_timm_task(opt, 'task')
    assert opt.replay is None and not _watching() and opt.model is None  # nothing attached, nothing patched
    other(*_batch())['loss'].backward()
    assert not other._forward_pre_hooks  # and no hook left on the refused task


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


@pytest.mark.parametrize('route', ['closure', 'task'])
def test_agc_leaves_the_classifier_head_out(route):
    """As train.py (model_parameters / task.get_clip_parameters(exclude_head=True)): AGC on all but the head."""
    model = _mlp()
    x, y = _batch()
    _, (e,) = _reference_sam(model, x, y, rho=0.3, lr=0.0)
    at_e = _mlp_copy_at(model, _flat(model.parameters()).detach() + e)
    g2 = torch.autograd.grad(F.cross_entropy(at_e(x), y), list(at_e.parameters()))
    clipped = [p.detach().clone() for p in model.parameters()]  # adaptive_clip_grad reads |w| from .data
    for p, g in zip(clipped, g2):
        p.grad = g.clone()
    adaptive_clip_grad(clipped[:-2], clip_factor=0.01)  # the body only, with timm's own AGC
    expected = [g if i >= len(g2) - 2 else p.grad for i, (p, g) in enumerate(zip(clipped, g2))]
    assert not torch.allclose(expected[0], g2[0])  # AGC really clips the body ...
    head_clipped = [p.detach().clone().requires_grad_(False) for p in model.parameters()][-2:]
    for p, g in zip(head_clipped, g2[-2:]):
        p.grad = g.clone()
    adaptive_clip_grad(head_clipped, clip_factor=0.01)
    assert not torch.allclose(head_clipped[0].grad, g2[-2])  # ... and would clip the head too

    w0 = [p.detach().clone() for p in model.parameters()]
    if route == 'closure':
        opt = SAM(torch.optim.SGD(model.parameters(), lr=1.0), rho=0.3, clip_grad=0.01, clip_mode='agc', model=model)
        opt.step(_closure(model, opt, x, y))
    else:  # no model given: the task's get_clip_parameters (timm >= 1.0.24) or its module tells the head
        opt = SAM(torch.optim.SGD(model.parameters(), lr=1.0), rho=0.3, clip_grad=0.01, clip_mode='agc')
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
        replay_timm_task(opt, task)
        task(x, y)['loss'].backward()
        opt.step()
    for p, p0, g in zip(model.parameters(), w0, expected):
        torch.testing.assert_close(p0 - p.detach(), g)


# ---- davda54/sam compatibility -------------------------------------------------------------------------

def test_davda54_constructor_and_loop():
    model = _mlp()
    x, y = _batch()
    ref_model, _ = _reference_sam(model, x, y, rho=0.05, lr=0.1, momentum=0.9, weight_decay=5e-4)
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, adaptive=False, lr=0.1, momentum=0.9, weight_decay=5e-4)
    assert type(opt.base_optimizer) is torch.optim.SGD
    group = opt.param_groups[0]
    assert (group['lr'], group['momentum'], group['weight_decay'], group['rho'], group['adaptive']) == \
        (0.1, 0.9, 5e-4, 0.05, False)
    F.cross_entropy(model(x), y).backward()  # davda54/sam README loop, positional zero_grad included
    opt.first_step(True)
    F.cross_entropy(model(x), y).backward()
    opt.second_step(True)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)
    positional = SAM(_mlp().parameters(), torch.optim.SGD, 0.1, True, lr=0.2)
    assert positional.param_groups[0]['rho'] == 0.1 and positional.param_groups[0]['adaptive'] is True
    with pytest.raises(TypeError, match=r'grad_scaler=True: pass zero_grad= by keyword'):
        positional.second_step(False, True)


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
    replay_timm_task(opt, task)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = task(x, y)['loss']
    loss.backward()
    opt.step()
    assert model[1].states == [(True, torch.bfloat16)] * 2
    assert all(p.dtype == torch.float32 for p in model.parameters())


class _AttributeContractSAM(SAM):
    """``step`` without a ``grad_scaler`` parameter, so ``GradScaler.step`` takes torch's attribute contract
    (``grad_scale`` / ``found_inf`` set on the optimizer) instead of passing itself."""

    def step(self, closure=None):
        return inspect.unwrap(SAM.step)(self, closure)  # torch's step wrapper runs once, for this class


class _GradProbe(nn.Module):
    """Identity that records the summed |gradient| flowing back through it (the loss scale shows there)."""

    def __init__(self):
        super().__init__()
        self.grad_sums = []

    def forward(self, x):
        if x.requires_grad:
            x.register_hook(lambda g: self.grad_sums.append(g.abs().sum().item()))
        return x


_CONTRACTS = {'argument': SAM, 'attributes': _AttributeContractSAM}


def _scaled_run(scale, steps=2, inf_at=None, train_clip=1.0, sam_clip=0.5, contract='argument'):
    """train.py's fp16 path on CPU: NativeScaler(loss, optimizer) -> GradScaler.step(sam)."""
    torch.manual_seed(0)
    model = nn.Sequential(_mlp(), _GradProbe())
    x, y = _batch()
    calls = {'n': 0}

    def criterion(out, target):
        calls['n'] += 1
        loss = F.cross_entropy(out, target)
        return loss * float('inf') if calls['n'] == inf_at else loss

    task = ClassificationTask(model, criterion, verbose=False)
    opt = _CONTRACTS[contract](torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2, clip_grad=sam_clip)
    replay_timm_task(opt, task)
    passed = []  # what GradScaler.step handed to SAM.step: the scaler itself, or the grad_scale/found_inf attributes
    opt.register_step_pre_hook(lambda o, args, kwargs: passed.append(
        ('argument' if 'grad_scaler' in kwargs else 'attributes' if hasattr(o, 'found_inf') else None)))
    scaler = NativeScaler(device='cpu')
    scaler._scaler = torch.amp.GradScaler('cpu', init_scale=scale)
    weights = []
    for _ in range(steps):
        weights.append([p.detach().clone() for p in model.parameters()])
        scaler(task(x, y)['loss'], opt, clip_grad=train_clip, parameters=model.parameters())
        opt.zero_grad()
    weights.append([p.detach().clone() for p in model.parameters()])
    assert passed == [contract] * steps  # the contract under test really was the one used
    return weights, scaler._scaler.get_scale(), model[1].grad_sums, opt


@pytest.mark.filterwarnings(_SCALER_ARGUMENT_WARNING)
@pytest.mark.parametrize('contract', ['argument', 'attributes'])
@pytest.mark.parametrize('train_clip', [None, 100.0])  # train.py unscales before its clip, or step() does
def test_grad_scaler_second_backward_is_scaled_and_unscaled(train_clip, contract):
    torch.manual_seed(0)
    x, y = _batch()
    ref_model, _ = _reference_sam(_mlp(), x, y, rho=0.2, steps=2, lr=0.1, momentum=0.9)
    weights, scale, grad_sums, _ = _scaled_run(2.0 ** 12, train_clip=train_clip, sam_clip=None, contract=contract)
    for p, q in zip(ref_model.parameters(), weights[-1]):
        torch.testing.assert_close(p, q)
    assert scale == 2.0 ** 12
    # |d loss / d logits| summed over the batch is <= 2 for a mean cross-entropy: far above it means scaled
    assert grad_sums[0] > 2.0 ** 8  # the first pass is scaled ...
    if train_clip is None or contract == 'argument':  # ... the second pass with the scaler's scale
        assert grad_sums[1] / grad_sums[0] == pytest.approx(1.0, rel=0.2)
    else:  # the scale was hidden by train.py's unscale_: SAM's own second-pass scale (GradScaler's 2**16 start)
        assert grad_sums[1] / grad_sums[0] == pytest.approx(2.0 ** 16 / 2.0 ** 12, rel=0.2)


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


@pytest.mark.filterwarnings(_SCALER_ARGUMENT_WARNING)
@pytest.mark.parametrize('contract', ['argument', 'attributes'])
@pytest.mark.parametrize('inf_at', [1, 2])  # overflow in the first pass (1) or only in the replay (2)
def test_grad_scaler_skips_overflow_step_restores_weights_and_backs_off(inf_at, contract):
    weights, scale, grad_sums, opt = _scaled_run(2.0 ** 12, steps=2, inf_at=inf_at, contract=contract)
    assert all(torch.equal(p, q) for p, q in zip(weights[0], weights[1]))  # skipped, restored bit-exactly
    assert not all(torch.equal(p, q) for p, q in zip(weights[1], weights[2]))  # next step runs
    if contract == 'attributes' and inf_at == 2:
        # the scaler never sees SAM's own second pass: it keeps its scale, SAM halves its second-pass scale
        # (train.py unscaled before its clip, so SAM's scale starts at GradScaler's 2 ** 16: the next ratio is
        # 2 ** 15 / 2 ** 12)
        assert scale == 2.0 ** 12 and grad_sums[3] / grad_sums[2] == pytest.approx(2.0 ** 15 / 2.0 ** 12, rel=0.2)
        second = opt.second_pass.scaler  # a torch GradScaler of SAM's own
        assert isinstance(second, torch.amp.GradScaler) and second.get_scale() == 2.0 ** 15
    else:
        assert scale == 2.0 ** 11


@pytest.mark.parametrize('train_clip,start', [(None, 2.0 ** 12), (1.0, 2.0 ** 16)])
def test_attribute_contract_second_pass_runs_on_a_grad_scaler_of_sams_own(train_clip, start):
    """Under torch's attribute contract the caller's scaler never sees the second pass, so SAM scales it with a
    ``torch.amp.GradScaler`` of its own (``driver.second_pass``): it starts at the first
    ``grad_scale`` SAM is handed (GradScaler's 2 ** 16 when train.py unscaled before its clip), backs off on a
    second-pass overflow (the update skipped, the caller's scale kept) and grows after ``growth_interval`` clean
    steps, as torch's GradScaler does; the updates that run are SAM's, unscaled exactly."""
    x, y = _batch()
    torch.manual_seed(0)
    ref_model, _ = _reference_sam(_mlp(), x, y, rho=0.2, steps=3, lr=0.1, momentum=0.9)
    torch.manual_seed(0)
    model = nn.Sequential(_mlp(), _GradProbe())
    calls = {'n': 0}

    def criterion(out, target):
        calls['n'] += 1
        loss = F.cross_entropy(out, target)
        return loss * float('inf') if calls['n'] == 2 else loss  # the first step's second pass overflows

    task = ClassificationTask(model, criterion, verbose=False)
    opt = _AttributeContractSAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2)
    replay_timm_task(opt, task)
    scaler = NativeScaler(device='cpu')
    scaler._scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 12)
    w0 = [p.detach().clone() for p in model.parameters()]
    second_scales = []
    for step in range(4):
        scaler(task(x, y)['loss'], opt, clip_grad=train_clip, parameters=model.parameters())
        opt.zero_grad()
        second = opt.second_pass.scaler
        if step == 0:
            assert isinstance(second, torch.amp.GradScaler)
            assert all(torch.equal(p, q) for p, q in zip(w0, model.parameters()))  # skipped, restored at w
            second.set_growth_interval(2)  # grow after 2 clean steps instead of 2000
        second_scales.append(second.get_scale())
    assert second_scales == [start / 2, start / 2, start, start]  # backed off, then grown after 2 clean steps
    assert scaler._scaler.get_scale() == 2.0 ** 12  # the caller's scaler never saw the overflow
    # each step's second-pass gradient over its first-pass one (scaled by the caller's 2 ** 12): SAM's scale
    ratios = [model[1].grad_sums[i + 1] / model[1].grad_sums[i] for i in (2, 4, 6)]
    assert ratios == pytest.approx([start / 2 / 2.0 ** 12, start / 2 / 2.0 ** 12, start / 2.0 ** 12], rel=0.2)
    for p, q in zip(ref_model.parameters(), model[0].parameters()):
        torch.testing.assert_close(p, q)  # the three updates that ran are SAM's


class _Fp16Overflow(nn.Module):
    """Identity whose backward overflows, as an fp16 gradient would, where the (scaled) gradient reaches ``limit``:
    a run whose updates depend on the loss scale, so a scale restarted on resume changes the weights."""

    def __init__(self, limit: float):
        super().__init__()
        self.limit = limit

    def forward(self, x):
        if x.requires_grad:
            x.register_hook(lambda g: g * float('inf') if g.abs().max() >= self.limit else g)
        return x


def _fp16_resumable(batches, state=None, drop=()):
    """train.py's fp16 route (NativeScaler, clipping, so SAM's second pass runs on its own scaler) over ``batches``,
    from ``state`` (model, optimizer and scaler state dicts, with the SAM entry's ``drop`` keys removed)."""
    torch.manual_seed(0)
    model = nn.Sequential(_mlp(), _Fp16Overflow(limit=2.0 ** 12))  # |scaled g| ~5400-7400 at 2 ** 16
    opt = _AttributeContractSAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    scaler = NativeScaler(device='cpu')
    scaler._scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    if state is not None:
        model.load_state_dict(state['model'])
        sd = copy.deepcopy(state['opt'])
        for key in drop:
            del sd['sam'][key]
            for group in sd['param_groups']:
                del group['sam_state'][key]
        opt.load_state_dict(sd)
        scaler.load_state_dict(state['scaler'])
    for x, y in batches:
        scaler(task(x, y)['loss'], opt, clip_grad=1.0, parameters=model.parameters())
        opt.zero_grad()
    return dict(model=copy.deepcopy(model.state_dict()), opt=copy.deepcopy(opt.state_dict()),
                scaler=scaler.state_dict(), second=opt.second_pass.scaler.get_scale())


def test_a_resumed_fp16_run_continues_with_its_second_pass_scale():
    """SAM's own second-pass GradScaler (torch's attribute contract) is saved in the optimizer's state dict: a run
    resumed from it continues exactly, weights and scales. Started afresh instead, the scaler would go back to its
    first scale, overflow again and skip an update."""
    batches = [_batch(8, seed=s) for s in range(5)]
    whole = _fp16_resumable(batches)
    assert whole['second'] == 2.0 ** 15  # the first second pass overflowed at GradScaler's 2 ** 16: backed off
    assert whole['opt']['sam']['second_pass_scaler']['scale'] == 2.0 ** 15
    half = _fp16_resumable(batches[:2])
    resumed = _fp16_resumable(batches[2:], state=half)
    assert resumed['second'] == whole['second'] and resumed['opt']['sam'] == whole['opt']['sam']
    assert all(torch.equal(resumed['model'][k], v) for k, v in whole['model'].items())
    restarted = _fp16_resumable(batches[2:], state=half, drop=('second_pass_scaler',))
    assert not all(torch.equal(restarted['model'][k], v) for k, v in whole['model'].items())


def test_a_bad_second_pass_scaler_entry_is_refused_before_anything_loads():
    opt = SAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), rho=0.2)
    sd = opt.state_dict()
    sd['sam']['second_pass_scaler'] = {'growth_factor': 2.0}
    with pytest.raises(ValueError, match=r'^SAM second_pass_scaler must be a GradScaler state dict \(with its '
                                         r'"scale"\), got second_pass_scaler=\{\'growth_factor\': 2.0\} in the '
                                         r'loaded state dict$'):
        opt.load_state_dict(sd)
    assert opt.second_pass.state_dict() is None


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
        opt = SAM(base_cls(m.parameters(), **kw), rho=0.15, adaptive=True, clip_grad=2.0)
        task = ClassificationTask(m, nn.CrossEntropyLoss(), verbose=False)
        replay_timm_task(opt, task)
        return opt, task

    opt, task = make(model)
    _train(model, opt, task, batches)
    uninterrupted = copy.deepcopy(model.state_dict())

    model = _mlp(bn=True)
    model.load_state_dict(init)
    opt, task = make(model)
    _train(model, opt, task, batches[:3])
    sd = copy.deepcopy(opt.state_dict())
    model_sd = copy.deepcopy(model.state_dict())
    assert sd['sam'] == {'clip_grad': 2.0, 'clip_mode': 'norm', 'interval': 1, 'm_sharpness': None, 'use_gc': False,
                         'step': 3}
    assert all(g['rho'] == 0.15 and g['adaptive'] for g in sd['param_groups'])
    key = 'momentum_buffer' if base_cls is torch.optim.SGD else 'exp_avg_sq'
    assert all(key in s for s in sd['state'].values()) and len(sd['state']) == 6

    resumed = _mlp(bn=True)
    resumed.load_state_dict(model_sd)
    opt2 = SAM(base_cls(resumed.parameters(), **kw), rho=0.9)
    opt2.load_state_dict(sd)
    assert opt2.param_groups is opt2.base_optimizer.param_groups
    assert opt2.param_groups[0]['rho'] == 0.15 and opt2.settings.clip_grad == 2.0
    task2 = ClassificationTask(resumed, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt2, task2)
    _train(resumed, opt2, task2, batches[3:])
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


def _edit(path, value):
    def edit(sd):
        target = sd
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


@pytest.mark.parametrize('edit,match', [
    (_edit(('sam', 'clip_mode'), 'l1'), r"clip_mode must be one of \('norm', 'value', 'agc'\), got clip_mode='l1' "
                                        r"in the loaded state dict"),
    (_edit(('sam', 'clip_grad'), -1.0), r'clip_grad must be > 0 or None, got clip_grad=-1.0 in the loaded state dict'),
    (_edit(('param_groups', 1, 'rho'), -0.5), r'rho must be a finite number >= 0, got rho=-0.5 in param group 1 of the '
                                              r'loaded state dict'),
    (_edit(('param_groups', 0, 'eta'), -0.1), r'eta must be >= 0, got eta=-0.1 in param group 0'),
])
def test_load_state_dict_rejects_bad_sam_settings_before_loading_anything(edit, match):
    model = _mlp()
    groups = [{'params': model[0].parameters()}, {'params': model[2].parameters()}]
    opt = SAM(torch.optim.SGD(groups, lr=0.1, momentum=0.9), rho=0.2, clip_grad=1.0)
    sd = copy.deepcopy(opt.state_dict())
    sd['param_groups'][0]['lr'] = 0.5
    edit(sd)
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(sd)
    assert opt.param_groups[0]['lr'] == 0.1 and opt.param_groups[1]['rho'] == 0.2 and opt.settings.clip_grad == 1.0


def test_load_state_dict_logs_settings_that_differ(caplog):
    model = _mlp()
    saved = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.15, adaptive=True, clip_grad=2.0)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.9)
    with caplog.at_level(logging.INFO, logger='timm_ext.optim.sam'):
        opt.load_state_dict(saved.state_dict())
    records = [r for r in caplog.records if r.name == 'timm_ext.optim.sam']
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    for part in ('rho: 0.9 -> 0.15 in param groups [0]', 'adaptive: False -> True in param groups [0]',
                 'clip_grad: None -> 2.0'):
        assert part in message, message
    assert opt.param_groups[0]['rho'] == 0.15 and opt.settings.clip_grad == 2.0  # the checkpoint's settings win
    caplog.clear()
    with caplog.at_level(logging.INFO, logger='timm_ext.optim.sam'):
        opt.load_state_dict(saved.state_dict())  # same settings: nothing to say
    assert not [r for r in caplog.records if r.name == 'timm_ext.optim.sam']


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
    replay_timm_task(opt, task)
    task(x, y)['loss'].backward()
    opt.step()
    ema.update(model)
    for e, p, r in zip(ema.module.parameters(), model.parameters(), ema_ref):
        torch.testing.assert_close(e, 0.5 * r + 0.5 * p.detach())


def test_torch_lr_scheduler_sees_the_step_without_order_warning():
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
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
    with pytest.raises(ValueError, match=r'SAM needs an optimizer instance to wrap, or params and an optimizer '
                                         r'class .*got type and base_optimizer=None'):
        SAM(torch.optim.SGD)
    with pytest.raises(ValueError, match=r'SAM got an optimizer instance and also base-optimizer arguments \(lr\)'):
        SAM(_sgd(), lr=0.1)


_HOW_TO_USE = (r'pass a closure \(optimizer.step\(closure\)\), call first_step\(\) and second_step\(\) .*'
               r'call timm_ext.optim.replay_timm_task\(optimizer, task\) once in your own loop')


@pytest.mark.parametrize('opted_in', [False, True])
def test_step_without_closure_grads_or_task_is_a_no_op(opted_in):
    """As for any torch optimizer (and timm's registry-wide property test): no gradient anywhere, nothing stepped,
    nothing counted; a task that ran without a backward is still an error (below)."""
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if opted_in:  # replay_timm_task(opt) without a task: still waiting, nothing captured
        replay_timm_task(opt)
    before = [p.detach().clone() for p in model.parameters()]
    assert opt.step() is None
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert opt.sam_step_due and not opt.state  # no update counted, no base-optimizer state made


@pytest.mark.parametrize('opted_in', [False, True])
def test_auto_replay_outside_task_api_is_an_error_not_a_plain_step(opted_in):
    model = _mlp()
    x, y = _batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    if opted_in:
        replay_timm_task(opt)
        said = r"can only re-evaluate the loss inside timm's train.py task API"
    else:  # no replay attached: the error names replay_timm_task
        said = r'can only re-evaluate the loss by replaying a timm training task, and none was attached to this ' \
               r'optimizer: ' + _HOW_TO_USE
    F.cross_entropy(model(x), y).backward()
    w0 = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=said):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), w0))


def test_step_after_task_call_without_backward():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1))
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)  # held: SAM holds tasks weakly
    replay_timm_task(opt, task)
    task(*_batch())
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
        replay_timm_task(opt, task)
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
        replay_timm_task(opt, task)
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
    spawn_gloo(_ddp_worker, nprocs=2)


# ---- the torch floor: the one fallback for an API newer than it ------------------------------------------

@pytest.mark.parametrize('missing', ['none', 'get_total_norm'])
def test_sam_without_torch_apis_newer_than_the_floor(missing, monkeypatch):
    """torch.nn.utils.get_total_norm arrived in torch 2.6; on 2.4 and 2.5 SAM sums the same norms itself."""
    from timm_ext.optim import sam_functional
    if missing == 'get_total_norm':
        monkeypatch.setattr(sam_functional, 'HAS_GET_TOTAL_NORM', False)
    tensors = [torch.randn(3, 4), torch.randn(5)]
    torch.testing.assert_close(sam_functional.total_norm(tensors), _flat(tensors).norm())

    x, y = _batch()
    model = _mlp(bn=True)
    ref_model, _ = _reference_sam(model, x, y, rho=0.2, adaptive=True, eta=0.01, lr=0.1)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.2, adaptive=True, model=model)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    task(x, y)['loss'].backward()
    opt.step()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q)


def test_step_after_first_step_finishes_the_update_like_second_step():
    """A framework that calls optimizer.step() itself (HF Trainer, Accelerate): first_step(), your backward at
    w + e, then its step() is the second step."""
    x, y = _batch()
    torch.manual_seed(0)
    ref_model, _ = _reference_sam(_mlp(), x, y, rho=0.2, steps=2, lr=0.1, momentum=0.9)
    torch.manual_seed(0)
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2)
    for _ in range(2):
        F.cross_entropy(model(x), y).backward()
        opt.first_step()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    for p, q in zip(ref_model.parameters(), model.parameters()):
        torch.testing.assert_close(p, q)
    F.cross_entropy(model(x), y).backward()
    opt.first_step()
    with pytest.raises(RuntimeError, match=r'^SAM.step\(\) after first_step\(\) finishes the update'):
        opt.step(lambda: None)


def test_step_after_first_step_under_the_attribute_contract_is_refused_at_w():
    """A wrapper that hides step's grad_scaler argument (Accelerate's) makes GradScaler hand SAM attributes made for
    the first pass: refused in one line, with the weights back at w, never a step at w + e."""
    x, y = _batch()
    model = _mlp()
    opt = _AttributeContractSAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.2)
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 8)
    w = [p.detach().clone() for p in model.parameters()]
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    opt.first_step(grad_scaler=scaler)
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    with pytest.raises(RuntimeError, match=r"^SAM.step\(\) after first_step\(\) .*the weights are back at w$"):
        scaler.step(opt)
    assert all(torch.equal(a, p) for a, p in zip(w, model.parameters()))


def test_cancel_step_puts_weights_and_buffers_back_and_the_next_step_captures_afresh():
    """A driver whose second pass fails (an OOM in a framework's replay) abandons the step: nothing stepped, the
    weights and BatchNorm statistics as at w, and the next SAM step keeps its own first pass's buffers."""
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.2, model=model)
    x, y = _batch()
    F.cross_entropy(model(x), y).backward()
    after_first = copy.deepcopy(model.state_dict())
    opt.first_step()
    F.cross_entropy(model(x * 3), y).backward()  # a second pass that moves the running statistics
    opt.cancel_step()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in after_first.items())
    assert opt.state_dict()['sam']['step'] == 0
    opt.zero_grad()
    F.cross_entropy(model(x + 1), y).backward()
    stats = model[1].running_mean.clone()  # this step's first pass
    opt.first_step()
    F.cross_entropy(model(x), y).backward()
    opt.second_step()
    assert torch.equal(model[1].running_mean, stats)
