"""The SAM family's settings declarations: signatures, checks, state dict, pickling, repr and change logging all
follow from one dataclass field and its argument in the hand-written signature, and ``sam_opt_kwargs`` lists
what a plain optimizer does not take."""
import dataclasses
import inspect
import logging
import pickle
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
from timm.optim import get_optimizer_class

from timm_ext.optim import (
    ESAM,
    GSAM,
    SAM,
    SAMON,
    WSAM,
    FactoryESAM,
    FactoryFriendlySAM,
    FactoryGSAM,
    FactoryLookSAM,
    FactoryMomentumSAM,
    FactorySAM,
    FactorySAMON,
    FactoryWSAM,
    FriendlySAM,
    GSAMSettings,
    LookSAM,
    LookSAMSettings,
    MomentumSAM,
    SAMSettings,
    sam_opt_kwargs,
)
from timm_ext.optim.sam_settings import setting

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')


def _check_beta(beta):
    if not 0 < beta < 1:
        raise ValueError(f'SAM beta must be in (0, 1), got beta={beta!r}')


@dataclass(frozen=True)
class _BetaSettings(SAMSettings):
    beta: float = setting(0.5, _check_beta)


class _BetaSAM(SAM):
    """A family with one more setting: its field, and the argument in its signature."""
    Settings = _BetaSettings

    def __init__(self, params, base_optimizer=None, beta=0.5, **kwargs):
        super().__init__(params, base_optimizer, beta=beta, **kwargs)


def _params(opt):
    return list(inspect.signature(opt).parameters)


def test_sam_opt_kwargs_lists_every_family_setting_and_base():
    assert sam_opt_kwargs() == ('base', 'rho', 'adaptive', 'eta', 'clip_grad', 'clip_mode', 'interval', 'm_sharpness',
                                'use_gc', 'rho_max', 'rho_min', 'alpha', 'lr_max', 'lr_min', 'gamma', 'decouple',
                                'sigma', 'lmbda', 'only_norm', 'weight_fraction', 'data_fraction', 'seed',
                                'num_data', 's_init', 'damping')
    base_takes = set(inspect.signature(torch.optim.AdamW).parameters)
    assert not base_takes & set(sam_opt_kwargs())


def test_signatures_follow_the_declarations():
    assert _params(SAM) == ['params', 'base_optimizer', 'rho', 'adaptive', 'eta', 'clip_grad', 'clip_mode', 'model',
                            'interval', 'm_sharpness', 'use_gc', 'base_kwargs']
    assert _params(GSAM)[2:7] == ['rho_max', 'rho_min', 'alpha', 'lr_max', 'lr_min'] and 'rho' not in _params(GSAM)
    assert _params(LookSAM)[2:5] == ['rho', 'alpha', 'interval']
    assert inspect.signature(LookSAM).parameters['interval'].default == 5
    assert _params(WSAM)[2:5] == ['rho', 'gamma', 'decouple'] and _params(FriendlySAM)[2:5] == ['rho', 'sigma', 'lmbda']
    for create, family in ((FactorySAM, SAM), (FactoryGSAM, GSAM), (FactoryLookSAM, LookSAM), (FactoryWSAM, WSAM),
                           (FactoryFriendlySAM, FriendlySAM), (FactorySAMON, SAMON), (FactoryESAM, ESAM),
                           (FactoryMomentumSAM, MomentumSAM)):
        # a bare name's class: the family's arguments, the three timm's factory hands any optimizer, then the rest
        assert _params(create) == ['params', 'base'] + _params(family)[2:-1] + ['eps', 'betas', 'momentum',
                                                                                'base_kwargs']
    samadamw = get_optimizer_class('samadamw', bind_defaults=False)  # a combined name's: its base's arguments
    assert _params(samadamw) == ['params', 'base'] + _params(SAM)[2:-1] + [
        p for p in _params(torch.optim.AdamW) if p != 'params']
    assert inspect.signature(FactorySAM).parameters['rho'].default is None  # 0.05, or 0.5 for ASAM
    positional = GSAM(nn.Linear(2, 2).parameters(), torch.optim.SGD, 0.2, 0.1, 0.3, lr=0.1)
    settings = positional.settings
    assert (settings.rho_max, settings.rho_min, settings.alpha, settings.lr_max) == (0.2, 0.1, 0.3, 0.1)
    with pytest.raises(TypeError, match=r'^GSAM got rho=0.1: its radius is scheduled between rho_min and rho_max'):
        GSAM(nn.Linear(2, 2).parameters(), torch.optim.SGD, rho=0.1, lr=0.1)


# a valid value other than the default for every setting of every family
_NON_DEFAULT = dict(rho=0.07, adaptive=True, eta=0.02, clip_grad=1.5, clip_mode='value', interval=2, m_sharpness=4,
                    use_gc=True, rho_max=0.08, rho_min=0.03, alpha=0.3, lr_max=0.5, lr_min=0.001, gamma=0.6,
                    decouple=False, sigma=0.5, lmbda=0.7, only_norm=False, weight_fraction=0.25, data_fraction=0.75,
                    seed=7)


@pytest.mark.filterwarnings('ignore:Momentum-SAM was not given the model')
@pytest.mark.parametrize('family', [SAM, GSAM, LookSAM, WSAM, FriendlySAM, SAMON, ESAM, MomentumSAM])
def test_each_hand_written_signature_takes_every_setting_with_its_declared_default(family):
    """The signature is written by hand (help() and an IDE show it); this is what keeps it and the fields agreeing."""
    signature = inspect.signature(family).parameters
    fields = {f.name: f.default for f in dataclasses.fields(family.Settings) if f.init}
    assert set(signature) == {'params', 'base_optimizer', 'model', 'base_kwargs'} | set(fields)
    declared = {name: signature[name].default for name in fields}
    if family is SAM:  # eta=None: the field's 0.01, or davda54/sam's 0 in its constructor form (test_left_gradients)
        assert declared['eta'] is None
        declared['eta'] = fields['eta']
    assert declared == fields
    assert inspect.getsource(family.__init__).count('**base_kwargs') >= 2  # the hand-written one, not generated
    given = {name: _NON_DEFAULT[name] for name in fields}  # a new setting needs a value here: this test says so
    if family is ESAM:  # its sample selection and m-sharpness exclude each other
        given['m_sharpness'] = None
    base = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)  # Momentum-SAM needs a momentum
    settings = family(base, **given).settings
    assert {name: getattr(settings, name) for name in fields} == given  # each argument reaches its setting


def test_a_new_setting_needs_its_field_and_its_argument_and_reaches_everything(caplog):
    model = nn.Linear(3, 2)
    assert 'beta' in _params(_BetaSAM)
    with pytest.raises(ValueError, match=r'^SAM beta must be in \(0, 1\), got beta=2$'):
        _BetaSAM(torch.optim.SGD(model.parameters(), lr=0.1), beta=2)
    opt = _BetaSAM(torch.optim.SGD(model.parameters(), lr=0.1), beta=0.7)
    assert opt.settings.beta == 0.7 and repr(opt).endswith('interval=1, m_sharpness=None, use_gc=False, beta=0.7)')
    assert 'beta' not in opt.base_optimizer.defaults  # a setting, not a base-optimizer argument
    sd = opt.state_dict()
    assert sd['sam']['beta'] == 0.7
    assert pickle.loads(pickle.dumps(opt)).settings.beta == 0.7
    fresh = _BetaSAM(torch.optim.SGD(model.parameters(), lr=0.1))
    with caplog.at_level(logging.WARNING, logger='timm_ext.optim.sam'):
        fresh.load_state_dict(sd)
    assert fresh.settings.beta == 0.7 and 'beta: 0.5 -> 0.7' in caplog.text
    sd['sam']['beta'] = 1.5
    with pytest.raises(ValueError, match=r'^SAM beta must be in \(0, 1\), got beta=1.5 in the loaded state dict$'):
        fresh.load_state_dict(sd)


def test_replacing_the_settings_checks_them_and_takes_effect():
    opt = SAM(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
    opt.settings = opt.settings.replace(interval=3)
    assert opt.state_dict()['sam']['interval'] == 3 and not hasattr(opt, 'interval')
    with pytest.raises(ValueError, match=r'SAM interval must be an integer >= 1 .*got interval=0$'):
        opt.settings = opt.settings.replace(interval=0)
    assert opt.settings.interval == 3


def test_settings_are_frozen_and_checked():
    settings = LookSAMSettings()
    assert (settings.rho, settings.alpha, settings.interval) == (0.05, 0.7, 5)
    with pytest.raises(AttributeError):
        settings.rho = 0.1
    assert GSAMSettings(rho_max=0.1).group_defaults() == {'rho': 0.1, 'adaptive': False, 'eta': 0.01}
    with pytest.raises(ValueError, match=r'^GSAM rho_min must be <= rho_max, got rho_min=0.5 > rho_max=0.04$'):
        GSAMSettings(rho_min=0.5)
    assert SAMSettings(adaptive=1).adaptive is True
    with pytest.raises(ValueError, match=r"^SAM adaptive must be True or False, got adaptive='false'$"):
        SAMSettings(adaptive='false')  # bool('false') is True: ASAM would be on


def test_problems_are_the_constructors_errors_every_bad_setting_at_once():
    """The pre-flight of opt_kwargs: each bad setting its own line, in the words the constructor raises it."""
    assert SAMSettings.problems(rho=0.1, interval=2) == []
    assert SAMSettings.problems(rho=-1, eta=-1) == ['SAM rho must be a finite number >= 0, got rho=-1',
                                                    'SAM eta must be >= 0, got eta=-1']
    for values in ({'rho_min': 0.5}, {'lr_max': 0.1, 'lr_min': 0.2}, {'rho_max': -1}):  # across settings, and one
        with pytest.raises(ValueError) as raised:
            GSAMSettings(**values)
        assert GSAMSettings.problems(**values) == [str(raised.value)]
