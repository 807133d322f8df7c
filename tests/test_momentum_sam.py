"""Momentum-SAM against its paper's update written out in the test (torch only), its limits, routes and refusals."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import REFERENCE_BASES, at, closure, flat, grad, images, tiny_vit, train_py_fp16
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask

from timm_ext.optim import replay_timm_task
from timm_ext.optim.momentum_sam import MomentumSAM


def _reference(model, base_class, base_kwargs, data, rho):
    """The paper's update: h = grad L(w - rho v / ||v||), v the base's momentum (0 before the first step), then the
    base optimizer's step from w with h."""
    model = copy.deepcopy(model)
    base = base_class(model.parameters(), **base_kwargs)
    for x, y in data:
        params = list(model.parameters())
        key = 'momentum_buffer' if 'momentum_buffer' in base.state.get(params[0], {}) else 'exp_avg'
        v = flat([base.state[p][key] if p in base.state else torch.zeros_like(p) for p in params])
        w = flat(params).detach()
        point = w - rho * v / v.norm() if v.norm() > 0 else w
        h = grad(at(model, point), x, y)
        for p, g in zip(params, torch.split(h, [p.numel() for p in params])):
            p.grad = g.view_as(p).clone()
        base.step()
    return flat(model.parameters()).detach()


def _train(model, opt, data, route='loop'):
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    if route == 'task':
        replay_timm_task(opt, task)
    for x, y in data:
        if route == 'closure':
            opt.step(closure(model, opt, x, y))
        else:
            (task(x, y)['loss'] if route == 'task' else F.cross_entropy(model(x), y)).backward()
            opt.step()
        opt.zero_grad()
    return flat(model.parameters()).detach()


@pytest.mark.parametrize('base_name', list(REFERENCE_BASES))
@pytest.mark.parametrize('route', ['loop', 'closure', 'task'])
def test_equals_the_papers_update_on_a_vit(route, base_name):
    base_class, kwargs, dtype = REFERENCE_BASES[base_name]
    model = tiny_vit().to(dtype)
    data = [(x.to(dtype), y) for x, y in images(4)]
    expected = _reference(model, base_class, kwargs, data, rho=0.5)
    net = copy.deepcopy(model)
    opt = MomentumSAM(base_class(net.parameters(), **kwargs), rho=0.5, model=net)
    got = _train(net, opt, data, route)
    assert (got - expected).norm() / expected.norm() <= 1e-5
    assert (expected - _reference(model, base_class, kwargs, data, rho=0.0)).norm() > 1e-3  # rho matters here


def test_rho_zero_is_the_base_optimizer_exactly():
    model, data = tiny_vit(), images(3)
    base = copy.deepcopy(model)
    plain = torch.optim.SGD(base.parameters(), lr=0.1, momentum=0.9)
    net = copy.deepcopy(model)
    opt = MomentumSAM(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), rho=0.0, model=net)
    assert torch.equal(_train(net, opt, data), _train(base, plain, data))


def test_only_training_forwards_see_the_displaced_weights():
    model, data = tiny_vit(), images(2)
    opt = create_optimizer_v2(model, 'msamsgd', lr=0.1)  # the factory hands it the model
    _train(model, opt, data[:1])
    w = flat(model.parameters()).detach().clone()
    with torch.no_grad():
        model.eval()
        model(data[1][0])  # evaluation: the weights stay at w
    assert torch.equal(flat(model.parameters()), w)
    model.train()
    F.cross_entropy(model(data[1][0]), data[1][1]).backward()  # a training forward: at w - rho v / ||v||
    v = flat(opt.base_optimizer.state[p]['momentum_buffer'] for p in model.parameters())
    torch.testing.assert_close(flat(model.parameters()).detach(), w - 3.0 * v / v.norm())
    opt.step()  # back to w (the same displacement subtracted) before the base step
    assert not torch.equal(flat(model.parameters()), w) and opt._displaced is None


def _without_a_model(data):
    """A Momentum-SAM built without the model (it warns), the model it trains, and the reference's end point."""
    model = tiny_vit()
    expected = _reference(model, torch.optim.SGD, dict(lr=0.1, momentum=0.9), data, rho=0.5)
    with pytest.warns(UserWarning, match='not given the model'):
        opt = MomentumSAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.5)
    return model, opt, expected


def test_without_a_model_it_warns_and_keeps_the_weights_displaced_as_the_papers_code():
    data = images(3)
    net, opt, expected = _without_a_model(data)
    displaced = _train(net, opt, data)
    assert not torch.equal(displaced, expected)
    twin_model, twin = copy.deepcopy((net, opt))  # a copy (as a pickle, a loaded state) starts displaced too
    opt.restore()
    assert (flat(net.parameters()) - expected).norm() / expected.norm() <= 1e-5
    twin.restore()
    assert torch.equal(flat(twin_model.parameters()), flat(net.parameters()))
    state = opt.state_dict()
    assert state['sam']['displaced'] is False  # saved at w: restore() came first


def test_without_a_model_a_closure_step_displaces_around_its_closure_only():
    data = images(3)
    net, opt, expected = _without_a_model(data)
    got = _train(net, opt, data, 'closure')  # the weights read after the last step: w
    assert (got - expected).norm() / expected.norm() <= 1e-5 and opt._displaced is None


def test_a_state_saved_displaced_is_loaded_displaced():
    model, data = tiny_vit(), images(3)
    with pytest.warns(UserWarning, match='not given the model'):
        opt = MomentumSAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.5)
    _train(model, opt, data[:2])
    saved = copy.deepcopy((model.state_dict(), opt.state_dict()))
    assert saved[1]['sam']['displaced'] is True
    _train(model, opt, data[2:])
    opt.restore()
    other = tiny_vit()
    other.load_state_dict(saved[0])
    with pytest.warns(UserWarning, match='not given the model'):
        opt2 = MomentumSAM(torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9), rho=0.5)
    opt2.load_state_dict(saved[1])
    _train(other, opt2, data[2:])
    opt2.restore()
    assert torch.equal(flat(other.parameters()), flat(model.parameters()))


def test_resume_continues_exactly():
    model, data = tiny_vit(), images(4)
    net = copy.deepcopy(model)
    whole = _train(net, create_optimizer_v2(net, 'msamadamw', lr=1e-2), data)
    first = copy.deepcopy(model)
    opt = create_optimizer_v2(first, 'msamadamw', lr=1e-2)
    _train(first, opt, data[:2])
    saved = copy.deepcopy((first.state_dict(), opt.state_dict()))
    assert saved[1]['param_groups'][0]['rho'] == 3.0 and saved[1]['sam']['step'] == 2
    second = copy.deepcopy(model)
    second.load_state_dict(saved[0])
    opt2 = create_optimizer_v2(second, 'msamadamw', lr=1e-2)
    opt2.load_state_dict(saved[1])
    assert torch.equal(_train(second, opt2, data[2:]), whole)


def test_fp16_loss_scaling_through_timms_native_scaler_equals_fp32():
    model, data = tiny_vit(), images(3)
    net = copy.deepcopy(model)
    expected = _train(net, MomentumSAM(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), rho=0.5, model=net),
                      data)
    scaled = copy.deepcopy(model)
    opt = MomentumSAM(torch.optim.SGD(scaled.parameters(), lr=0.1, momentum=0.9), rho=0.5, model=scaled)
    train_py_fp16(scaled, opt, data)
    torch.testing.assert_close(flat(scaled.parameters()).detach(), expected)


def test_an_overflowed_step_is_skipped_and_the_gradient_stays_at_the_displaced_point():
    model, (x, y) = tiny_vit(), images(1)[0]
    opt = create_optimizer_v2(model, 'msamsgd', lr=0.1)
    _train(model, opt, [(x, y)])
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0)
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    displaced = flat(model.parameters()).detach().clone()
    next(model.parameters()).grad.view(-1)[0] = float('inf')
    scaler.step(opt)  # inf: the step is skipped, the weights stay where the gradient was taken
    assert torch.equal(flat(model.parameters()), displaced) and opt._updates == 1


@pytest.mark.parametrize('build, match', [
    (lambda m: MomentumSAM(torch.optim.SGD(m.parameters(), lr=0.1), model=m), r'with momentum, got SGD \(momentum=0\)'),
    (lambda m: MomentumSAM(torch.optim.Adagrad(m.parameters()), model=m), 'with momentum, got Adagrad: bases it can'),
    (lambda m: create_optimizer_v2(m, 'msamadamw', rho=-1.0), 'rho must be a finite number >= 0, got rho=-1.0'),
    (lambda m: create_optimizer_v2(m, 'msam', base='adagrad'), 'with momentum, got Adagrad'),
])
def test_bad_input_is_one_line(build, match):
    with pytest.raises(ValueError, match=match):
        build(nn.Linear(2, 2))


def test_second_pass_settings_and_halves_are_refused():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'm_sharpness'"):
        create_optimizer_v2(model, 'msamadamw', m_sharpness=4)
    opt = create_optimizer_v2(model, 'msamadamw')
    with pytest.raises(RuntimeError, match='one pass: call step'):
        opt.first_step()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        create_optimizer_v2(model, 'msamsgd')  # the factory passes the model: no warning


@pytest.mark.slow
def test_in_train_py_it_equals_the_same_msam_driven_by_hand(tmp_path):
    from _train_py_routes import both_routes

    loop, train_py = both_routes(tmp_path, 'msamadamw', dict(rho=1.0))
    assert loop == train_py and len(loop.splitlines()) == 3  # a header and two epochs, every number the same


def test_a_copy_of_the_model_carries_the_hook_but_displaces_nothing():
    model, data = tiny_vit(), images(2)
    opt = create_optimizer_v2(model, 'msamsgd', lr=0.1)
    _train(model, opt, data[:1])
    twin = copy.deepcopy(model)  # as timm's ModelEma copies it, hooks included
    w = flat(model.parameters()).detach().clone()
    F.cross_entropy(twin(data[1][0]), data[1][1]).backward()
    assert torch.equal(flat(model.parameters()), w) and torch.equal(flat(twin.parameters()), w) and opt._due


@pytest.mark.parametrize('name, base, kwargs', [('msamadamw', 'adamw', {}), ('msamsgd', 'sgd', dict(momentum=0.9))])
def test_a_compiled_step_compiles_its_base_optimizers_graphs_only(name, base, kwargs):
    """torch.compile(opt.step) on the model-less route (step() leaves the weights displaced), with a parameter that
    has no gradient for three steps and one in float64, as timm's foreach-parity test steps it: the displacement
    runs eagerly, so the step compiles the graphs of its base optimizer's step and no more (traced, each momentum
    state and value of ||v|| was a graph of its own: 11 against 2), and ends where the eager step does."""
    from torch._dynamo.utils import counters

    def run(opt_name, compiled):
        params = [nn.Parameter(torch.randn(16, 8, generator=torch.Generator().manual_seed(0))),
                  nn.Parameter(torch.randn(8, generator=torch.Generator().manual_seed(1))),
                  nn.Parameter(torch.randn(16, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64))]
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', 'Momentum-SAM was not given the model')
            opt = create_optimizer_v2(params, opt_name, lr=1e-2, **kwargs)
        torch._dynamo.reset()
        counters.clear()
        step = torch.compile(opt.step, backend='eager') if compiled else opt.step
        graphs = []
        for i in range(6):
            for j, p in enumerate(params):
                p.grad = None if j == 1 and i < 3 else torch.randn(p.shape, dtype=p.dtype,
                                                                   generator=torch.Generator().manual_seed(10 + i))
            step()
            graphs.append(counters['stats']['unique_graphs'])
        getattr(opt, 'restore', lambda: None)()
        return [p.detach().clone() for p in params], graphs

    _, base_graphs = run(base, compiled=True)
    weights, graphs = run(name, compiled=True)
    assert graphs == base_graphs and graphs[-1] > 0, (graphs, base_graphs)
    for compiled, eager in zip(weights, run(name, compiled=False)[0]):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
