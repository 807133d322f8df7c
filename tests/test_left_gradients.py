"""SAM.step(closure) in both closure conventions: the loops davda54/sam's and pytorch-optimizer's users already write
(docs/sam.md, 'Coming from davda54/sam or pytorch-optimizer', run here block by block as written) against SAM written
out from the algorithm in torch, and against ``pytorch_optimizer.SAM`` run through the same loop; torch's convention
beside them; and the one-line refusal of gradients that neither convention can use."""
import copy
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import batches, flat, mlp

from timm_ext.optim import GSAM, SAM
from timm_ext.optim.left_gradients import CONVENTIONS

pytorch_optimizer = pytest.importorskip('pytorch_optimizer', reason='pytorch_optimizer is in the test extra')

DOC = Path(__file__).resolve().parents[1] / 'docs' / 'sam.md'
SECTION = 'Coming from davda54/sam or pytorch-optimizer'
RELATIVE_L2 = 1e-5  # the bar; measured: 0 to 6e-8


def _doc_blocks() -> Dict[str, List[str]]:
    """The section's ```python blocks, per source: davda54/sam's and pytorch-optimizer's (each starts with its
    constructor block, then its loops)."""
    text = DOC.read_text()
    section = text[text.index(f'## {SECTION}'):]
    section = section[:section.index('\n## ', 3)]
    out: Dict[str, List[str]] = {}
    for source, body in re.findall(r'\*\*(davda54/sam|pytorch-optimizer)\*\*(.*?)(?=\*\*(?:davda54|pytorch)|\Z)',
                                   section, flags=re.S):
        out[source] = re.findall(r'^```python\n(.*?)^```$', body, flags=re.M | re.S)
    return out


# ---- what the loops call that is the user's own -----------------------------------------------------------

def loss_function(output: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor:
    """davda54/sam's README calls ``loss_function(target, prediction)``."""
    return F.cross_entropy(prediction, output)


def smooth_crossentropy(prediction: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Per-example label-smoothed cross-entropy, as davda54/sam's example/train.py takes ``.mean()`` of."""
    return F.cross_entropy(prediction, gold, reduction='none', label_smoothing=0.1)


def disable_running_stats(model: nn.Module) -> None:
    """BatchNorm momentum 0 for the second pass (the running statistics stay put), the old one kept."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.backup_momentum, m.momentum = m.momentum, 0


def enable_running_stats(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and hasattr(m, 'backup_momentum'):
            m.momentum = m.backup_momentum


def _run(blocks: List[str], loop: int, model: nn.Module, sam_class: type = SAM) -> nn.Module:
    """The constructor block, then loop block ``loop``, as written, with ``SAM`` as ``sam_class``."""
    names = dict(torch=torch, model=model, data=batches(4), loss_function=loss_function, loss_fn=F.cross_entropy,
                 smooth_crossentropy=smooth_crossentropy, enable_running_stats=enable_running_stats,
                 disable_running_stats=disable_running_stats)
    constructor = blocks[0]
    if sam_class is not SAM:
        constructor = constructor.replace('from timm_ext.optim import SAM', '')
        names['SAM'] = sam_class
    exec(constructor, names)  # noqa: S102 - the documentation's own text
    exec(blocks[loop], names)  # noqa: S102
    return model


# ---- SAM from the algorithm (torch only) ---------------------------------------------------------------------

def reference(model: nn.Module, base: Callable, loss: Callable, rho: float = 0.05, steps: int = 4,
              bn_first_pass_only: bool = False, eta: Optional[float] = None) -> nn.Module:
    """g at w, e = rho g / ||g|| (ASAM with ``eta``: T = |w| + eta, e = rho T^2 g / ||T g||), h at w + e, then the
    base optimizer's step from w with h; ``bn_first_pass_only``: the running statistics the second pass moved put
    back (``num_batches_tracked`` still counts it, as BatchNorm with momentum 0 does)."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    opt = base(params)
    for x, y in batches(steps):
        g = flat(torch.autograd.grad(loss(model(x), y), params))
        w = flat(params).detach().clone()
        t = torch.ones_like(w) if eta is None else w.abs() + eta
        e = rho * t * t * g / (t * g).norm()
        stats = {k: v.clone() for k, v in model.state_dict().items() if 'running' in k}
        torch.nn.utils.vector_to_parameters(w + e, params)
        h = torch.autograd.grad(loss(model(x), y), params)
        torch.nn.utils.vector_to_parameters(w, params)
        if bn_first_pass_only:
            model.load_state_dict(stats, strict=False)
        for p, hp in zip(params, h):
            p.grad = hp.clone()
        opt.step()
        opt.zero_grad()
    return model


def _ce(prediction, target):
    return F.cross_entropy(prediction, target)


def _smooth(prediction, target):
    return smooth_crossentropy(prediction, target).mean()


def relative_l2(model: nn.Module, ref: nn.Module) -> float:
    """||a - b|| / ||b|| over the weights and the floating-point buffers (BatchNorm's running statistics)."""
    def values(m):
        return flat([v for v in m.state_dict().values() if v.is_floating_point()]).double()
    a, b = values(model), values(ref)
    return float((a - b).norm() / b.norm())


def _SGD(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _ADAMW(params):
    return torch.optim.AdamW(params, lr=1e-3)


# (source, loop index, BatchNorm in the model, the reference's base optimizer and loss, BN as in the loop)
LOOPS = {
    'davda54 README, two steps': ('davda54/sam', 1, False, _SGD, _ce, False),
    'davda54 README, closure': ('davda54/sam', 2, False, _SGD, _ce, False),
    'davda54 example/train.py, BatchNorm': ('davda54/sam', 3, True, _SGD, _smooth, True),
    'pytorch-optimizer docstring': ('pytorch-optimizer', 1, False, _ADAMW, _ce, False),
}


def test_the_section_has_every_loop():
    blocks = _doc_blocks()
    assert [len(blocks[s]) for s in ('davda54/sam', 'pytorch-optimizer')] == [4, 2]
    assert all('import SAM' in blocks[s][0] and 'for ' not in blocks[s][0] for s in blocks)


@pytest.mark.parametrize('name', LOOPS)
def test_their_loops_unchanged_equal_sam_from_the_algorithm(name):
    source, loop, bn, base, loss, bn_first_pass_only = LOOPS[name]
    model = _run(_doc_blocks()[source], loop, mlp(bn=bn))
    assert relative_l2(model, reference(mlp(bn=bn), base, loss, bn_first_pass_only=bn_first_pass_only)) <= RELATIVE_L2
    # and pytorch-optimizer's own SAM through the very same loop ends at the same weights
    theirs = _run(_doc_blocks()[source], loop, mlp(bn=bn), sam_class=pytorch_optimizer.SAM)
    assert relative_l2(model, theirs) <= RELATIVE_L2


def test_without_the_helpers_model_keeps_the_first_pass_statistics():
    """The BatchNorm loop with its helpers dropped and ``model=`` given: the statistics are the first pass's alone
    (``num_batches_tracked`` counted once per step, where momentum 0 counts both passes)."""
    model = mlp(bn=True)
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, model=model)
    for inputs, targets in batches(4):
        smooth_crossentropy(model(inputs), targets).mean().backward()
        optimizer.first_step(zero_grad=True)
        smooth_crossentropy(model(inputs), targets).mean().backward()
        optimizer.second_step(zero_grad=True)
    ref = reference(mlp(bn=True), _SGD, _smooth, bn_first_pass_only=True)
    assert relative_l2(model, ref) <= RELATIVE_L2
    assert model[1].num_batches_tracked.item() == 4 and ref[1].num_batches_tracked.item() == 8


def _davda54_closure_loop(optimizer: torch.optim.Optimizer, model: nn.Module, steps: int = 4,
                          zero: Optional[Callable] = None) -> List[Optional[torch.Tensor]]:
    returned = []
    for x, y in batches(steps):
        def closure(x=x, y=y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        F.cross_entropy(model(x), y).backward()
        returned.append(optimizer.step(closure))
        (zero or optimizer.zero_grad)()
    return returned


def _torch_closure_loop(optimizer: torch.optim.Optimizer, model: nn.Module, steps: int = 4) -> List[torch.Tensor]:
    returned = []
    for x, y in batches(steps):
        def closure(x=x, y=y):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        returned.append(optimizer.step(closure))
    return returned


@pytest.mark.timm_free
def test_both_conventions_give_the_same_sam_and_say_what_they_return():
    ref = reference(mlp(), _SGD, _ce)
    davda, torch_way = mlp(), mlp()
    returned = _davda54_closure_loop(SAM(davda.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9), davda)
    losses = _torch_closure_loop(SAM(torch_way.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9), torch_way)
    assert returned == [None] * 4  # the loss at w is the caller's own
    assert all(isinstance(loss, torch.Tensor) and loss.requires_grad for loss in losses)  # torch's: the loss at w
    assert relative_l2(davda, ref) <= RELATIVE_L2 and relative_l2(torch_way, ref) <= RELATIVE_L2


@pytest.mark.timm_free
@pytest.mark.parametrize('zero', ['optimizer', 'optimizer, set_to_none=False', 'model'])
def test_every_way_of_zeroing_between_steps_is_read_right(zero):
    """After ``optimizer.zero_grad()`` (either form) or ``model.zero_grad()`` the next backward is davda54's first
    pass; zeros left in place and nothing else are torch's convention (the closure then runs at w and w + e)."""
    ref = reference(mlp(), _SGD, _ce)
    model = mlp()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    how = {'optimizer': optimizer.zero_grad, 'optimizer, set_to_none=False': lambda: optimizer.zero_grad(False),
           'model': model.zero_grad}[zero]
    _davda54_closure_loop(optimizer, model, zero=how)
    assert relative_l2(model, ref) <= RELATIVE_L2
    model = mlp()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    for x, y in batches(4):  # torch's convention with the gradients zeroed in place between steps
        calls = []

        def closure(x=x, y=y, calls=calls):
            calls.append(1)
            optimizer.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        assert optimizer.step(closure) is not None and len(calls) == 2
        optimizer.zero_grad(set_to_none=False)
    assert relative_l2(model, ref) <= RELATIVE_L2


def test_gradients_there_when_the_optimizer_is_built_are_no_first_pass():
    """A model that already has gradients (an earlier optimizer's, a gradient check's) when SAM is built: those are
    not a backward of the caller's, so torch's convention runs the closure at w and w + e."""
    ref = reference(mlp(), _SGD, _ce)
    model = mlp()
    F.cross_entropy(model(_batch(3)[0]), _batch(3)[1]).backward()  # another batch's gradient, before SAM exists
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    _torch_closure_loop(optimizer, model)
    assert relative_l2(model, ref) <= RELATIVE_L2


@pytest.mark.timm_free
def test_gsam_and_interval_in_davda54s_convention():
    """GSAM reads the first pass's gradient, which in davda54's convention is the caller's: both conventions agree.
    With ``interval=2`` the plain steps use the caller's gradient and never call the closure."""
    models = [mlp(), mlp()]
    opts = [GSAM(m.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, alpha=0.3) for m in models]
    _davda54_closure_loop(opts[0], models[0])
    _torch_closure_loop(opts[1], models[1])
    assert relative_l2(models[0], models[1]) <= RELATIVE_L2

    model = mlp()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, interval=2)
    calls = []
    for x, y in batches(4):
        def closure(x=x, y=y):
            calls.append(1)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        F.cross_entropy(model(x), y).backward()
        optimizer.step(closure)
        optimizer.zero_grad()
    assert len(calls) == 2 and optimizer.state_dict()['sam']['step'] == 4


@pytest.mark.filterwarnings('default:SAM does not know the model')
def test_davda54s_convention_warns_about_buffers_only_where_the_closure_has_batch_norm():
    for bn, warns in ((False, False), (True, True)):
        model = mlp(bn=bn)
        optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1)
        with pytest.warns(UserWarning, match='SAM does not know the model') if warns else _no_warning():
            _davda54_closure_loop(optimizer, model, steps=1)


@pytest.mark.filterwarnings('default:SAM does not know the model')
@pytest.mark.parametrize('helpers', [True, False])
def test_davda54s_example_is_warned_only_when_its_second_pass_moves_the_statistics(helpers):
    """davda54/sam's example/train.py (docs/sam.md's block, as written) sets BatchNorm's momentum to 0 for the pass
    at w + e: nothing moves there, so SAM, not given the model, has nothing to warn about; without the helpers the
    statistics move in both passes, and SAM says so once."""
    blocks = _doc_blocks()['davda54/sam']
    loop = blocks[3] if helpers else blocks[3].replace('disable_running_stats(model)', 'pass')
    with (_no_warning() if helpers else pytest.warns(UserWarning, match='updated by both passes')) as record:
        _run(blocks[:1] + [loop], 1, mlp(bn=True))
    if not helpers:
        assert len([r for r in record if 'SAM does not know the model' in str(r.message)]) == 1


def _asam_constructor(blocks: List[str], form: str) -> List[str]:
    """docs/sam.md's davda54/sam constructor block as ASAM (``rho=2.0, adaptive=True``), in davda54/sam's form or
    over an optimizer instance."""
    if form == 'davda54':
        call = 'SAM(model.parameters(), base_optimizer, rho=2.0, adaptive=True, lr=0.1, momentum=0.9)'
    else:
        call = 'SAM(base_optimizer(model.parameters(), lr=0.1, momentum=0.9), rho=2.0, adaptive=True)'
    constructor = re.sub(r'SAM\(model\.parameters\(\), base_optimizer, lr=0\.1, momentum=0\.9\)', call, blocks[0])
    assert call in constructor
    return [constructor] + blocks[1:]


def test_asam_in_davda54s_constructor_form_is_davda54s_asam():
    """``SAM(params, SGD, adaptive=True)`` as davda54/sam (and pytorch-optimizer) write ASAM: T = |w| (eta 0),
    equal to ASAM from the algorithm and to pytorch-optimizer's through the same loop; over an optimizer instance
    (timm's factory's form) SAM keeps the ASAM paper's eta=0.01, which moves elsewhere."""
    blocks = _asam_constructor(_doc_blocks()['davda54/sam'], 'davda54')
    ours = _run(blocks, 1, mlp())
    theirs = _run(blocks, 1, mlp(), sam_class=pytorch_optimizer.SAM)
    assert relative_l2(ours, reference(mlp(), _SGD, _ce, rho=2.0, eta=0.0)) <= RELATIVE_L2
    assert relative_l2(ours, theirs) <= RELATIVE_L2
    paper = _run(_asam_constructor(_doc_blocks()['davda54/sam'], 'instance'), 1, mlp())
    assert relative_l2(paper, reference(mlp(), _SGD, _ce, rho=2.0, eta=0.01)) <= RELATIVE_L2
    assert relative_l2(paper, ours) > 1e-4


class _no_warning:
    def __enter__(self):
        import warnings
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter('error')
        return []

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)


# ---- gradients neither convention can use: one line naming both, nothing moved -------------------------------

def _refused(optimizer: torch.optim.Optimizer, model: nn.Module, closure: Callable, who: str) -> None:
    w = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as raised:
        optimizer.step(closure)
    message = str(raised.value)
    assert message.startswith(f'SAM.step(closure): {who}') and message.endswith(CONVENTIONS) and '\n' not in message
    assert "davda54/sam's" in message and "torch's convention" in message
    assert all(torch.equal(a, p) for a, p in zip(w, model.parameters())) and not optimizer.perturbed


def _batch(seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return batches(seed + 1)[seed]


def test_a_davda54_loop_without_zero_grad_is_refused():
    """Its next backward adds onto the gradients the step left: a stale sum, which davda54/sam would use."""
    model = mlp()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    x, y = _batch(0)

    def closure():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss
    F.cross_entropy(model(x), y).backward()
    optimizer.step(closure)  # no optimizer.zero_grad() after it
    F.cross_entropy(model(x), y).backward()
    _refused(optimizer, model, closure, 'a backward since added to the gradients the last step left')


def test_a_torch_closure_that_does_not_zero_is_refused_after_its_first_call():
    model = mlp()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1)
    x, y = _batch(0)

    def closure():  # torch's convention, minus the zero_grad
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss
    optimizer.step(closure)  # nothing at hand yet: run at w and w + e, right
    _refused(optimizer, model, closure, 'the closure added to the gradients the last step left')
    # zeroing in the closure, through the optimizer or the model, is torch's convention
    for zero in (optimizer.zero_grad, model.zero_grad):
        def zeroing(zero=zero):
            zero()
            return closure()
        optimizer.step(zeroing)


def test_half_new_half_left_gradients_are_refused():
    model = mlp()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1)
    _torch_closure_loop(optimizer, model, steps=1)
    model[0].zero_grad()
    model[0].weight.sum().backward()  # a new gradient for one weight; the last layer keeps the step's
    message = ('SAM.step(closure): of the parameters with a gradient, 1 got it from a backward since the last step '
               'and 2 still hold the one the last step left')
    with pytest.raises(ValueError, match=re.escape(message)):
        optimizer.step(lambda: None)
