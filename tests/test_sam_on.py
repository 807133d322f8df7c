"""SAM-ON: only the normalization layers' parameters perturbed, against the paper's update written out (Mueller et
al., NeurIPS 2023; no library has it), its limit (every parameter: SAM), which layers count as normalization, the
model it needs, copies and resume, timm's factory and train.py."""
import copy
import pickle

import pytest
import timm
import torch
import torch.nn as nn
from _sam_reference import at as _at
from _sam_reference import batches as _batches
from _sam_reference import closure as _closure
from _sam_reference import drive, sgd_reference
from _sam_reference import flat as _flat
from _sam_reference import grad as _grad
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2

from timm_ext.optim import SAM, SAMON
from timm_ext.optim.sam_on import is_normalization

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')


def _norm_mask(model):
    """1 where a flat parameter belongs to a normalization layer (here the MLP's BatchNorm1d), else 0."""
    return torch.cat([torch.full((p.numel(),), float(is_normalization(m)))
                      for m in model.modules() for p in m.parameters(recurse=False)])


@pytest.mark.parametrize('route', ['closure', 'explicit', 'task'])
def test_equals_the_papers_update_over_several_steps(route):
    base, data = _mlp(bn=True), _batches(4)
    mask = _norm_mask(base)
    assert 0 < mask.sum() < mask.numel()

    def direction(model, t, xy):
        g = _grad(model, *xy) * mask  # e = rho g_N / ||g_N||, the other weights stay at w
        return _grad(_at(model, _flat(model.parameters()).detach() + 0.3 * g / g.norm()), *xy)

    expected = sgd_reference(base, data, direction, lr=0.1)
    model = copy.deepcopy(base)
    drive(model, SAMON(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.3, model=model), data, route)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


def test_every_parameter_is_sam_and_the_norm_layers_alone_are_not():
    base, data = _mlp(bn=True), _batches(3)
    out = {}
    for name, make in (('all', lambda m: SAMON(torch.optim.SGD(m.parameters(), lr=0.1), rho=0.3, only_norm=False)),
                       ('sam', lambda m: SAM(torch.optim.SGD(m.parameters(), lr=0.1), rho=0.3, model=m)),
                       ('on', lambda m: SAMON(torch.optim.SGD(m.parameters(), lr=0.1), rho=0.3, model=m))):
        model = copy.deepcopy(base)
        drive(model, make(model), data, 'closure')
        out[name] = _flat(model.parameters()).detach()
    torch.testing.assert_close(out['all'], out['sam'])
    assert (out['on'] - out['sam']).abs().max() > 1e-4


def test_which_layers_are_normalization():
    vit = timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, depth=2, num_classes=3)
    resnet = timm.create_model('resnet10t', num_classes=3)
    for model in (vit, resnet):
        opt = create_optimizer_v2(model, 'samonsgd', lr=0.1)  # the factory hands SAM-ON the model
        moved = {n for n, p in model.named_parameters() if p in opt.sam_parameters()}
        owner = {n: model.get_submodule(n.rpartition('.')[0]) for n, _ in model.named_parameters()}
        assert moved == {n for n, m in owner.items() if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d))}
        assert not any(n.endswith(('qkv.weight', 'fc1.weight', 'head.weight', 'fc.weight')) for n in moved)
    assert len([m for m in vit.modules() if isinstance(m, nn.LayerNorm)]) * 2 == len(
        create_optimizer_v2(vit, 'samonadamw', lr=0.1).sam_parameters())


def test_copies_pickles_and_resume_keep_the_norm_parameters():
    model, (x, y) = _mlp(bn=True), _batches(1)[0]
    opt = SAMON(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    opt.step(_closure(model, opt, x, y))
    copied = copy.deepcopy({'model': model, 'opt': opt})
    norm = {id(p) for m in copied['model'].modules() if is_normalization(m) for p in m.parameters(recurse=False)}
    assert {id(p) for p in copied['opt'].sam_parameters()} == norm
    again = pickle.loads(pickle.dumps({'model': model, 'opt': opt}))
    assert len(again['opt'].sam_parameters()) == len(opt.sam_parameters())
    twin = copy.deepcopy(model)
    resumed = SAMON(torch.optim.SGD(twin.parameters(), lr=0.1), model=twin, only_norm=True)
    resumed.load_state_dict(opt.state_dict())
    assert resumed.settings.only_norm is True


def test_bad_input_is_one_line():
    linear = nn.Linear(2, 2)
    with pytest.warns(UserWarning, match=r"^SAM-ON was not given the model, so it cannot find the normalization "
                                         r"layers: it perturbs every parameter, as SAM does"):
        alone = SAMON(torch.optim.SGD(linear.parameters(), lr=0.1))
    assert alone.sam_parameters() is None  # every parameter: SAM, said, not silently
    with pytest.raises(ValueError, match=r'^SAM-ON found no normalization layer parameters of Linear among the '
                                         r'parameters it optimizes: use sam'):
        SAMON(torch.optim.SGD(linear.parameters(), lr=0.1), model=linear)
    with pytest.raises(ValueError, match=r"^SAM-ON only_norm must be True or False, got only_norm='yes'$"):
        SAMON(torch.optim.SGD(linear.parameters(), lr=0.1), model=linear, only_norm='yes')


@pytest.mark.slow
def test_in_train_py_it_equals_the_same_sam_on_driven_by_hand(tmp_path):
    from _train_py_routes import both_routes

    loop, train_py = both_routes(tmp_path, 'samonadamw', dict(rho=0.05))
    assert loop == train_py and len(loop.splitlines()) == 3  # a header and two epochs, every number the same
