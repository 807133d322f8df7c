"""WSAM: the weighted sharpness against pytorch_optimizer's WSAM on a real timm model (both forms), its limit
(gamma 0.5 without decoupling is SAM), timm's factory names, resume, and bad input."""
import copy

import pytest
import torch
from _sam_reference import REFERENCE_BASES, drive, images, tiny_vit, train
from _sam_reference import batches as _batches
from _sam_reference import closure as _closure
from _sam_reference import flat as _flat
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2

from timm_ext.optim import SAM, WSAM

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')


@pytest.mark.timm_models_only
@pytest.mark.parametrize('base_name', list(REFERENCE_BASES))
@pytest.mark.parametrize('decouple', [True, False])
def test_equals_pytorch_optimizer_wsam_on_a_vit(decouple, base_name):
    po = pytest.importorskip('pytorch_optimizer', reason='pytorch_optimizer is the test-only reference')
    base_optimizer, kwargs, dtype = REFERENCE_BASES[base_name]
    base, data = tiny_vit().to(dtype), [(x.to(dtype), y) for x, y in images()]
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    kwargs = dict(rho=0.1, gamma=0.8, decouple=decouple, **kwargs)
    a = train(ours, WSAM(ours.parameters(), base_optimizer, **kwargs), data)
    b = train(theirs, po.WSAM(theirs, theirs.parameters(), base_optimizer, **kwargs), data)
    start = _flat(base.parameters()).detach()
    assert (a - start).norm() > 1e-2 * start.norm()  # the steps really move the weights
    assert ((a - b).norm() / (b - start).norm()).item() <= 1e-5
    sam = copy.deepcopy(base)  # and the sharpness term really changes them
    c = train(sam, SAM(sam.parameters(), base_optimizer, **{k: v for k, v in kwargs.items()
                                                              if k not in ('gamma', 'decouple')}), data)
    assert ((a - c).norm() / (c - start).norm()).item() > 1e-2


def test_gamma_one_half_without_decoupling_is_sam():
    base, data = _mlp(), _batches(4)
    results = []
    for make in (lambda m: WSAM(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), rho=0.2, gamma=0.5,
                                decouple=False),
                 lambda m: SAM(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), rho=0.2)):
        model = copy.deepcopy(base)
        drive(model, make(model), data, 'closure')
        results.append(_flat(model.parameters()).detach())
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize('route', ['closure', 'explicit', 'task'])
def test_every_route_gives_the_same_update(route):
    base, data = _mlp(), _batches(3)
    ref = copy.deepcopy(base)
    drive(ref, WSAM(torch.optim.SGD(ref.parameters(), lr=0.1), rho=0.2, gamma=0.7), data, 'closure')
    model = copy.deepcopy(base)
    drive(model, WSAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.2, gamma=0.7), data, route)
    torch.testing.assert_close(_flat(model.parameters()), _flat(ref.parameters()))


def test_factory_names_and_state_dict_round_trip():
    model = _mlp()
    opt = create_optimizer_v2(model, 'wsamsgd', lr=0.1, gamma=0.6, decouple=False)
    assert isinstance(opt, WSAM) and opt.settings.gamma == 0.6 and opt.settings.decouple is False
    assert type(create_optimizer_v2(model, 'wsam', lr=0.1).base_optimizer).__name__ == 'AdamW'
    x, y = _batches(1)[0]
    opt.step(_closure(model, opt, x, y))
    state = opt.state_dict()
    again = create_optimizer_v2(copy.deepcopy(model), 'wsamsgd', lr=0.1)
    again.load_state_dict(state)
    assert again.settings.gamma == 0.6 and again.settings.decouple is False


@pytest.mark.parametrize('kwargs, match', [
    (dict(gamma=1.0), r'^WSAM gamma must be in \[0, 1\) \(the sharpness weighs gamma / \(1 - gamma\)\), got '
                      r'gamma=1.0$'),
    (dict(gamma=-0.1), r'WSAM gamma must be in \[0, 1\)'),
    (dict(decouple='yes'), r"^WSAM decouple must be True or False, got decouple='yes'$"),
    (dict(rho=-1.0), r'^SAM rho must be a finite number >= 0, got rho=-1.0$'),
])
def test_bad_settings_are_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WSAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), **kwargs)


@pytest.mark.slow
def test_in_train_py_it_equals_the_same_wsam_driven_by_hand(tmp_path):
    from _train_py_routes import both_routes

    loop, train_py = both_routes(tmp_path, 'wsamadamw', dict(rho=0.05, gamma=0.8))
    assert loop == train_py and len(loop.splitlines()) == 3  # a header and two epochs, every number the same
