"""timm_ext.optim.base_optimizer: SAM refuses at construction a base optimizer whose step needs a closure (LBFGS
failed at the first step with torch's TypeError), and no optimizer of timm's factory is refused."""
import pytest
import torch
import torch.nn as nn
from timm.optim import get_optimizer_info, list_optimizers

from timm_ext.optim import SAM
from timm_ext.optim.base_optimizer import check_steps_alone

LBFGS_REFUSED = ("SAM cannot wrap LBFGS: its step(closure) needs a closure that re-evaluates the loss many times per "
                 "step, and SAM's base optimizer must take one step from the gradient at hand; wrap an optimizer whose "
                 "closure is optional (torch.optim.SGD, AdamW, or any of timm's)")


def test_lbfgs_is_refused_at_construction_as_a_class_or_an_instance():
    model = nn.Linear(3, 2)
    for build in (lambda: SAM(model.parameters(), torch.optim.LBFGS, lr=0.1),
                  lambda: SAM(torch.optim.LBFGS(model.parameters(), lr=0.1), rho=0.05)):
        with pytest.raises(ValueError) as refused:
            build()
        assert str(refused.value) == LBFGS_REFUSED


def test_any_step_with_a_required_argument_is_refused_by_its_signature():
    class LineSearch(torch.optim.SGD):
        def step(self, loss_fn, closure=None):
            return super().step(closure)

    with pytest.raises(ValueError, match=r'^GSAM cannot wrap LineSearch: its step\(loss_fn\) needs a closure'):
        check_steps_alone(LineSearch, 'GSAM')


def test_no_optimizer_of_timms_factory_is_refused():
    classes = {get_optimizer_info(name).opt_class for name in list_optimizers()}
    checked = [c for c in classes if isinstance(c, type)]  # apex's and bitsandbytes' are named by a string
    for optimizer_class in checked:
        check_steps_alone(optimizer_class)
    assert len(checked) > 50 and torch.optim.SGD in checked and torch.optim.AdamW in checked
