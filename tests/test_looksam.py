"""LookSAM: a SAM step every k steps and the reuse of g_v in between, against an independent computation of
Algorithm 1 (Liu et al., CVPR 2022); the replay skipped on reuse steps, fp16, resume, factory names, bad
input, and pytorch_optimizer's LookSAM as a second reference."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import at as _at
from _sam_reference import batches as _batches
from _sam_reference import closure as _closure
from _sam_reference import drive, sgd_reference, train_py_fp16
from _sam_reference import flat as _flat
from _sam_reference import grad as _grad
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2, get_optimizer_class, list_optimizers
from timm.task import ClassificationTask
from timm.utils import NativeScaler

from timm_ext.optim import SAM_BASES, LookSAM, replay_timm_task
from timm_ext.optim.looksam import GV_KEY

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')




def _reference(model, batches, k, rho, alpha, lr, momentum=0.9):
    """Algorithm 1. t % k == 0: g_s at w + rho g/||g||, g_v = g_s - (g.g_s/||g||^2) g;
    otherwise g_s = g + alpha ||g||/||g_v|| g_v."""
    gv = None

    def direction(model, t, xy):
        nonlocal gv
        g = _grad(model, *xy)
        if t % k == 0:
            at_e = _at(model, _flat(model.parameters()).detach() + rho * g / g.norm())
            d = _grad(at_e, *xy)
            gv = d - (g @ d) / (g @ g) * g
            return d
        return g + alpha * g.norm() / gv.norm() * gv

    return sgd_reference(model, batches, direction, lr, momentum)


@pytest.mark.parametrize('route', ['closure', 'task'])
def test_matches_algorithm_1_over_two_sam_periods(route):
    base = _mlp()
    batches = _batches(5)
    expected = _reference(base, batches, k=3, rho=0.3, alpha=0.7, lr=0.2)
    no_reuse = _reference(base, batches, k=3, rho=0.3, alpha=0.0, lr=0.2)  # interval SAM
    model = copy.deepcopy(base)
    opt = LookSAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho=0.3, alpha=0.7, interval=3)
    forwards = []
    model.register_forward_hook(lambda m, i, o: forwards.append(1))
    drive(model, opt, batches, route)
    assert len(forwards) == 2 + 1 + 1 + 2 + 1  # the replay (second pass) only on the SAM steps 0 and 3
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)
    assert (expected - no_reuse).abs().max() > 1e-4  # the reuse of g_v really moves the reuse steps


@pytest.mark.filterwarnings('ignore:GradScaler is going to stop passing itself:FutureWarning')
def test_fp16_train_py_route_matches_reference_and_skips_an_overflowed_reuse_step():
    base = _mlp()
    batches = _batches(4)
    expected = _reference(base, batches, k=2, rho=0.3, alpha=0.5, lr=0.2)
    model = copy.deepcopy(base)
    opt = LookSAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho=0.3, alpha=0.5, interval=2)
    task, scaler = train_py_fp16(model, opt, batches)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)
    assert scaler._scaler.get_scale() == 2.0 ** 10
    w = [p.detach().clone() for p in model.parameters()]
    scaler(task(*batches[0])['loss'] * float('inf'), opt)  # step 4 is a SAM step; step 5 a reuse step
    scaler(task(*batches[0])['loss'] * float('inf'), opt)
    assert all(torch.equal(a, p) for a, p in zip(w, model.parameters()))
    assert scaler._scaler.get_scale() == 2.0 ** 8


@pytest.mark.filterwarnings('ignore:GradScaler is going to stop passing itself:FutureWarning')
def test_fp16_overflow_in_a_sam_steps_second_pass_keeps_the_previous_g_v():
    model = _mlp()
    calls = {'n': 0}

    def criterion(out, target):  # task calls: step 0 -> 1, 2 (replay); step 1 -> 3; step 2 -> 4, 5 (replay)
        calls['n'] += 1
        loss = F.cross_entropy(out, target)
        return loss * float('inf') if calls['n'] == 5 else loss

    opt = LookSAM(torch.optim.SGD(model.parameters(), lr=0.2), rho=0.3, alpha=0.5, interval=2)
    task = ClassificationTask(model, criterion, verbose=False)
    replay_timm_task(opt, task)
    scaler = NativeScaler(device='cpu')
    scaler._scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    batches = _batches(4)
    gv = None
    for step, (x, y) in enumerate(batches):
        if step == 2:
            gv = [v.clone() for v in _gv(opt)]
            w = [p.detach().clone() for p in model.parameters()]
        scaler(task(x, y)['loss'], opt)
        opt.zero_grad()
        if step == 2:
            assert all(torch.equal(a, p) for a, p in zip(w, model.parameters()))  # skipped
            assert all(torch.equal(a, b) for a, b in zip(gv, _gv(opt)))  # step 0's kept
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the reuse step 3 used a finite g_v


def _gv(opt):
    """g_v as a checkpoint holds it: per parameter, in the optimizer's state (as a momentum buffer is)."""
    return [s['looksam_gv'] for s in opt.state_dict()['state'].values() if 'looksam_gv' in s]


def test_state_dict_keeps_g_v_so_a_resumed_reuse_step_is_identical():
    batches = _batches(5)

    def make(model):
        return LookSAM(torch.optim.AdamW(model.parameters(), lr=0.02), rho=0.2, alpha=0.6, interval=3)

    model = _mlp(bn=True)
    drive(model, make(model), batches, 'task')
    uninterrupted = copy.deepcopy(model.state_dict())
    model = _mlp(bn=True)
    opt = make(model)
    drive(model, opt, batches[:4], 'task')  # steps 0..3: the next one (4) reuses g_v from step 3
    sd = copy.deepcopy(opt.state_dict())
    assert sd['sam']['step'] == 4 and sd['sam']['alpha'] == 0.6
    assert [sorted(s) for s in sd['state'].values()] == [['exp_avg', 'exp_avg_sq', 'looksam_gv', 'step']] * 6
    resumed = _mlp(bn=True)
    resumed.load_state_dict(model.state_dict())
    opt2 = LookSAM(torch.optim.AdamW(resumed.parameters(), lr=0.02), rho=0.2)
    opt2.load_state_dict(sd)
    assert opt2.settings.interval == 3 and not opt2.sam_step_due
    drive(resumed, opt2, batches[4:], 'task')
    for k, v in uninterrupted.items():
        assert torch.equal(v, resumed.state_dict()[k]), k


@pytest.mark.timm_free
def test_copy_keeps_g_v():
    model = _mlp()
    opt = LookSAM(torch.optim.SGD(model.parameters(), lr=0.1), interval=2)
    x, y = _batches(1)[0]
    opt.step(_closure(model, opt, x, y))
    model2, opt2 = copy.deepcopy((model, opt))
    kept, copied = _gv(opt), _gv(opt2)
    assert len(copied) == 4 and all(torch.equal(a, b) for a, b in zip(kept, copied))
    opt.step(_closure(model, opt, x, y))
    opt2.step(_closure(model2, opt2, x, y))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


def test_looksam_names_and_defaults():
    names = list_optimizers('looksam*')
    assert set(names) == {'looksam'} | {'looksam' + b for b in SAM_BASES}
    model = _mlp()
    for name in names:
        extra = dict(base='sgd') if name == 'looksam' else {}
        opt = create_optimizer_v2(model, name, lr=0.01, **extra)
        assert isinstance(opt, LookSAM)
        assert (opt.settings.alpha, opt.settings.interval, opt.param_groups[0]['rho']) == (0.7, 5, 0.05)
        assert type(opt.base_optimizer) is get_optimizer_class(name[len('looksam'):] or 'sgd', bind_defaults=False)
    opt = create_optimizer_v2(model, 'looksamadamw', lr=0.01, interval=10, alpha=0.5, rho=0.1)
    assert (opt.settings.interval, opt.settings.alpha, opt.param_groups[0]['rho']) == (10, 0.5, 0.1)


@pytest.mark.parametrize('kwargs,match', [
    (dict(alpha=1.0), r'LookSAM alpha must be in \[0, 1\), got alpha=1.0'),
    (dict(alpha=-0.5), r'LookSAM alpha must be in \[0, 1\), got alpha=-0.5'),
    (dict(interval=0), r'interval must be an integer >= 1 .*got interval=0'),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LookSAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), **kwargs)


def test_matches_pytorch_optimizer_looksam_on_a_single_tensor():
    """pytorch_optimizer normalises per tensor; with one parameter tensor that is Algorithm 1's global form."""
    po = pytest.importorskip('pytorch_optimizer', reason='pytorch_optimizer (pip install pytorch_optimizer) is a '
                                                         'test-only reference; not installed')
    torch.manual_seed(0)
    base = nn.Linear(6, 3, bias=False)
    batches = _batches(4)
    results = []
    for impl in ('ours', 'pytorch_optimizer'):
        model = copy.deepcopy(base)
        if impl == 'ours':
            opt = LookSAM(model.parameters(), torch.optim.SGD, rho=0.3, alpha=0.5, interval=2, lr=0.2, momentum=0.9)
        else:
            opt = po.LookSAM(model.parameters(), torch.optim.SGD, rho=0.3, k=2, alpha=0.5, lr=0.2, momentum=0.9)
        for x, y in batches:
            closure = _closure(model, opt, x, y)
            if impl == 'pytorch_optimizer':
                closure()  # its step() expects the gradient at w already computed
            opt.step(closure)
            opt.zero_grad()
        results.append(_flat(model.parameters()).detach())
    torch.testing.assert_close(results[0], results[1])


def test_a_direction_below_rounding_error_is_not_reused():
    """||w||^2: the gradient at w + e is parallel to g, so g_v = g_s - proj_g(g_s) is float32 rounding noise (norm
    ~1e-7 of g_s); LookSAM keeps zero instead of scaling that noise up to alpha ||g|| on the reuse steps (timm's
    test_optim.py caught it as a direction diverging from float64's)."""
    w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 64))
    opt = LookSAM(torch.optim.SGD([w], lr=0.1), rho=0.05, alpha=0.7, interval=2)

    def closure():
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)  # the SAM step: g_v kept
    assert torch.count_nonzero(opt.state[w][GV_KEY]) == 0
    before = w.detach().clone()
    opt.step(closure)  # a reuse step: plain SGD on g = 2 w
    torch.testing.assert_close(w.detach(), before - 0.1 * 2 * before, rtol=0, atol=0)
