"""GC-SAM (``use_gc=True`` on every SAM-family optimizer): the first-pass gradient centralized before the
perturbation, against the paper's update written out (Hassan et al., arXiv 2501.11584: e = rho g_GC / ||g_GC||),
against pytorch_optimizer's ``SAM(use_gc=True)`` (which divides by the norm of g before centralizing: the same
direction, a radius shrunk by ||g_GC|| / ||g||), through timm's factory and every family, and bad input."""
import copy

import pytest
import torch
from _sam_reference import at as _at
from _sam_reference import batches as _batches
from _sam_reference import closure as _closure
from _sam_reference import drive, sgd_reference
from _sam_reference import flat as _flat
from _sam_reference import grad as _grad
from _sam_reference import mlp as _mlp
from timm.optim import create_optimizer_v2

from timm_ext.optim import GSAM, SAM, WSAM, FriendlySAM, LookSAM
from timm_ext.optim.sam_functional import centralize_gradients_

pytestmark = pytest.mark.filterwarnings('ignore:SAM does not know the model')


def _centralized(model, g):
    """g (flat) with each weight matrix's rows at mean 0, the biases as they are."""
    out, offset = [], 0
    for p in model.parameters():
        part = g[offset:offset + p.numel()].view_as(p)
        out.append((part - part.mean(dim=tuple(range(1, p.dim())), keepdim=True) if p.dim() > 1 else part).reshape(-1))
        offset += p.numel()
    return torch.cat(out)


def test_centralize_gradients_removes_each_output_channels_mean_of_matrices_and_kernels_only():
    g = [torch.randn(4, 3), torch.randn(5, 2, 3, 3), torch.randn(7)]
    before = [t.clone() for t in g]
    centralize_gradients_(g)
    assert torch.allclose(g[0].mean(dim=1), torch.zeros(4), atol=1e-6)
    assert torch.allclose(g[1].mean(dim=(1, 2, 3)), torch.zeros(5), atol=1e-6)
    torch.testing.assert_close(g[2], before[2])  # a bias is left alone
    torch.testing.assert_close(g[0] - before[0], (-before[0].mean(dim=1, keepdim=True)).expand(4, 3))


@pytest.mark.parametrize('route', ['closure', 'explicit', 'task'])
def test_equals_the_papers_update_over_several_steps(route):
    base, data = _mlp(), _batches(4)

    def direction(model, t, xy):
        g = _centralized(model, _grad(model, *xy))
        return _grad(_at(model, _flat(model.parameters()).detach() + 0.2 * g / g.norm()), *xy)

    expected = sgd_reference(base, data, direction, lr=0.1)
    model = copy.deepcopy(base)
    drive(model, SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.2, use_gc=True), data, route)
    torch.testing.assert_close(_flat(model.parameters()).detach(), expected)
    plain = copy.deepcopy(base)
    drive(plain, SAM(torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9), rho=0.2), data, route)
    assert (_flat(plain.parameters()) - _flat(model.parameters())).abs().max() > 1e-4  # GC really changes it


def test_pytorch_optimizer_takes_the_same_direction_at_a_radius_shrunk_by_the_centralized_norm():
    po = pytest.importorskip('pytorch_optimizer', reason='pytorch_optimizer is the test-only reference')
    base, (x, y) = _mlp(), _batches(1)[0]
    g = _grad(base, x, y)
    shrink = (_centralized(base, g).norm() / g.norm()).item()
    assert shrink < 0.99  # centralizing really shortens this gradient
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    opt = SAM(ours.parameters(), torch.optim.SGD, rho=0.2 * shrink, use_gc=True, lr=0.1)
    opt.step(_closure(ours, opt, x, y))
    reference = po.SAM(theirs.parameters(), torch.optim.SGD, rho=0.2, use_gc=True, lr=0.1)
    step = _closure(theirs, reference, x, y)
    step()  # its step() wants the gradient at w first
    reference.step(step)
    torch.testing.assert_close(_flat(ours.parameters()), _flat(theirs.parameters()))


@pytest.mark.timm_free
@pytest.mark.parametrize('family', [SAM, GSAM, LookSAM, WSAM, FriendlySAM])
def test_every_family_takes_it_and_keeps_it_in_its_state_dict(family):
    model, (x, y) = _mlp(), _batches(1)[0]
    opt = family(torch.optim.SGD(model.parameters(), lr=0.1), use_gc=True)
    opt.step(_closure(model, opt, x, y))
    again = family(torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.1))
    again.load_state_dict(opt.state_dict())
    assert opt.settings.use_gc is True and again.settings.use_gc is True


def test_through_timms_factory_and_in_davda54s_constructor_form():
    model = _mlp()
    assert create_optimizer_v2(model, 'samadamw', lr=0.1, use_gc=True).settings.use_gc is True
    assert create_optimizer_v2(model, 'gsamsgd', lr=0.1, use_gc=True).settings.use_gc is True
    # the form code written for davda54/sam or pytorch_optimizer uses: no TypeError from the base optimizer
    assert SAM(model.parameters(), torch.optim.SGD, use_gc=True, lr=0.1).settings.use_gc is True
    with pytest.raises(ValueError, match=r"^SAM use_gc must be True or False, got use_gc='yes'$"):
        SAM(torch.optim.SGD(model.parameters(), lr=0.1), use_gc='yes')
