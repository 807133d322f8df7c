"""FriendlySAM: the perturbation along g - sigma * m against pytorch_optimizer's FriendlySAM on a real timm model,
its limit (sigma 0 is SAM), the momentum in the resumed state, m-sharpness, timm's factory names and bad input."""
import copy

import pytest
import torch
from _sam_reference import REFERENCE_BASES, drive, images, tiny_vit, train
from _sam_reference import batches as _batches
from _sam_reference import closure as _closure
from _sam_reference import flat as _flat
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2

from timm_ext.optim import SAM, FriendlySAM
from timm_ext.optim.friendly_sam import MOMENTUM_KEY

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')


@pytest.mark.timm_models_only
@pytest.mark.parametrize('base_name', list(REFERENCE_BASES))
def test_equals_pytorch_optimizer_friendlysam_on_a_vit(base_name):
    po = pytest.importorskip('pytorch_optimizer', reason='pytorch_optimizer is the test-only reference')
    base_optimizer, kwargs, dtype = REFERENCE_BASES[base_name]
    base, data = tiny_vit().to(dtype), [(x.to(dtype), y) for x, y in images()]
    ours, theirs, sam = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    kwargs = dict(rho=0.1, **kwargs)
    a = train(ours, FriendlySAM(ours.parameters(), base_optimizer, sigma=0.8, lmbda=0.6, **kwargs), data)
    b = train(theirs, po.FriendlySAM(theirs.parameters(), base_optimizer, sigma=0.8, lmbda=0.6, **kwargs), data,
               first_pass_outside=True)  # its step() wants the gradient at w computed already
    c = train(sam, SAM(sam.parameters(), base_optimizer, **kwargs), data)
    start = _flat(base.parameters()).detach()
    assert ((a - b).norm() / (b - start).norm()).item() <= 1e-5
    assert ((a - c).norm() / (c - start).norm()).item() > 1e-3  # the momentum really changes the direction


def test_sigma_zero_is_sam_and_the_first_step_is_sam_s():
    base, data = _mlp(), _batches(4)
    results = {}
    for name, make in (('sigma0', lambda m: FriendlySAM(torch.optim.SGD(m.parameters(), lr=0.1), rho=0.2, sigma=0.0)),
                       ('sam', lambda m: SAM(torch.optim.SGD(m.parameters(), lr=0.1), rho=0.2))):
        model = copy.deepcopy(base)
        drive(model, make(model), data, 'closure')
        results[name] = _flat(model.parameters()).detach()
    torch.testing.assert_close(results['sigma0'], results['sam'])
    one = {}
    for name, cls in (('fsam', FriendlySAM), ('sam', SAM)):  # no momentum yet: the first step perturbs along g
        model = copy.deepcopy(base)
        drive(model, cls(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.2), data[:1], 'closure')
        one[name] = _flat(model.parameters()).detach()
    torch.testing.assert_close(one['fsam'], one['sam'])


def test_momentum_is_the_gradients_moving_average_and_resumes():
    model, data = _mlp(), _batches(3)
    opt = FriendlySAM(torch.optim.SGD(model.parameters(), lr=0.0), rho=0.2, lmbda=0.5)  # lr 0: w stays, g known
    grads = []
    for x, y in data:
        grads.append([g.clone() for g in torch.autograd.grad(
            torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))])
        opt.step(_closure(model, opt, x, y))
    expected = [0.5 * (0.5 * g0 + 0.5 * g1) + 0.5 * g2 for g0, g1, g2 in zip(*grads)]
    for p, m in zip(model.parameters(), expected):
        torch.testing.assert_close(opt.state[p][MOMENTUM_KEY], m)
    again = FriendlySAM(torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.0), rho=0.2, lmbda=0.5)
    again.load_state_dict(opt.state_dict())
    for p, m in zip(again.param_groups[0]['params'], expected):
        torch.testing.assert_close(again.state[p][MOMENTUM_KEY], m)


def test_with_m_sharpness_the_momentum_takes_the_chunks_mean_gradient():
    model, (x, y) = _mlp(), _batches(1)[0]
    opt = FriendlySAM(torch.optim.SGD(model.parameters(), lr=0.0), rho=0.2, m_sharpness=4)
    g = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
    opt.step(lambda chunk=None: _chunked_loss(model, opt, x, y, chunk))
    for p, full in zip(model.parameters(), g):  # the mean of two chunks' mean-loss gradients: the batch's
        torch.testing.assert_close(opt.state[p][MOMENTUM_KEY], full)


def _chunked_loss(model, opt, x, y, chunk):
    opt.zero_grad()
    xs, ys = (x, y) if chunk is None else chunk(x, y)
    loss = torch.nn.functional.cross_entropy(model(xs), ys)
    loss.backward()
    return loss


def test_factory_names():
    model = _mlp()
    opt = create_optimizer_v2(model, 'friendlysamsgd', lr=0.1, sigma=0.5, lmbda=0.8)
    assert isinstance(opt, FriendlySAM) and (opt.settings.sigma, opt.settings.lmbda) == (0.5, 0.8)
    assert type(create_optimizer_v2(model, 'friendlysam', lr=0.1).base_optimizer).__name__ == 'AdamW'


@pytest.mark.parametrize('kwargs, match', [
    (dict(sigma=-1.0), r'^FriendlySAM sigma must be a finite number >= 0, got sigma=-1.0$'),
    (dict(lmbda=1.5), r"^FriendlySAM lmbda must be in \[0, 1\] \(the momentum's decay\), got lmbda=1.5$"),
    (dict(sigmma=1.0), r"sigmma"),
])
def test_bad_settings_are_one_line(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        FriendlySAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), **kwargs)


@pytest.mark.slow
def test_in_train_py_it_equals_the_same_friendlysam_driven_by_hand(tmp_path):
    from _train_py_routes import both_routes

    loop, train_py = both_routes(tmp_path, 'friendlysamadamw', dict(rho=0.05, sigma=1.0, lmbda=0.6))
    assert loop == train_py and len(loop.splitlines()) == 3  # a header and two epochs, every number the same
