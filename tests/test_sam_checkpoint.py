"""timm_ext.optim.sam_checkpoint: a state dict saved by another base optimizer is refused in one line before anything
loads (torch stopped half loaded with ``KeyError: 'step'``), and every timm optimizer's own state dict still loads
into SAM over that optimizer (the probe of what a base optimizer keeps refuses no genuine resume)."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2, get_optimizer_info, list_optimizers

from timm_ext.optim import SAM
from timm_ext.optim.base_optimizer import WrappedOptimizer


def _model() -> nn.Module:
    """Linear layers and a norm: 2-D and 1-D parameters, one dim of 40 (optimizers that factor large dims)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 24), nn.LayerNorm(24), nn.Linear(24, 3))


def _stepped(model: nn.Module, optimizer: torch.optim.Optimizer, create_graph: bool = False) -> dict:
    """The optimizer's state dict after one step on a fixed batch."""
    x = torch.randn(8, 40, generator=torch.Generator().manual_seed(1))
    model(x).square().mean().backward(create_graph=create_graph)
    optimizer.step()
    return optimizer.state_dict()


def _same(a, b) -> bool:
    """Equal state dicts: tensors by value, the rest by ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_sgd_state_into_sam_over_adamw_is_refused_before_anything_loads():
    model = _model()
    saved = _stepped(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    for sam in (SAM(model.parameters(), torch.optim.AdamW, lr=1e-3),
                SAM(torch.optim.AdamW(model.parameters(), lr=1e-3), rho=0.1)):
        _stepped(model, sam.base_optimizer)  # a state of its own, which the refusal must keep
        before = copy.deepcopy(sam.state_dict())
        with pytest.raises(ValueError) as refused:
            sam.load_state_dict(saved)
        assert str(refused.value) == (
            "SAM cannot load this state dict: its per-parameter state has momentum_buffer, AdamW's needs step, "
            "exp_avg, exp_avg_sq: it was saved by another base optimizer; wrap that one, or load the model's "
            "weights only and start the optimizer fresh")
        assert _same(sam.state_dict(), before)
        assert sam.param_groups[0]['betas'] == (0.9, 0.999) and 'momentum' not in sam.param_groups[0]


def test_adamw_state_into_sam_over_sgd_with_momentum_is_refused():
    """The other way torch said nothing: SGD found no momentum_buffer and would start its momentum from zero (and
    then stop on the loaded groups, which have no 'momentum')."""
    model = _model()
    saved = _stepped(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    sam = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"^SAM cannot load this state dict: its per-parameter state has step, "
                                         r"exp_avg, exp_avg_sq, SGD's needs momentum_buffer: it was saved by another "
                                         r"base optimizer; "):
        sam.load_state_dict(saved)
    assert sam.state_dict()['state'] == {} and sam.param_groups[0]['momentum'] == 0.9


def test_the_loaded_groups_hyperparameters_decide_what_the_state_needs():
    """Adam's amsgrad comes with the loaded groups (torch's load replaces them): a state without max_exp_avg_sq
    loads into an Adam built with amsgrad, and steps."""
    model = _model()
    saved = _stepped(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    sam = SAM(model.parameters(), torch.optim.Adam, lr=1e-3, amsgrad=True)
    sam.load_state_dict(saved)
    assert sam.param_groups[0]['amsgrad'] is False
    _stepped(model, sam.base_optimizer)
    assert int(sam.state[model[0].weight]['step']) == 2


_TIMM_OPTIMIZERS = [name for name in list_optimizers() if not isinstance(get_optimizer_info(name).opt_class, str)
                    and not issubclass(get_optimizer_info(name).opt_class, WrappedOptimizer)]  # SAM's, MESA


@pytest.mark.parametrize('name', _TIMM_OPTIMIZERS)
def test_every_timm_optimizers_own_state_loads_into_sam_over_it(name, eager_kron):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        model = _model()
        saved = _stepped(model, create_optimizer_v2(model, name, lr=1e-2), create_graph=name == 'adahessian')
        sam = SAM(create_optimizer_v2(_model(), name, lr=1e-2))
        sam.load_state_dict(saved)
    assert {k: sorted(v) for k, v in sam.state_dict()['state'].items()} == {
        k: sorted(v) for k, v in saved['state'].items()}


def test_the_probe_leaves_a_step_count_kept_in_the_group_alone():
    """timm's Lamb keeps its step count in the param group, as a tensor it adds to in place: the probe of Lamb's
    state keys steps a copy, so the loaded state dict, and the run resumed from it, keep the saved count (timm's own
    test_optim.py round trip of samlamb caught the shared tensor)."""
    model = _model()
    sam = create_optimizer_v2(model, 'samlamb', lr=1e-3, rho=0.05)
    x = torch.randn(8, 40, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        sam.step(lambda: (sam.zero_grad(), model(x).square().mean().backward())[0])
    saved = copy.deepcopy(sam.state_dict())
    count = copy.deepcopy(saved['param_groups'][0]['step'])  # a tensor in timm >= 1.0.24's Lamb, an int before
    copied = copy.deepcopy(model)
    resumed = create_optimizer_v2(copied, 'samlamb', lr=1e-3, rho=0.05)
    resumed.load_state_dict(saved)
    assert torch.equal(torch.as_tensor(saved['param_groups'][0]['step']), torch.as_tensor(count)) and int(count) == 2
    assert int(resumed.param_groups[0]['step']) == int(sam.param_groups[0]['step']) == 2
    sam.step(lambda: (sam.zero_grad(), model(x).square().mean().backward())[0])
    resumed.step(lambda: (resumed.zero_grad(), copied(x).square().mean().backward())[0])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), copied.parameters()))
