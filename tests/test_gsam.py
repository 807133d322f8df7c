"""GSAM: one step against an independent computation of the paper's update, rho following the lr, every SAM
route and feature (closure, explicit, task replay, accumulation, fp16 GradScaler, resume), the factory names,
bad input, and pytorch_optimizer's GSAM as a second reference."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import at as _at
from _sam_reference import batch as _batch
from _sam_reference import closure as _closure
from _sam_reference import drive, sgd_reference, train_py_fp16
from _sam_reference import flat as _flat
from _sam_reference import grad as _grad
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2, get_optimizer_class, list_optimizers
from timm.scheduler import CosineLRScheduler
from timm.task import ClassificationTask

from timm_ext.optim import GSAM, SAM, SAM_BASES, replay_timm_task

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')




def _gsam_direction(model, x, y, rho, alpha):
    """The paper's update direction at w, from flattened vectors: h - alpha (g - (g.h / h.h) h)."""
    w = _flat(model.parameters()).detach()
    g = _grad(model, x, y)
    at_e = _at(model, w + rho * g / g.norm())
    h = _grad(at_e, x, y)
    return h - alpha * (g - (g @ h) / (h @ h) * h), g, h


def _reference(model, batches, rho, alpha, lr, momentum=0.9):
    return sgd_reference(model, batches, lambda m, t, xy: _gsam_direction(m, *xy, rho, alpha)[0], lr, momentum)


@pytest.mark.parametrize('route', ['closure', 'explicit', 'task'])
def test_one_step_matches_the_paper_update_with_rho_from_the_lr(route):
    """lr 0.3 between lr_min 0.1 and lr_max 0.5: rho_t = 0.2 + (0.6 - 0.2) * 0.5 = 0.4."""
    base = _mlp()
    batch = [_batch()]
    d, g, h = _gsam_direction(base, *batch[0], rho=0.4, alpha=0.5)
    assert (g @ h) / (g.norm() * h.norm()) < 0.999  # g and h not parallel: the decomposition matters
    expected = _flat(base.parameters()).detach() - 0.3 * d
    model = copy.deepcopy(base)
    opt = GSAM(torch.optim.SGD(model.parameters(), lr=0.3), rho_max=0.6, rho_min=0.2, alpha=0.5, lr_max=0.5, lr_min=0.1)
    assert opt.current_rho() == pytest.approx(0.4)
    drive(model, opt, batch, route)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)
    sam_like = _flat(base.parameters()).detach() - 0.3 * h
    assert (expected - sam_like).abs().max() > 1e-4  # alpha really changes the step


def test_several_steps_with_momentum_match_reference():
    base = _mlp()
    batches = [_batch(seed=s) for s in range(3)]
    expected = _reference(base, batches, rho=0.3, alpha=0.4, lr=0.2)
    model = copy.deepcopy(base)
    opt = GSAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho_max=0.3, rho_min=0.1, alpha=0.4)
    assert opt.settings.lr_max == 0.2 and opt.current_rho() == pytest.approx(0.3)  # lr_max = the initial lr
    drive(model, opt, batches, 'task')
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


def test_rho_follows_a_timm_schedule_and_layer_decay():
    model = _mlp()
    groups = [{'params': model[0].parameters(), 'lr_scale': 0.5}, {'params': model[2].parameters(), 'lr_scale': 1.0}]
    opt = GSAM(torch.optim.SGD(groups, lr=0.4), rho_max=0.6, rho_min=0.1, alpha=0.3, lr_min=0.01)  # as layer decay
    assert opt.settings.lr_max == 0.4
    sched = CosineLRScheduler(opt, t_initial=10, lr_min=0.01, warmup_t=2, warmup_lr_init=0.04)
    x, y = _batch()
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    for epoch in range(10):
        sched.step(epoch)
        lr = opt.param_groups[1]['lr']
        assert opt.param_groups[0]['lr'] == pytest.approx(0.5 * lr)
        task(x, y)['loss'].backward()
        opt.step()
        opt.zero_grad()
        rho = 0.1 + 0.5 * (lr - 0.01) / (0.4 - 0.01)
        assert all(g['rho'] == pytest.approx(rho) for g in opt.param_groups), epoch
    assert opt.param_groups[0]['rho'] < 0.2  # decayed with the lr


def test_rho_max_equal_rho_min_and_alpha_zero_is_sam():
    batches = [_batch(seed=s) for s in range(3)]
    results = []
    for cls, kw in ((SAM, dict(rho=0.2)), (GSAM, dict(rho_max=0.2, rho_min=0.2, alpha=0.0))):
        model = _mlp(bn=True)
        opt = cls(torch.optim.AdamW(model.parameters(), lr=0.01), model=model, **kw)
        drive(model, opt, batches, 'task')
        results.append(model.state_dict())
    for k in results[0]:
        assert torch.equal(results[0][k], results[1][k]), k


def test_gradient_accumulation_is_gsam_over_the_window():
    base = _mlp()
    x, y = _batch(8)
    expected = _reference(base, [(x, y)], rho=0.3, alpha=0.5, lr=0.5)
    model = copy.deepcopy(base)
    opt = GSAM(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), rho_max=0.3, rho_min=0.0, alpha=0.5)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt, task)
    for xs, ys in zip(x.chunk(2), y.chunk(2)):
        (task(xs, ys)['loss'] / 2).backward()
    opt.step()
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


@pytest.mark.filterwarnings('ignore:GradScaler is going to stop passing itself:FutureWarning')
@pytest.mark.parametrize('route', ['closure', 'train_py'])
def test_fp16_grad_scaler_routes_match_reference(route):
    base = _mlp()
    batches = [_batch(seed=s) for s in range(2)]
    expected = _reference(base, batches, rho=0.3, alpha=0.5, lr=0.2)
    model = copy.deepcopy(base)
    opt = GSAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho_max=0.3, rho_min=0.3, alpha=0.5)
    if route == 'closure':
        scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
        for x, y in batches:
            def closure(x=x, y=y):
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
                return loss
            opt.step(closure, grad_scaler=scaler)
            scaler.update()
        assert scaler.get_scale() == 2.0 ** 10
    else:  # train.py: NativeScaler(loss, optimizer) -> GradScaler.step(gsam)
        train_py_fp16(model, opt, batches)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


def test_state_dict_resume_is_bit_identical_and_keeps_gsam_settings():
    batches = [_batch(seed=s) for s in range(6)]

    def make(model):
        opt = GSAM(torch.optim.AdamW(model.parameters(), lr=0.02), rho_max=0.3, rho_min=0.05, alpha=0.4, lr_min=0.001,
                   interval=2)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
        replay_timm_task(opt, task)
        return opt, task

    def run(model, opt, task, part, start=0):
        for i, (x, y) in enumerate(part, start):
            opt.param_groups[0]['lr'] = 0.02 / (1 + i)  # a schedule: rho follows it
            task(x, y)['loss'].backward()
            opt.step()
            opt.zero_grad()

    model = _mlp(bn=True)
    opt, task = make(model)
    run(model, opt, task, batches)
    uninterrupted = copy.deepcopy(model.state_dict())

    model = _mlp(bn=True)
    opt, task = make(model)
    run(model, opt, task, batches[:3])
    sd = copy.deepcopy(opt.state_dict())
    assert {k: sd['sam'][k] for k in ('rho_max', 'rho_min', 'alpha', 'lr_max', 'lr_min', 'interval', 'step')} == \
        dict(rho_max=0.3, rho_min=0.05, alpha=0.4, lr_max=0.02, lr_min=0.001, interval=2, step=3)
    resumed = _mlp(bn=True)
    resumed.load_state_dict(model.state_dict())
    opt2 = GSAM(torch.optim.AdamW(resumed.parameters(), lr=0.02), rho_max=0.9, rho_min=0.0, alpha=0.1)
    opt2.load_state_dict(sd)
    s = opt2.settings
    assert (s.rho_max, s.rho_min, s.alpha, s.lr_min, s.interval, opt2.state_dict()['sam']['step']) == \
        (0.3, 0.05, 0.4, 0.001, 2, 3)
    task2 = ClassificationTask(resumed, nn.CrossEntropyLoss(), verbose=False)
    replay_timm_task(opt2, task2)
    run(resumed, opt2, task2, batches[3:], 3)
    for k, v in uninterrupted.items():
        assert torch.equal(v, resumed.state_dict()[k]), k


# ---- factory ---------------------------------------------------------------------------------------

def test_gsam_names_build_gsam_over_their_base():
    names = list_optimizers('gsam*')
    assert set(names) == {'gsam'} | {'gsam' + b for b in SAM_BASES}
    model = _mlp()
    for name in names:
        extra = dict(base='adamw') if name == 'gsam' else {}
        opt = create_optimizer_v2(model, name, lr=0.01, weight_decay=0.05, **extra)
        assert isinstance(opt, GSAM), name
        base = name[len('gsam'):] or 'adamw'
        assert type(opt.base_optimizer) is get_optimizer_class(base, bind_defaults=False)
        assert (opt.settings.rho_max, opt.settings.rho_min, opt.settings.alpha, opt.settings.lr_max,
                opt.settings.lr_min) == (0.04, 0.02, 0.01, 0.01, 0.0)
        assert opt.model is model


# ---- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize('kwargs,match', [
    (dict(rho_max=0.1, rho_min=0.2), r'rho_min must be <= rho_max, got rho_min=0.2 > rho_max=0.1'),
    (dict(alpha=1.0), r'GSAM alpha must be in \[0, 1\), got alpha=1.0'),
    (dict(alpha=-0.1), r'GSAM alpha must be in \[0, 1\), got alpha=-0.1'),
    (dict(rho_max=-1.0), r'^GSAM rho_max must be a finite number >= 0, got rho_max=-1.0$'),  # the setting named
    (dict(rho_min=-1.0), r'^GSAM rho_min must be a finite number >= 0, got rho_min=-1.0$'),
    (dict(lr_min=-0.1), r'lr_min must be a number >= 0, got lr_min=-0.1'),
    (dict(lr_max=0.01, lr_min=0.1), r'lr_max must be >= lr_min=0.1 or None'),
    (dict(interval=0), r'interval must be an integer >= 1 .*got interval=0'),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GSAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), **kwargs)


def test_factory_rejects_bad_alpha_and_loaded_bad_settings():
    model = _mlp()
    with pytest.raises(ValueError, match=r'GSAM alpha must be in \[0, 1\), got alpha=1.5'):
        create_optimizer_v2(model, 'gsamadamw', lr=0.1, alpha=1.5)
    opt = GSAM(torch.optim.SGD(model.parameters(), lr=0.1))
    sd = copy.deepcopy(opt.state_dict())
    sd['sam']['rho_min'] = 1.0
    with pytest.raises(ValueError, match=r'rho_min must be <= rho_max, got rho_min=1.0 > rho_max=0.04 in the loaded'):
        opt.load_state_dict(sd)
    assert opt.settings.rho_min == 0.02


# ---- pytorch_optimizer's GSAM: a second, independent implementation -----------------------------------------

def test_one_step_matches_pytorch_optimizer_gsam():
    po = pytest.importorskip('pytorch_optimizer', reason='pytorch_optimizer (pip install pytorch_optimizer) is a '
                                                         'test-only reference; not installed')
    from pytorch_optimizer.lr_scheduler.proportion import ProportionScheduler
    base = _mlp()
    x, y = _batch()
    results = []
    for impl in ('ours', 'pytorch_optimizer'):
        model = copy.deepcopy(base)
        sgd = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
        if impl == 'ours':
            opt = GSAM(sgd, rho_max=0.6, rho_min=0.2, alpha=0.5, lr_max=0.5, lr_min=0.1)
            opt.step(_closure(model, opt, x, y))
        else:
            lr_sched = torch.optim.lr_scheduler.LambdaLR(sgd, lambda step: 1.0)
            rho = ProportionScheduler(lr_sched, max_lr=0.5, min_lr=0.1, max_value=0.6, min_value=0.2)
            opt = po.GSAM(model.parameters(), sgd, model, rho, alpha=0.5)
            assert math.isclose(opt.rho_t, 0.4)
            opt.set_closure(nn.CrossEntropyLoss(), x, y)
            opt.step()
        results.append(_flat(model.parameters()).detach())
    torch.testing.assert_close(results[0], results[1])
