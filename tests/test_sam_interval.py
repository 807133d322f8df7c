"""interval=k: a SAM step every k-th update and plain base steps in between (Composer's scheme), in every
route (closure, explicit with sam_step_due, train.py's task replay, which is skipped on plain steps), with
fp16 on both GradScaler contracts, clipping, resume, the factory, and bad input."""
import copy
import inspect

import pytest
import torch
import torch.nn.functional as F
from _sam_reference import at as _at
from _sam_reference import batches as _batches
from _sam_reference import closure as _closure
from _sam_reference import drive, train_py_fp16
from _sam_reference import flat as _flat
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2

from timm_ext.optim import GSAM, SAM, LookSAM, replay_timm_task

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')


def _reference(model, batches, k, rho, lr, momentum=0.9, clip=None):
    """SAM's gradient on steps 0, k, 2k, ...; the plain gradient otherwise; optional norm clip; SGD."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for t, (x, y) in enumerate(batches):
        params = list(model.parameters())
        g = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        if t % k == 0:
            gf = _flat(g)
            at_e = _at(model, _flat(params).detach() + rho * gf / gf.norm())
            g = torch.autograd.grad(F.cross_entropy(at_e(x), y), list(at_e.parameters()))
        for p, gi in zip(params, g):
            p.grad = gi.clone()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad()
    return _flat(model.parameters()).detach()


@pytest.mark.parametrize('route', ['closure', 'explicit', 'task'])
def test_sam_every_kth_step_plain_steps_between(route):
    base = _mlp()
    batches = _batches(5)
    expected = _reference(base, batches, k=3, rho=0.3, lr=0.2)
    model = copy.deepcopy(base)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho=0.3, interval=3)
    forwards = []
    model.register_forward_hook(lambda m, i, o: forwards.append(1))
    due = []
    if route == 'task':
        replay_timm_task(opt)  # as train.py's hooks do: the replay takes the first task called (one per batch here)
    for xy in batches:
        due.append(opt.sam_step_due)
        drive(model, opt, [xy], route)  # explicit: a plain step() when no SAM step is due
    assert due == [True, False, False, True, False]
    assert len(forwards) == 7  # the second pass only on steps 0 and 3
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


def test_plain_steps_are_clipped_like_sam_steps():
    base = _mlp()
    batches = _batches(3)
    expected = _reference(base, batches, k=2, rho=0.3, lr=0.2, clip=0.05)
    model = copy.deepcopy(base)
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho=0.3, interval=2, clip_grad=0.05)
    for x, y in batches:
        opt.step(_closure(model, opt, x, y))
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)


@pytest.mark.filterwarnings('ignore:GradScaler is going to stop passing itself:FutureWarning')
@pytest.mark.parametrize('contract', ['argument', 'attributes'])
@pytest.mark.parametrize('train_clip', [None, 100.0])  # train.py unscales before its own clip, or SAM does
def test_fp16_plain_steps_unscale_and_skip_overflow(contract, train_clip):
    class AttributeContractSAM(SAM):
        def step(self, closure=None):
            return inspect.unwrap(SAM.step)(self, closure)  # torch's step wrapper runs once, for this class

    cls = SAM if contract == 'argument' else AttributeContractSAM
    base = _mlp()
    batches = _batches(4)
    expected = _reference(base, batches, k=2, rho=0.3, lr=0.2)
    model = copy.deepcopy(base)
    opt = cls(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho=0.3, interval=2)
    replay_timm_task(opt)  # train.py's hooks: the replay takes the task train_py_fp16 builds
    task, scaler = train_py_fp16(model, opt, batches, clip_grad=train_clip)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)
    assert scaler._scaler.get_scale() == 2.0 ** 10
    opt.step(_closure(model, opt, *batches[0]))  # step 4: SAM; step 5 is plain
    assert not opt.sam_step_due
    w = [p.detach().clone() for p in model.parameters()]
    scaler(task(*batches[0])['loss'] * float('inf'), opt, clip_grad=train_clip, parameters=model.parameters())
    assert all(torch.equal(a, p) for a, p in zip(w, model.parameters()))  # overflowed plain step: skipped
    assert scaler._scaler.get_scale() == 2.0 ** 9


@pytest.mark.timm_free
def test_resume_continues_the_interval_phase():
    batches = _batches(5)

    def run(model, opt, part):
        for x, y in part:
            opt.step(_closure(model, opt, x, y))

    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho=0.3, interval=3)
    run(model, opt, batches)
    uninterrupted = _flat(model.parameters()).detach()
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rho=0.3, interval=3)
    run(model, opt, batches[:2])
    sd = copy.deepcopy(opt.state_dict())
    resumed = copy.deepcopy(model)
    opt2 = SAM(torch.optim.SGD(resumed.parameters(), lr=0.2, momentum=0.9), rho=0.3)
    opt2.load_state_dict(sd)
    assert (opt2.settings.interval, opt2.state_dict()['sam']['step'], opt2.sam_step_due) == (3, 2, False)
    run(resumed, opt2, batches[2:])
    assert torch.equal(_flat(resumed.parameters()).detach(), uninterrupted)


def test_state_dict_of_an_older_version_without_interval_loads():
    model = _mlp()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), interval=4)
    sd = copy.deepcopy(opt.state_dict())
    sd['sam'] = {'clip_grad': None, 'clip_mode': 'norm'}  # what SAM saved before interval existed
    opt.load_state_dict(sd)
    assert (opt.settings.interval, opt.state_dict()['sam']['step']) == (4, 0)


def test_every_family_takes_interval_from_the_factory():
    model = _mlp()
    for name, cls in (('samadamw', SAM), ('asamsgd', SAM), ('gsamadamw', GSAM), ('looksamlamb', LookSAM)):
        opt = create_optimizer_v2(model, name, lr=0.01, interval=4)
        assert isinstance(opt, cls) and opt.settings.interval == 4, name


@pytest.mark.parametrize('bad', [0, -1, 1.5, True, None])
def test_bad_interval(bad):
    with pytest.raises(ValueError, match=rf'SAM interval must be an integer >= 1 .*got interval={bad!r}'):
        SAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), interval=bad)


def test_loaded_bad_interval_is_refused_before_loading():
    opt = SAM(torch.optim.SGD(_mlp().parameters(), lr=0.1), interval=2)
    sd = copy.deepcopy(opt.state_dict())
    sd['sam']['interval'] = 0
    with pytest.raises(ValueError, match=r'got interval=0 in the loaded state dict'):
        opt.load_state_dict(sd)
    assert opt.settings.interval == 2
