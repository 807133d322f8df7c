"""m-sharpness: a perturbation per chunk of M images, against a direct per-chunk reference, in every route
(closure, train.py's task replay, accumulation, DDP), for SAM and GSAM; random masks, buffers, bad input."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import at as _at
from _sam_reference import batch as _batch
from _sam_reference import drive, replayed_step_draws_nothing, sgd_reference, spawn_gloo
from _sam_reference import flat as _flat
from _sam_reference import grad as _grad
from _sam_reference import mlp as _mlp
from timm.models.vision_transformer import VisionTransformer
from timm.task import ClassificationTask

from timm_ext.optim import GSAM, SAM, replay_timm_task

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')



def _reference(model, batches, m, rho, lr, momentum=0.9, alpha=None):
    """Direct m-sharpness: for each chunk of m images g_i at w, h_i at w + rho g_i/||g_i|| (GSAM: minus alpha
    times g_i's part orthogonal to h_i); the step applies the mean of the h_i."""
    def direction(model, t, xy):
        x, y = xy
        w = _flat(model.parameters()).detach()
        descent = []
        for xs, ys in zip(x.split(m), y.split(m)):
            g = _grad(model, xs, ys)
            h = _grad(_at(model, w + rho * g / g.norm()), xs, ys)
            if alpha is not None:
                h = h - alpha * (g - (g @ h) / (h @ h) * h)
            descent.append(h)
        return torch.stack(descent).mean(0)

    return sgd_reference(model, batches, direction, lr, momentum)


def _chunk_closure(model, opt, x, y, calls=None):
    def closure(chunk):
        opt.zero_grad()
        xs, ys = chunk(x, y)
        if calls is not None:
            calls.append(xs.shape[0])
        loss = F.cross_entropy(model(xs), ys)
        loss.backward()
        return loss
    return closure


_BATCHES = [_batch(8, seed=s) for s in (1, 2)]


@pytest.mark.parametrize('route', ['closure', 'task'])
def test_sam_m_sharpness_matches_per_chunk_reference(route):
    base = _mlp()
    expected = _reference(base, _BATCHES, m=2, rho=0.3, lr=0.5)
    plain = _reference(base, _BATCHES, m=8, rho=0.3, lr=0.5)
    model = copy.deepcopy(base)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho=0.3, m_sharpness=2)
    drive(model, opt, _BATCHES, route, make_closure=_chunk_closure)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)
    assert (expected - plain).abs().max() > 1e-4  # per-chunk perturbation really differs from one for the batch


def test_closure_returns_mean_chunk_loss_at_w_and_runs_each_chunk_twice():
    model = _mlp()
    x, y = _BATCHES[0]
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3, m_sharpness=4)
    expected = torch.stack([F.cross_entropy(model(xs), ys) for xs, ys in zip(x.split(4), y.split(4))]).mean()
    calls = []
    loss = opt.step(_chunk_closure(model, opt, x, y, calls))
    assert calls == [4, 4, 4, 4]
    torch.testing.assert_close(loss, expected.detach())


def test_gradient_accumulation_chunks_every_micro_batch():
    base = _mlp()
    x, y = _BATCHES[0]
    expected = _reference(base, [(x, y)], m=2, rho=0.3, lr=0.5)
    model = copy.deepcopy(base)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho=0.3, m_sharpness=2)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    for xs, ys in zip(x.chunk(2), y.chunk(2)):  # train.py --grad-accum-steps 2
        (task(xs, ys)['loss'] / 2).backward()
    opt.step()
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


def test_m_equal_to_the_batch_reuses_train_py_gradient():
    """One process, M = batch: the first pass is already the chunk's own; SAM replays once, as without M."""
    base = _mlp()
    expected = _reference(base, _BATCHES[:1], m=8, rho=0.3, lr=0.5)
    model = copy.deepcopy(base)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho=0.3, m_sharpness=8)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    sizes = []
    model.register_forward_hook(lambda mod, i, o: sizes.append(i[0].shape[0]))
    task(*_BATCHES[0])['loss'].backward()
    opt.step()
    assert sizes == [8, 8]
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


@pytest.mark.parametrize('route', ['closure', 'task'])
def test_gsam_m_sharpness_decomposes_per_chunk(route):
    base = _mlp()
    expected = _reference(base, _BATCHES, m=4, rho=0.3, lr=0.5, alpha=0.5)
    model = copy.deepcopy(base)
    opt = GSAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho_max=0.3, rho_min=0.3, alpha=0.5,
               m_sharpness=4)
    drive(model, opt, _BATCHES, route, make_closure=_chunk_closure)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


def test_buffers_keep_train_py_first_pass_values():
    model = _mlp(bn=True)
    x, y = _BATCHES[0]
    ref = copy.deepcopy(model)
    ref(x)  # train.py's one forward at w over the whole batch
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3, m_sharpness=2, model=model)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    task(x, y)['loss'].backward()
    opt.step()
    assert model[1].num_batches_tracked.item() == 1
    assert torch.equal(model[1].running_mean, ref[1].running_mean)
    assert torch.equal(model[1].running_var, ref[1].running_var)


def _dropout_vit():
    torch.manual_seed(0)
    return VisionTransformer(img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2., num_classes=3,
                             drop_rate=0.2, proj_drop_rate=0.2, drop_path_rate=0.2)


def test_chunk_masks_task_and_closure_agree_and_the_replay_draws_nothing():
    """Each chunk's two passes share masks and chunks draw fresh ones: the task replay (which starts each call's
    chunks where train.py's pass started) and the closure route give the same update from the same seed."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
    results = []
    for route in ('task', 'closure'):
        model = _dropout_vit()
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3, m_sharpness=2, model=model)
        torch.manual_seed(7)
        if route == 'task':
            assert replayed_step_draws_nothing(model, opt, x, y)
        else:
            opt.step(lambda chunk, model=model: F.cross_entropy(model(chunk(x)), chunk(y)).backward())
        results.append(_flat(model.parameters()).detach())
    torch.testing.assert_close(results[0], results[1])


def test_interval_plain_steps_see_the_whole_batch():
    model = _mlp()
    x, y = _BATCHES[0]
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3, m_sharpness=2, interval=2)
    calls = []
    opt.step(_chunk_closure(model, opt, x, y, calls))
    opt.step(_chunk_closure(model, opt, x, y, calls))
    assert calls == [2] * 8 + [8]


# ---- bad input -----------------------------------------------------------------------------------

def test_m_not_dividing_the_batch_is_refused_before_anything_changes():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), rho=0.3, m_sharpness=3)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    w0 = _flat(model.parameters()).detach().clone()
    task(*_BATCHES[0])['loss'].backward()
    with pytest.raises(ValueError, match=r'm_sharpness=3 must divide the per-worker batch, got a batch of 8 images'):
        opt.step()
    assert torch.equal(_flat(model.parameters()), w0)
    x, y = _BATCHES[0]
    with pytest.raises(ValueError, match=r'm_sharpness=3 must divide the per-worker batch, got a batch of 8'):
        opt.step(_chunk_closure(model, opt, x, y))
    assert torch.equal(_flat(model.parameters()), w0)


@pytest.mark.parametrize('bad', [0, -2, 2.0, True])
def test_bad_m_sharpness_value(bad):
    with pytest.raises(ValueError, match=rf'm_sharpness must be a positive integer .*got m_sharpness={bad!r}'):
        SAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), m_sharpness=bad)


def test_explicit_steps_and_closures_that_ignore_chunk_are_refused():
    model = _mlp()
    x, y = _BATCHES[0]
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), m_sharpness=2)
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match=r'm_sharpness=2 needs SAM to run the passes per chunk: use step\(closure\)'):
        opt.first_step()
    with pytest.raises(RuntimeError, match=r'the closure never called chunk\(...\)'):
        opt.step(lambda chunk: F.cross_entropy(model(x), y).backward())


def test_fp16_grad_scaler_is_refused_with_the_alternative():
    model = _mlp()
    x, y = _BATCHES[0]
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5), m_sharpness=2)
    scaler = torch.amp.GradScaler('cpu')
    with pytest.raises(RuntimeError, match=r'm_sharpness does not support fp16 loss scaling .*bf16 autocast'):
        opt.step(_chunk_closure(model, opt, x, y), grad_scaler=scaler)


# ---- DDP: 2 gloo CPU processes, each worker chunks its own half ---------------------------------------

def _ddp_worker(rank, world_size, port):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world_size)
    try:
        base = _mlp()
        x, y = _batch(16, seed=5)
        expected = _reference(base, [(x, y)], m=4, rho=0.3, lr=0.5)  # 4 chunks of 4, 2 on each worker
        global_perturbation = _reference(base, [(x, y)], m=16, rho=0.3, lr=0.5)
        model = copy.deepcopy(base)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False).prepare_distributed(device_ids=None)
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho=0.3, m_sharpness=4)
        replay_timm_task(opt, task)  # the DDP-wrapped task prepare_distributed returned
        task(x.chunk(2)[rank], y.chunk(2)[rank])['loss'].backward()
        opt.step()
        flat = _flat(model.parameters()).detach()
        torch.testing.assert_close(flat, expected)
        assert (expected - global_perturbation).abs().max() > 1e-4
        # m = the worker's batch: one perturbation per worker from its local gradient, not the all-reduced one
        model = copy.deepcopy(base)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False).prepare_distributed(device_ids=None)
        opt = SAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho=0.3, m_sharpness=8)
        replay_timm_task(opt, task)
        task(x.chunk(2)[rank], y.chunk(2)[rank])['loss'].backward()
        opt.step()
        torch.testing.assert_close(_flat(model.parameters()).detach(), _reference(base, [(x, y)], m=8, rho=0.3, lr=0.5))
        # GSAM: with the all-reduced gradient (= one process on the whole batch) and per chunk of 4
        for m, chunked in ((None, 16), (4, 4)):
            model = copy.deepcopy(base)
            task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False).prepare_distributed(device_ids=None)
            opt = GSAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho_max=0.3, rho_min=0.3, alpha=0.5,
                       m_sharpness=m)
            replay_timm_task(opt, task)
            task(x.chunk(2)[rank], y.chunk(2)[rank])['loss'].backward()
            opt.step()
            expected = _reference(base, [(x, y)], m=chunked, rho=0.3, lr=0.5, alpha=0.5)
            torch.testing.assert_close(_flat(model.parameters()).detach(), expected)
    finally:
        dist.destroy_process_group()


def test_ddp_each_worker_perturbs_with_its_own_chunks_sam_and_gsam():
    spawn_gloo(_ddp_worker, nprocs=2)
