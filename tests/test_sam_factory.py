"""SAM in timm's optimizer factory: every registered name really builds SAM over the right base, knows
its model, and uses the right default radius."""
import argparse
import copy
import functools
import inspect
import re
import warnings

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.optim import (
    Lookahead,
    create_optimizer_v2,
    get_optimizer_class,
    get_optimizer_info,
    list_optimizers,
    optimizer_kwargs,
)
from timm.task import ClassificationTask

from timm_ext.optim import ASAM_RHO, GSAM, SAM, SAM_BASES, SAM_RHO, LookSAM, list_sam_bases, replay_timm_task
from timm_ext.optim.sam_factory import DEFAULT_BASE

SAM_NAMES = [n for n in list_optimizers(['sam*', 'asam*']) if not n.startswith('samon')]  # samon*: SAM-ON's
# every name timm_ext registered: those whose class is of the SAM family
EXT_NAMES = [n for n in list_optimizers() if isinstance(get_optimizer_info(n).opt_class, type)
             and issubclass(get_optimizer_info(n).opt_class, SAM)
             and 'base' in (get_optimizer_info(n).defaults or {})]  # bsam: an update of its own (tests/test_bsam.py)


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
    replay_timm_task(opt, task)  # through the Lookahead, to the SAM it wraps
    w0 = [p.detach().clone() for p in model.parameters()]
    task(x, y)['loss'].backward()
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(w0, model.parameters()))


def test_replay_timm_task_through_lookahead_is_the_plain_sam_route_until_its_first_sync():
    """``lookahead_samadamw`` + ``replay_timm_task(opt, task)``: over fewer steps than the lookahead's k, the same
    weights, bit for bit, as ``samadamw`` driven the same way."""
    base = _model()
    data = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
            for g in [torch.Generator().manual_seed(s) for s in range(3)]]
    results = {}
    for name in ('samadamw', 'lookahead_samadamw'):
        model = copy.deepcopy(base)
        opt = create_optimizer_v2(model, name, lr=1e-2, weight_decay=0.05, rho=0.1)
        if name.startswith('lookahead'):
            assert isinstance(opt, Lookahead) and all(g['lookahead_k'] > len(data) for g in opt.param_groups)
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
        replay_timm_task(opt, task)
        for x, y in data:
            task(x, y)['loss'].backward()
            opt.step()
            opt.zero_grad()
        results[name] = model
    moved = any(not torch.equal(a, b) for a, b in zip(base.parameters(), results['samadamw'].parameters()))
    assert moved
    for a, b in zip(results['samadamw'].state_dict().values(), results['lookahead_samadamw'].state_dict().values()):
        assert torch.equal(a, b)


def test_unknown_or_missing_base_lists_valid_names():
    model = _model()
    with pytest.raises(ValueError, match=r"Unknown base optimizer 'adamx' for SAM; valid names: .*adamw, .*sgd"):
        create_optimizer_v2(model, 'sam', lr=0.1, base='adamx')
    # a bare name without base builds on DEFAULT_BASE now (test_bare_names_build_on_adamw); an explicit
    # base=None is still refused
    with pytest.raises(ValueError, match=r'SAM needs a base optimizer: use a combined name such as opt="samadamw"'):
        create_optimizer_v2(model, 'asam', lr=0.1, base=None)
    with pytest.raises(ValueError, match=r"Unknown base optimizer 'adahessian'"):  # second order: not a SAM base
        create_optimizer_v2(model, 'sam', lr=0.1, base='adahessian')
    with pytest.raises(ValueError, match=r'rho must be a finite number >= 0, got rho=-0.05'):
        create_optimizer_v2(model, 'samadamw', lr=0.1, rho=-0.05)


_DID_YOU_MEAN = "{family} got an unexpected keyword argument '{bad}': did you mean '{good}' ({whose})?"
_TYPOS = {  # (build it, with params and the typo) -> (family, bad, good, whose)
    'davda54 constructor, SAM setting': (lambda p: SAM(p, torch.optim.SGD, lr=0.1, rhoo=0.1),
                                         ('SAM', 'rhoo', 'rho', 'a SAM setting')),
    'davda54 constructor, base argument': (lambda p: SAM(p, torch.optim.SGD, lr=0.1, momentun=0.9),
                                           ('SAM', 'momentun', 'momentum', 'an argument of SGD')),
    'an instance wrapped': (lambda p: SAM(torch.optim.SGD(p, lr=0.1), adaptiv=True),
                            ('SAM', 'adaptiv', 'adaptive', 'a SAM setting')),
    'GSAM by hand': (lambda p: GSAM(p, torch.optim.SGD, lr=0.1, rho_mx=0.1),
                     ('GSAM', 'rho_mx', 'rho_max', 'a GSAM setting')),
    'combined name': (lambda p: create_optimizer_v2(p, 'samsgd', lr=0.1, rhoo=0.1),
                      ('SAM', 'rhoo', 'rho', 'a SAM setting')),
    'combined name, base argument': (lambda p: create_optimizer_v2(p, 'samadamw', lr=0.1, bettas=(0.9, 0.99)),
                                     ('SAM', 'bettas', 'betas', 'an argument of AdamW')),
    'lookahead_ prefix': (lambda p: create_optimizer_v2(p, 'lookahead_samsgd', lr=0.1, rhoo=0.1),
                          ('SAM', 'rhoo', 'rho', 'a SAM setting')),
    'bare name, base by name': (lambda p: create_optimizer_v2(p, 'sam', lr=0.1, base='sgd', rhoo=0.1),
                                ('SAM', 'rhoo', 'rho', 'a SAM setting')),
    'LookSAM name': (lambda p: create_optimizer_v2(p, 'looksamadamw', lr=0.1, intervl=3),
                     ('LookSAM', 'intervl', 'interval', 'a LookSAM setting')),
    'GSAM name given SAM\'s rho': (lambda p: create_optimizer_v2(p, 'gsamadamw', lr=0.1, rho=0.1),
                                   ('GSAM', 'rho', 'rho_max', 'a GSAM setting')),
}


@pytest.mark.parametrize('case', _TYPOS)
def test_a_mistyped_keyword_is_a_type_error_naming_the_closest_keyword(case):
    """``rhoo=0.1``: the TypeError it always was, in one line that names the keyword meant (a SAM setting or the
    base optimizer's argument), for SAM built by hand and by timm's factory alike."""
    build, (family, bad, good, whose) = _TYPOS[case]
    with pytest.raises(TypeError) as error:
        build(_model().parameters())
    assert str(error.value) == _DID_YOU_MEAN.format(family=family, bad=bad, good=good, whose=whose)


def test_a_keyword_like_none_it_takes_lists_what_it_takes():
    with pytest.raises(TypeError, match=r"^SAM got an unexpected keyword argument 'zzz': it is neither a SAM setting "
                                        r"\(rho, adaptive, .*, model\) nor an argument of SGD \(lr, momentum, .*\)$"):
        SAM(_model().parameters(), torch.optim.SGD, lr=0.1, zzz=1)
    with pytest.raises(ValueError, match=r'also base-optimizer arguments \(lr\)'):  # an instance takes none of them
        SAM(torch.optim.SGD(_model().parameters(), lr=0.1), lr=0.1)


@pytest.mark.parametrize('name', EXT_NAMES)
def test_registry_holds_optimizer_classes_and_binds_each_names_defaults(name):
    """As for timm's own optimizers: the class, or with bind_defaults a functools.partial of it with the name's
    defaults (its base and fixed arguments), which builds what the name stands for."""
    info = get_optimizer_info(name)
    cls = get_optimizer_class(name, bind_defaults=False)
    assert isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and issubclass(cls, SAM)
    bound = get_optimizer_class(name)
    assert isinstance(bound, functools.partial) and bound.func is cls and bound.args == ()
    assert bound.keywords == info.defaults and info.defaults['base'] in list_sam_bases()
    w, b = nn.Parameter(torch.randn(3, 6)), nn.Parameter(torch.zeros(3))
    opt = bound([w, b], lr=0.01)
    assert type(opt) is cls and repr(opt).startswith(f'{cls.family.Settings.family}(')  # 'SAM(', not 'FactorySAM('
    assert type(opt.base_optimizer) is get_optimizer_class(info.defaults['base'], bind_defaults=False)
    assert all(g['adaptive'] == name.startswith('asam') for g in opt.param_groups)


def test_each_combined_names_class_is_written_out_where_a_search_finds_it():
    """timm reads each name's class (its __init__ signature): ``SAMAdamW`` for ``samadamw`` is a name of
    sam_factory.py's source, that module's attribute, and the class the registry holds (so copies and pickles find
    it)."""
    from pathlib import Path

    from timm_ext.optim import sam_factory
    source = Path(sam_factory.__file__).read_text()
    combined = [n for n in EXT_NAMES if n not in ('sam', 'asam', 'gsam', 'looksam', 'wsam', 'friendlysam', 'samon',
                                                  'esam', 'msam')]
    assert len(combined) == 126  # 9 families x 14 bases
    for name in combined:
        cls = get_optimizer_class(name, bind_defaults=False)
        assert getattr(sam_factory, cls.__name__) is cls and re.search(rf'[ (]{cls.__name__}[,)]', source), name
        assert cls.__module__ == sam_factory.__name__ and cls.__qualname__ == cls.__name__
    assert get_optimizer_class('samadamw', bind_defaults=False) is sam_factory.SAMAdamW
    assert get_optimizer_class('looksamlion', bind_defaults=False) is sam_factory.LookSAMLion


def test_bare_names_build_on_adamw():
    """Without base=, the optimizer the ViT-SAM paper trained ViTs with; the common arguments timm's factory hands
    any optimizer (eps, betas, momentum) reach the base that takes them, as for the combined names."""
    assert DEFAULT_BASE == 'adamw'
    bare = {'sam': SAM, 'asam': SAM, 'gsam': GSAM, 'looksam': LookSAM}
    assert set(bare) <= set(EXT_NAMES)
    for name, family in bare.items():
        w, b = nn.Parameter(torch.randn(3, 6)), nn.Parameter(torch.zeros(3))
        opt = create_optimizer_v2([w, b], name, lr=0.01, eps=1e-6, betas=(0.5, 0.6), momentum=0.5)
        assert isinstance(opt, family), name
        assert type(opt.base_optimizer) is torch.optim.AdamW, name
        group = opt.param_groups[0]
        assert (group['betas'], group['eps'], group['lr']) == ((0.5, 0.6), 1e-6, 0.01), name
        assert 'momentum' not in group  # AdamW takes none: dropped, as timm's factory drops it for AdamW itself
        sgd = create_optimizer_v2([w, b], name, lr=0.01, base='sgd', eps=1e-6, betas=(0.5, 0.6), momentum=0.5)
        assert (sgd.param_groups[0]['momentum'], sgd.param_groups[0]['nesterov']) == (0.5, True), name
    assert create_optimizer_v2([nn.Parameter(torch.zeros(2))], 'asam', lr=0.01).param_groups[0]['rho'] == ASAM_RHO


@pytest.mark.parametrize('name', EXT_NAMES)
def test_each_class_declares_what_timms_factory_hands_it(name):
    """timm's registry-wide check: has_eps / has_betas / has_momentum say whether the class's signature takes them
    (the combined names list their base optimizer's arguments)."""
    info = get_optimizer_info(name)
    takes = inspect.signature(get_optimizer_class(name, bind_defaults=False).__init__).parameters
    assert (info.has_eps, info.has_betas, info.has_momentum) == ('eps' in takes, 'betas' in takes, 'momentum' in takes)


@pytest.mark.parametrize('prefix', ['sam', 'asam', 'gsam', 'looksam'])
def test_adopt_names_take_betas_where_timms_adopt_gets_them(prefix):
    """Release-aware, because timm's registry differs: timm 1.0.23 ... 1.0.28 register ``adopt`` without betas
    (``has_betas=False``, so their factory drops a ``betas=`` given for it, though ``Adopt`` takes them); timm 1.0.31
    registers it with betas. ``<prefix>adopt`` declares and takes exactly what that release's factory hands ``adopt``,
    and its base gets the betas timm's own ``adopt`` gets from the same call."""
    adopt = get_optimizer_info('adopt')
    named = get_optimizer_class(prefix + 'adopt', bind_defaults=False)
    assert get_optimizer_info(prefix + 'adopt').has_betas is adopt.has_betas
    assert ('betas' in inspect.signature(named.__init__).parameters) is adopt.has_betas
    params = [nn.Parameter(torch.zeros(3))]
    built = create_optimizer_v2(params, prefix + 'adopt', lr=0.01, betas=(0.5, 0.6))
    plain = create_optimizer_v2([nn.Parameter(torch.zeros(3))], 'adopt', lr=0.01, betas=(0.5, 0.6))
    assert built.base_optimizer.param_groups[0]['betas'] == plain.param_groups[0]['betas']
    assert (plain.param_groups[0]['betas'] == (0.5, 0.6)) is adopt.has_betas
    if not adopt.has_betas:  # given to the class itself: refused, not silently dropped
        with pytest.raises(TypeError, match='betas'):
            named(params, lr=0.01, betas=(0.5, 0.6))


def test_sam_bases_cover_timm_optimizers():
    bases = list_sam_bases()
    assert {'sgd', 'momentum', 'nesterov', 'adam', 'adamw', 'lamb', 'cadamw', 'muon'} <= set(bases)
    assert 'adahessian' not in bases and not any(n.startswith(('sam', 'asam')) for n in bases)


@pytest.mark.parametrize('base', [b for b in list_sam_bases() if not b.startswith(('fused', 'bnb'))])  # CUDA-only
def test_any_timm_base_steps_under_sam(base, eager_kron):
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
