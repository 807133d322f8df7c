"""SAM in timm's optimizer factory: every registered name really builds SAM over the right base, knows
its model, and uses the right default radius."""
import argparse
import copy
import warnings

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.optim import Lookahead, create_optimizer_v2, get_optimizer_class, list_optimizers, optimizer_kwargs
from timm.task import ClassificationTask

from timm_ext.optim import ASAM_RHO, SAM, SAM_BASES, SAM_RHO, list_sam_bases

SAM_NAMES = list_optimizers(['sam*', 'asam*'])


def _model():
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def test_registered_names():
    expected = {p + b for p in ('sam', 'asam') for b in SAM_BASES} | {'sam', 'asam'}
    assert set(SAM_NAMES) == expected
    assert all('_' not in n for n in SAM_NAMES)  # timm keeps only the text after the last underscore


@pytest.mark.parametrize('name', SAM_NAMES)
def test_every_name_builds_sam_that_perturbs(name):
    model = _model()
    x, y = _batch()
    base = None if name in ('sam', 'asam') else name[len('asam'):] if name.startswith('asam') else name[len('sam'):]
    extra = dict(base='adamw') if base is None else {}
    opt = create_optimizer_v2(model, opt=name, lr=1e-2, weight_decay=0.05, rho=0.07, **extra)
    assert isinstance(opt, SAM)
    assert type(opt.base_optimizer) is get_optimizer_class(base or 'adamw', bind_defaults=False)
    assert all(g['rho'] == 0.07 and g['adaptive'] == name.startswith('asam') for g in opt.param_groups)
    assert sorted(g['weight_decay'] for g in opt.param_groups) == [0.0, 0.05]
    seen = []

    def closure():
        opt.zero_grad()
        seen.append([p.detach().clone() for p in model.parameters()])
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    opt.step(closure)  # ADOPT's first step only initialises its state
    moved = sum((b - a).square().sum() for a, b in zip(seen[0], seen[1])).sqrt().item()
    if name.startswith('asam'):
        assert 0 < moved
    else:
        assert moved == pytest.approx(0.07, rel=1e-4)  # ||e|| = rho: the second pass ran at w + e
    assert any(not torch.equal(a, p) for a, p in zip(seen[0], model.parameters()))  # the base stepped


def test_base_arguments_follow_timm_factory_rules():
    model = _model()
    sgd = create_optimizer_v2(model, 'samsgd', lr=0.1, momentum=0.8)
    assert sgd.param_groups[0]['momentum'] == 0.8 and sgd.param_groups[0]['nesterov'] is True
    adamw = create_optimizer_v2(model, 'samadamw', lr=0.1, momentum=0.8, betas=(0.8, 0.9), eps=1e-6)
    assert adamw.param_groups[0]['betas'] == (0.8, 0.9) and adamw.param_groups[0]['eps'] == 1e-6
    generic = create_optimizer_v2(model, 'sam', lr=0.1, base='momentum', eps=1e-6)  # momentum: no eps
    assert generic.param_groups[0]['momentum'] == 0.9 and generic.param_groups[0]['nesterov'] is False
    clip = create_optimizer_v2(model, 'asamlamb', lr=0.1, eta=0.0, clip_grad=1.0, clip_mode='agc')
    assert (clip.settings.clip_grad, clip.settings.clip_mode, clip.param_groups[0]['eta']) == (1.0, 'agc', 0.0)


def test_train_py_recipe_route():
    """train.py: create_optimizer_v2(model, **optimizer_kwargs(cfg=args), **args.opt_kwargs)."""
    args = argparse.Namespace(opt='sam', lr=3e-3, weight_decay=0.3, momentum=0.9, opt_eps=None, opt_betas=None,
                              layer_decay=None, opt_kwargs={'base': 'adamw', 'rho': 0.1, 'clip_grad': 1.0})
    model = timm.create_model('test_vit', num_classes=3)
    opt = create_optimizer_v2(model, **optimizer_kwargs(cfg=args), **args.opt_kwargs)
    assert isinstance(opt, SAM) and isinstance(opt.base_optimizer, torch.optim.AdamW) and opt.settings.clip_grad == 1.0


def test_layer_decay_groups_are_shared():
    model = timm.create_model('test_vit', num_classes=3)
    opt = create_optimizer_v2(model, 'samadamw', lr=1e-3, weight_decay=0.05, layer_decay=0.75, rho=0.2)
    assert opt.param_groups is opt.base_optimizer.param_groups
    scales = {g['lr_scale'] for g in opt.param_groups}
    assert len(scales) > 2 and all(g['rho'] == 0.2 for g in opt.param_groups)


def test_lookahead_prefix_wraps_sam():
    model = _model()
    x, y = _batch()
    opt = create_optimizer_v2(model, 'lookahead_samadamw', lr=1e-2, rho=0.1)
    assert isinstance(opt, Lookahead) and isinstance(opt._base_optimizer, SAM)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    w0 = [p.detach().clone() for p in model.parameters()]
    task(x, y)['loss'].backward()
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(w0, model.parameters()))


def test_unknown_or_missing_base_lists_valid_names():
    model = _model()
    with pytest.raises(ValueError, match=r"Unknown base optimizer 'adamx' for SAM; valid names: .*adamw, .*sgd"):
        create_optimizer_v2(model, 'sam', lr=0.1, base='adamx')
    with pytest.raises(ValueError, match=r'SAM needs a base optimizer: use a combined name such as opt="samadamw"'):
        create_optimizer_v2(model, 'asam', lr=0.1)
    with pytest.raises(ValueError, match=r"Unknown base optimizer 'adahessian'"):  # second order: not a SAM base
        create_optimizer_v2(model, 'sam', lr=0.1, base='adahessian')
    with pytest.raises(ValueError, match=r'rho must be a finite number >= 0, got rho=-0.05'):
        create_optimizer_v2(model, 'samadamw', lr=0.1, rho=-0.05)


def test_sam_bases_cover_timm_optimizers():
    bases = list_sam_bases()
    assert {'sgd', 'momentum', 'nesterov', 'adam', 'adamw', 'lamb', 'cadamw', 'muon'} <= set(bases)
    assert 'adahessian' not in bases and not any(n.startswith(('sam', 'asam')) for n in bases)


@pytest.mark.parametrize('base', [b for b in list_sam_bases() if not b.startswith(('fused', 'bnb'))])  # CUDA-only
def test_any_timm_base_steps_under_sam(base):
    model = _model()
    x, y = _batch()
    opt = create_optimizer_v2(model, 'sam', base=base, lr=1e-2, weight_decay=0.01, rho=0.05)
    w0 = [p.detach().clone() for p in model.parameters()]

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(w0, model.parameters()))


# ---- the model the factory was given, and the ASAM radius ---------------------------------------------

def _bn_model():
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 3))


def test_factory_sam_knows_the_model_it_was_built_for():
    model = _bn_model()
    assert create_optimizer_v2(model, 'samadamw', lr=1e-3).model is model
    assert create_optimizer_v2(model, 'lookahead_samadamw', lr=1e-3)._base_optimizer.model is model
    assert create_optimizer_v2(model.parameters(), 'samadamw', lr=1e-3).model is None  # params only: unknown
    other = _bn_model()
    explicit = create_optimizer_v2(model.parameters(), 'samadamw', lr=1e-3, model=other)  # a TypeError before
    assert explicit.model is other and isinstance(explicit.base_optimizer, torch.optim.AdamW)
    assert create_optimizer_v2(model, 'samadamw', lr=1e-3, model=model).model is model
    with pytest.raises(ValueError, match=r'SAM model must be an nn.Module or None, got str'):
        create_optimizer_v2(model, 'samadamw', lr=1e-3, model='vit')


@pytest.mark.parametrize('mode', ['explicit', 'closure'])
def test_factory_sam_keeps_first_pass_buffers_without_being_told_the_model(mode):
    model = _bn_model()
    x, y = _batch()
    ref = copy.deepcopy(model)
    ref(x)  # one train-mode forward at w: the expected statistics
    opt = create_optimizer_v2(model, 'samsgd', lr=0.1, rho=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # in particular no "SAM does not know the model"
        if mode == 'explicit':
            F.cross_entropy(model(x), y).backward()
            opt.first_step()
            F.cross_entropy(model(x), y).backward()
            opt.second_step()
        else:
            opt.step(lambda: F.cross_entropy(model(x), y).backward())
    bn, bn_ref = model[1], ref[1]
    assert bn.num_batches_tracked.item() == 1
    assert torch.equal(bn.running_mean, bn_ref.running_mean) and torch.equal(bn.running_var, bn_ref.running_var)


def test_asam_names_default_to_the_asam_authors_rho():
    model = _model()
    assert (SAM_RHO, ASAM_RHO) == (0.05, 0.5)
    for name, base, rho in (('samadamw', {}, 0.05), ('asamadamw', {}, 0.5), ('asamsgd', {}, 0.5),
                            ('sam', {'base': 'lamb'}, 0.05), ('asam', {'base': 'lamb'}, 0.5)):
        opt = create_optimizer_v2(model, name, lr=1e-3, **base)
        assert {g['rho'] for g in opt.param_groups} == {rho}, name
    assert create_optimizer_v2(model, 'asamadamw', lr=1e-3, rho=2.0).param_groups[0]['rho'] == 2.0
