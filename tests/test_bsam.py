"""bSAM (Möllenhoff & Khan, ICLR 2023): the update against a float64 loop written here from the paper's equations
(the official code's build_bsam_optimizer) on a real timm model, through each route; its limits; resume with the
noise generator; fp16 loss scaling; the weights outside a training forward; timm's factory name; where
pytorch_optimizer's BSAM differs; bad input."""
import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from _sam_reference import batch as _batch
from _sam_reference import batches as _batches
from _sam_reference import closure as _closure
from _sam_reference import drive, images, spawn_gloo, tiny_vit
from _sam_reference import flat as _flat
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2

from timm_ext.optim.bsam import BSAM, register_bsam_optimizer

SETTINGS = dict(lr=0.5, betas=(0.8, 0.99), weight_decay=1e-3, rho=0.05, num_data=500, s_init=1.5, damping=0.1,
                seed=7)


def _grad(model, weights, x, y):
    """The cross-entropy gradient at ``weights`` (a list in ``model.parameters()`` order), ``model`` untouched."""
    names = [n for n, _ in model.named_parameters()]
    leaves = [w.detach().requires_grad_(True) for w in weights]
    loss = F.cross_entropy(torch.func.functional_call(model, dict(zip(names, leaves)), (x,)), y)
    return [g.detach() for g in torch.autograd.grad(loss, leaves)]


def reference(model, data, lr, betas, weight_decay, rho, num_data, s_init, damping, seed):
    """The paper's update, one line each, on ``model.parameters()`` (one param group, its order). The noise: per
    update one seed from a generator seeded with ``seed``, then float32 standard normals, parameter by parameter,
    from a CPU generator seeded with it (what BSAM draws on a CPU), scaled to variance 1 / (N s)."""
    b1, b2, d = betas[0], betas[1], weight_decay
    w = [p.detach().clone() for p in model.parameters()]
    m = [torch.zeros_like(p) for p in w]
    s = [torch.full_like(p, s_init) for p in w]
    generator = torch.Generator().manual_seed(seed)
    for x, y in data:
        step = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 62, (), generator=generator)))
        z = [torch.randn(p.shape, generator=step, dtype=torch.float32).to(p.dtype) for p in w]
        g = _grad(model, [wi + zi * (1.0 / (num_data * si)).sqrt() for wi, zi, si in zip(w, z, s)], x, y)
        h = _grad(model, [wi + rho * gi / si for wi, gi, si in zip(w, g, s)], x, y)
        m = [b1 * mi + (1 - b1) * (hi + d * wi) for mi, hi, wi in zip(m, h, w)]
        w = [wi - lr * mi / si for wi, mi, si in zip(w, m, s)]
        s = [b2 * si + (1 - b2) * ((si * gi ** 2).sqrt() + damping + d) for si, gi in zip(s, g)]
    return _flat(w)


def _vit64():
    return tiny_vit().to(torch.float64), [(x.double(), y) for x, y in images(4)]


def _close(a, b, start):
    return ((a - b).norm() / (b - start).norm()).item()


@pytest.fixture(scope='module')
def vit_reference():
    """The ViT, its data, and the reference's final weights, computed once for every route."""
    base, data = _vit64()
    return base, data, reference(base, data, **SETTINGS)


def test_the_reference_moves_the_weights_and_its_noise_matters(vit_reference):
    base, data, expected = vit_reference
    start = _flat(base.parameters()).detach()
    assert (expected - start).norm() > 1e-2 * start.norm()
    noiseless = reference(base, data, **dict(SETTINGS, num_data=10 ** 15))
    assert _close(noiseless, expected, start) > 1e-3


@pytest.mark.parametrize('route', ['closure', 'closure-without-model', 'explicit', 'task'])
def test_every_route_equals_the_papers_update_on_a_vit(route, vit_reference):
    base, data, expected = vit_reference
    model = copy.deepcopy(base)
    opt = BSAM(model.parameters(), model=None if route == 'closure-without-model' else model, **SETTINGS)
    drive(model, opt, data, route.split('-')[0])
    assert _close(_flat(model.parameters()).detach(), expected, _flat(base.parameters()).detach()) <= 1e-5


def test_rho_zero_without_noise_is_the_plain_adam_like_update():
    base, data = _mlp().double(), [(x.double(), y) for x, y in _batches(4)]
    lr, (b1, b2), d, c = 0.1, (0.9, 0.999), 1e-2, 0.1
    model = copy.deepcopy(base)
    opt = BSAM(model.parameters(), lr=lr, betas=(b1, b2), weight_decay=d, damping=c, rho=0.0, num_data=10 ** 18)
    drive(model, opt, data, 'closure')
    w = [p.detach().clone() for p in base.parameters()]
    m = [torch.zeros_like(p) for p in w]
    s = [torch.ones_like(p) for p in w]
    for x, y in data:  # g = h = grad L(w): momentum over g + d w, a step over s, s from sqrt(s) |g|
        g = _grad(base, w, x, y)
        m = [b1 * mi + (1 - b1) * (gi + d * wi) for mi, gi, wi in zip(m, g, w)]
        w = [wi - lr * mi / si for wi, mi, si in zip(w, m, s)]
        s = [b2 * si + (1 - b2) * (si.sqrt() * gi.abs() + c + d) for si, gi in zip(s, g)]
    torch.testing.assert_close(_flat(model.parameters()), _flat(w), rtol=1e-12, atol=1e-12)


def test_a_resumed_run_continues_exactly_noise_included():
    base, data = _mlp(), _batches(4)
    model = copy.deepcopy(base)
    opt = BSAM(model.parameters(), model=model, lr=0.1, num_data=50, seed=3)
    drive(model, opt, data, 'closure')
    half = copy.deepcopy(base)
    first = BSAM(half.parameters(), model=half, lr=0.1, num_data=50, seed=3)
    drive(half, first, data[:2], 'closure')
    state = copy.deepcopy(first.state_dict())
    assert state['sam']['noise_generator'].dtype == torch.uint8 and state['sam']['step'] == 2
    resumed = copy.deepcopy(half)
    again = BSAM(resumed.parameters(), model=resumed, lr=0.1, num_data=50, seed=99)  # the checkpoint's seed wins
    again.load_state_dict(state)
    assert again.settings.seed == 3
    drive(resumed, again, data[2:], 'explicit')
    assert torch.equal(_flat(resumed.parameters()), _flat(model.parameters()))
    for p, q in zip(resumed.parameters(), model.parameters()):
        assert torch.equal(again.state[p]['precision'], opt.state[q]['precision'])


def test_state_dict_round_trip_keeps_the_groups_settings():
    model = _mlp()
    opt = BSAM(model.parameters(), num_data=10, rho=0.02, s_init=3.0, damping=0.5)
    drive(model, opt, _batches(1), 'closure')
    again = BSAM(copy.deepcopy(model).parameters(), num_data=10)
    again.load_state_dict(opt.state_dict())
    group = again.param_groups[0]
    assert (group['rho'], group['s_init'], group['damping']) == (0.02, 3.0, 0.5)
    assert torch.equal(again._generator.get_state(), opt._generator.get_state())


def _scaled_closure(model, opt, x, y, scaler, inf=False):
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss * (math.inf if inf else 1.0)).backward()
        return loss
    return closure


def test_fp16_grad_scaler_on_the_closure_route_unscales_both_passes():
    base, data = _mlp(), _batches(3)
    plain = copy.deepcopy(base)
    drive(plain, BSAM(plain.parameters(), lr=0.1, num_data=100), data, 'closure')
    model = copy.deepcopy(base)
    opt = BSAM(model.parameters(), lr=0.1, num_data=100)
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    for x, y in data:
        opt.step(_scaled_closure(model, opt, x, y, scaler), grad_scaler=scaler)
        scaler.update()
    assert scaler.get_scale() == 2.0 ** 10
    torch.testing.assert_close(_flat(model.parameters()), _flat(plain.parameters()))


def test_an_overflow_skips_the_update_and_leaves_the_mean_weights_bit_exact():
    model, (x, y) = _mlp(), _batches(1)[0]
    opt = BSAM(model.parameters(), model=model, lr=0.1, num_data=100)
    before = _flat(model.parameters()).detach().clone()
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    opt.step(_scaled_closure(model, opt, x, y, scaler, inf=True), grad_scaler=scaler)
    scaler.update()
    assert torch.equal(_flat(model.parameters()), before) and not opt.state  # restored, nothing stepped
    assert scaler.get_scale() == 2.0 ** 9
    opt.step(_scaled_closure(model, opt, x, y, scaler), grad_scaler=scaler)
    assert not torch.equal(_flat(model.parameters()), before)


def test_outside_a_training_forward_the_weights_are_the_mean():
    base, data = _mlp(), _batches(3)
    model = copy.deepcopy(base)
    opt = BSAM(model.parameters(), model=model, lr=0.1, num_data=20)
    drive(model, opt, data[:2], 'explicit')
    mean = _flat(model.parameters()).detach().clone()
    x, y = data[2]
    model.eval()
    model(x)  # evaluation
    model.train()
    with torch.no_grad():
        model(x)  # a forward without gradients
    assert torch.equal(_flat(model.parameters()), mean)
    F.cross_entropy(model(x), y).backward()  # the first pass: at w + eps
    noisy = _flat(model.parameters()).detach().clone()
    assert not torch.equal(noisy, mean)
    assert (noisy - mean).std().item() == pytest.approx(1 / math.sqrt(20), rel=0.5)  # s near 1 after two steps
    model(x)  # a later forward of the same step (gradient accumulation): the same noisy weights
    assert torch.equal(_flat(model.parameters()), noisy)
    opt.restore()
    assert torch.equal(_flat(model.parameters()), mean)


def test_a_first_pass_at_the_mean_is_refused_or_redone_at_w_plus_eps():
    model, (x, y) = _mlp(), _batches(1)[0]
    opt = BSAM(model.parameters(), num_data=10)  # no model: nothing moves the weights at the caller's forward
    F.cross_entropy(model(x), y).backward()
    before = _flat(model.parameters()).detach().clone()
    with pytest.raises(RuntimeError, match=r'^bSAM: the ascent found the weights at w, not at w \+ eps: [^\n]*$'):
        opt.first_step()
    assert torch.equal(_flat(model.parameters()), before)
    twin = copy.deepcopy(model)
    with pytest.warns(UserWarning, match=r'^bSAM discarded the gradient your backward left at w'):
        opt.step(lambda: F.cross_entropy(model(x), y).backward())  # davda54/sam's convention: the closure runs both
    clean = BSAM(twin.parameters(), num_data=10)
    clean.step(lambda: F.cross_entropy(twin(x), y).backward())
    assert torch.equal(_flat(model.parameters()), _flat(twin.parameters()))


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(), ValueError, r'^bSAM needs num_data=<training set size> \(an int > 0: the noise\'s variance is '
                         r'1 / \(num_data \* s\)\), got num_data=None$'),
    (dict(num_data=0), ValueError, r'^bSAM needs num_data=<training set size> .*, got num_data=0$'),
    (dict(num_data=-5), ValueError, r'^bSAM needs num_data=<training set size> .*, got num_data=-5$'),
    (dict(num_data=1e4), ValueError, r'^bSAM needs num_data=<training set size> .*, got num_data=10000.0$'),
    (dict(num_data=10, rho=-1.0), ValueError, r'^bSAM rho must be a finite number >= 0, got rho=-1.0$'),
    (dict(num_data=10, betas=(0.9, 1.0)), ValueError,
     r'^bSAM betas must be two numbers in \[0, 1\) \(momentum, precision\), got betas=\(0.9, 1.0\)$'),
    (dict(num_data=10, betas=(0.9,)), ValueError, r'^bSAM betas must be two numbers in \[0, 1\) .*betas=\(0.9,\)$'),
    (dict(num_data=10, s_init=0.0), ValueError, r'^bSAM s_init must be a finite number > 0 .*, got s_init=0.0$'),
    (dict(num_data=10, damping=-0.1), ValueError, r'^bSAM damping must be a finite number >= 0, got damping=-0.1$'),
    (dict(num_data=10, seed=-1), ValueError, r'^bSAM seed must be an int >= 0 .*, got seed=-1$'),
    (dict(num_data=10, adaptive=True), ValueError, r'^bSAM does not take adaptive=True: its ascent rho g / s is'),
    (dict(num_data=10, m_sharpness=4), ValueError, r'^bSAM does not take m_sharpness=4: per-chunk noise'),
    (dict(num_data=10, interval=2), ValueError, r'^bSAM does not take interval=2: every update needs'),
    (dict(num_data=10, use_gc=True), ValueError, r'^bSAM does not take use_gc=True: the paper has no'),
    (dict(num_data=10, rhoo=0.1), TypeError, r"unexpected keyword argument 'rhoo'$"),
])
def test_bad_input_is_one_line_naming_the_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        BSAM(_mlp().parameters(), **kwargs)


def test_timm_factory_builds_bsam_with_its_model_and_groups():
    register_bsam_optimizer()
    register_bsam_optimizer()  # idempotent
    model = _mlp()
    opt = create_optimizer_v2(model, 'bsam', lr=0.2, weight_decay=1e-3, betas=(0.8, 0.9), num_data=1000, rho=0.03)
    assert type(opt) is BSAM and opt.model is model and opt.settings.num_data == 1000
    assert sorted(g['weight_decay'] for g in opt.param_groups) == [0.0, 1e-3]  # timm's no-decay group for 1-d params
    assert all(g['betas'] == (0.8, 0.9) and g['rho'] == 0.03 and g['lr'] == 0.2 for g in opt.param_groups)
    with pytest.raises(ValueError, match=r'^bSAM needs num_data=<training set size>'):
        create_optimizer_v2(model, 'bsam', lr=0.2)
    x, y = _batches(1)[0]
    F.cross_entropy(model(x), y).backward()  # train.py's first pass: displaced by the factory's model
    opt.first_step()
    F.cross_entropy(model(x), y).backward()
    opt.second_step()


def test_pytorch_optimizer_bsam_differs_where_the_docs_say():
    po = pytest.importorskip('pytorch_optimizer', reason='pytorch_optimizer is the test-only comparison')
    (x, y), base = _batches(1)[0], _mlp()
    # 1. its noise has std 1 / (N s), ours sqrt(1 / (N s)); it draws only for parameters that already have a gradient
    p = torch.nn.Parameter(torch.zeros(20000))
    theirs = po.BSAM([p], num_data=4)
    theirs.first_step()
    assert torch.equal(p.detach(), torch.zeros(20000))  # no gradient yet: no noise at its first step
    p.grad = torch.zeros(20000)
    theirs.first_step()
    assert p.detach().std().item() == pytest.approx(1 / 4, rel=0.05)  # ours: 1 / 2
    # 2. it never takes the weights back: after a step at lr 0 they keep the noise and the ascent; ours are w
    their_model, our_model = copy.deepcopy(base), copy.deepcopy(base)
    theirs = po.BSAM(their_model.parameters(), num_data=10, lr=0.0)
    with pytest.raises((RuntimeError, KeyError)):  # its first step(closure) fails while no gradient exists yet
        theirs.step(_closure(their_model, theirs, x, y))
    their_model.load_state_dict(base.state_dict())
    _closure(their_model, theirs, x, y)()  # a gradient first: its state is made from the parameters that have one
    theirs.step(_closure(their_model, theirs, x, y))
    ours = BSAM(our_model.parameters(), model=our_model, num_data=10, lr=0.0)
    drive(our_model, ours, [(x, y)], 'closure')
    assert torch.equal(_flat(our_model.parameters()), _flat(base.parameters()))
    assert not torch.allclose(_flat(their_model.parameters()), _flat(base.parameters()), atol=1e-3)
    # 3. its momentum averages weight_decay * h (not h + d w): at weight_decay 0 its weights move by nothing but the
    # noise and the ascent it leaves in them; 4. its precision is squared, from h, and steps w with the new s
    p = torch.nn.Parameter(torch.ones(3))
    theirs = po.BSAM([p], num_data=10 ** 12, lr=0.1, weight_decay=0.0, damping=0.1, rho=0.0, betas=(0.9, 0.5))
    h = torch.tensor([1.0, -2.0, 3.0])
    p.grad = h.clone()
    theirs.init_group(theirs.param_groups[0])  # its state (s = 1), as its first_step makes it
    theirs.third_step()
    assert torch.equal(theirs.state[p]['momentum'], torch.zeros(3)) and torch.equal(p.detach(), torch.ones(3))
    torch.testing.assert_close(theirs.state[p]['s'], 0.5 + 0.5 * (h.abs() + 0.1) ** 2)  # ours: 0.5 + 0.5 (|g| + .1)
    p = torch.nn.Parameter(torch.ones(3))  # with weight decay 0.5: m = 0.1 * 0.5 h, and w steps over the new s
    theirs = po.BSAM([p], num_data=10 ** 12, lr=0.1, weight_decay=0.5, damping=0.1, rho=0.0, betas=(0.9, 0.5))
    p.grad = h.clone()
    theirs.init_group(theirs.param_groups[0])
    theirs.third_step()
    new_s = 0.5 + 0.5 * (h.abs() + 0.5 + 0.1) ** 2  # ours: m = 0.1 (h + 0.5 w), w - lr m / 1 (the old s)
    torch.testing.assert_close(p.detach(), 1 - 0.1 * (0.1 * 0.5 * h) / new_s)


def _ddp_worker(rank, world, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = _mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = BSAM(model.parameters(), model=model, lr=0.1, num_data=50, seed=5)
    for t in range(3):
        x, y = _batch(8, seed=10 * t + rank)  # each rank its own data: its own g in the first pass (no_sync)
        opt.step(_closure(ddp, opt, x, y), no_sync=ddp.no_sync)
    mine = torch.cat([_flat(model.parameters()), _flat(opt.state[p]['precision'] for p in model.parameters())])
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    dist.destroy_process_group()
    assert all(torch.equal(every[0], other) for other in every[1:])


def test_under_ddp_every_rank_keeps_the_same_weights_and_precision():
    """The first pass in no_sync (each rank's own g and ascent): sqrt(s)|g| is averaged over the ranks, the noise
    drawn alike on each, so the mean and the precision stay the same everywhere."""
    spawn_gloo(_ddp_worker)


@pytest.mark.slow
def test_in_train_py_it_equals_the_same_bsam_driven_by_hand(tmp_path):
    from _train_py_routes import both_routes

    loop, train_py = both_routes(tmp_path, 'bsam', dict(num_data=2000, rho=0.01, seed=1))
    assert loop == train_py and len(loop.splitlines()) == 3  # a header and two epochs, every number the same
