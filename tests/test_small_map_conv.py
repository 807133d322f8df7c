"""SmallMapConv2d against nn.Conv2d with the same weights: outputs and gradients in float64 whichever route the
timing picks, the route each input takes under the fixed rule, how routes are timed, chosen and remembered (with a
fake timer: no wall-clock in tests), the switches that turn timing off, the memory format handed back, TorchScript,
FX, torch.compile and checkpointing, and the factory's padding against timm's create_conv2d."""
from typing import Callable, Dict, List

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint
from timm.layers import create_conv2d
from timm.models._features_fx import create_feature_extractor

from timm_ext.layers import SMALL_MAP_PIXELS, SmallMapConv2d, create_small_map_conv2d, small_map_conv
from timm_ext.layers.small_map_conv import (
    clear_small_map_routes,
    set_small_map_autotune,
    small_map_autotune,
    small_map_autotune_enabled,
)

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

CL = torch.channels_last

# (in, out, kernel, stride, padding, dilation, groups, bias, map side)
CASES = [
    (16, 24, 1, 1, 0, 1, 1, False, 4),    # pointwise, small map: GEMM
    (16, 24, 1, 2, 0, 1, 1, True, 8),     # strided pointwise, 4 x 4 output: GEMM on every other row and column
    (16, 24, 1, 2, 0, 1, 1, False, 7),    # odd side: output 4 x 4 (ceil)
    (16, 16, 3, 1, 1, 1, 1, True, 4),     # 3 x 3, small map: NCHW
    (16, 16, 3, 2, 1, 1, 1, False, 8),    # strided 3 x 3, 4 x 4 output: NCHW
    (16, 16, 3, 1, 2, 2, 4, False, 7),    # dilated, grouped: NCHW
    (8, 12, 1, 1, 1, 1, 1, False, 4),     # padded pointwise: not a GEMM, NCHW
    (16, 24, 1, 1, 0, 1, 1, False, 8),    # 64-pixel output: nn.Conv2d's own path
    (16, 16, 3, 1, 1, 1, 1, False, 16),   # large map: nn.Conv2d's own path
]


class FakeTimer:
    """Stands in for the route timer: runs each route once (so they must work) and reports the given seconds."""

    def __init__(self, seconds: Dict[str, float]):
        self.seconds = seconds
        self.calls: List[List[str]] = []

    def __call__(self, routes: Dict[str, Callable[[], None]]) -> Dict[str, float]:
        self.calls.append(sorted(routes))
        for fn in routes.values():
            fn()
        return {name: self.seconds[name] for name in routes}


def _no_timing(routes):
    raise AssertionError('timed with autotuning off')


@pytest.fixture(autouse=True)
def fresh_routes():
    """Every test starts with no remembered route and autotuning on, and leaves it so."""
    clear_small_map_routes()
    with small_map_autotune(True):
        yield
    clear_small_map_routes()


def _fake_timer(monkeypatch, faster: str) -> FakeTimer:
    timer = FakeTimer({'conv2d': 2e-3, 'small_map': 1e-3} if faster == 'small_map' else
                      {'conv2d': 1e-3, 'small_map': 2e-3})
    monkeypatch.setattr(small_map_conv, 'median_seconds', timer)
    return timer


def _pair(case, dtype=torch.float64):
    cin, cout, k, s, p, d, g, bias, _ = case
    torch.manual_seed(0)
    ref = nn.Conv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=bias, dtype=dtype)
    ours = SmallMapConv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=bias, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize('case', CASES, ids=lambda c: 'k{2}s{3}p{4}d{5}g{6}b{7}-{8}px'.format(*c))
@pytest.mark.parametrize('channels_last', [True, False], ids=['channels_last', 'nchw'])
@pytest.mark.parametrize('faster', ['small_map', 'conv2d'])
def test_outputs_and_gradients_equal_nn_conv2d(case, channels_last, faster, monkeypatch):
    _fake_timer(monkeypatch, faster)
    ref, ours = _pair(case)
    side = case[-1]
    x = torch.randn(3, case[0], side, side, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=CL)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_ours = ref(x_ref), ours(x_ours)
    torch.testing.assert_close(y_ours, y_ref, rtol=1e-12, atol=1e-12)
    assert y_ours.is_contiguous(memory_format=CL if channels_last else torch.contiguous_format)
    grad = torch.randn_like(y_ref)
    y_ref.backward(grad)
    y_ours.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, dict(ref.named_parameters())[name].grad, rtol=1e-12, atol=1e-12)


def _route(conv: SmallMapConv2d, x: torch.Tensor, monkeypatch) -> str:
    """'gemm', 'nchw' or 'own': which path ``conv(x)`` took, from the input its ``_conv_forward`` saw (after any
    timing: the route is chosen before the spy goes in)."""
    conv.takes_small_map_route(x)
    seen = []
    original = SmallMapConv2d._conv_forward

    def spy(self, inp, weight, bias):
        seen.append(inp)
        return original(self, inp, weight, bias)

    with monkeypatch.context() as patch:
        patch.setattr(SmallMapConv2d, '_conv_forward', spy)
        conv(x)
    if not seen:
        return 'gemm'
    return 'own' if seen[0] is x else 'nchw'


@pytest.mark.parametrize('case, expected', [
    (CASES[0], 'gemm'), (CASES[1], 'gemm'), (CASES[3], 'nchw'), (CASES[4], 'nchw'), (CASES[5], 'nchw'),
    (CASES[6], 'nchw'), (CASES[7], 'own'), (CASES[8], 'own'),
])
def test_fixed_rule_routes_by_output_size_and_kernel(case, expected, monkeypatch):
    """Autotuning off: every candidate shape takes the small-map route, nothing is timed."""
    monkeypatch.setattr(small_map_conv, 'median_seconds', _no_timing)
    set_small_map_autotune(False)
    _, ours = _pair(case, torch.float32)
    x = torch.randn(2, case[0], case[-1], case[-1]).contiguous(memory_format=CL)
    assert _route(ours, x, monkeypatch) == expected
    # an NCHW input always takes nn.Conv2d's own path, whatever the size
    assert _route(ours, x.contiguous(), monkeypatch) == 'own'


def test_threshold_is_seven_by_seven():
    """49 output pixels (ImageNet's last stage) are candidates for the small-map route, 64 are not."""
    conv = SmallMapConv2d(8, 8, 1)
    assert SMALL_MAP_PIXELS == 49
    assert conv.output_size(7, 7) == (7, 7) and conv.output_size(8, 8) == (8, 8)
    strided = SmallMapConv2d(8, 8, 3, stride=2, padding=1)
    assert strided.output_size(14, 14) == (7, 7)


@pytest.mark.parametrize('kernel, stride, dilation', [(1, 1, 1), (1, 2, 1), (3, 1, 1), (3, 2, 1), (3, 1, 2), (7, 2, 1)])
def test_factory_matches_timm_create_conv2d(kernel, stride, dilation):
    timm_conv = create_conv2d(8, 16, kernel, stride=stride, dilation=dilation)
    ours = create_small_map_conv2d(8, 16, kernel, stride=stride, dilation=dilation)
    assert type(timm_conv) is nn.Conv2d and isinstance(ours, SmallMapConv2d)
    for attr in ('kernel_size', 'stride', 'padding', 'dilation', 'groups'):
        assert getattr(ours, attr) == getattr(timm_conv, attr), attr
    assert ours.bias is None and timm_conv.bias is None
    assert ours.state_dict().keys() == timm_conv.state_dict().keys()


@pytest.mark.filterwarnings('ignore:`torch.jit.script` is deprecated:FutureWarning')
@pytest.mark.parametrize('case', [CASES[1], CASES[3], CASES[8]], ids=['gemm', 'nchw', 'own'])
def test_torchscript_takes_the_fixed_rule(case, monkeypatch):
    """Scripted: the fixed rule (no timing in TorchScript), bit-equal to eager with autotuning off, and equal up to
    rounding to eager when the timing picked nn.Conv2d's route."""
    _, ours = _pair(case, torch.float32)
    scripted = torch.jit.script(ours)
    x = torch.randn(2, case[0], case[-1], case[-1]).contiguous(memory_format=CL)
    monkeypatch.setattr(small_map_conv, 'median_seconds', _no_timing)
    with torch.no_grad():
        with small_map_autotune(False):
            fixed = ours(x)
            torch.testing.assert_close(scripted(x), fixed, rtol=0, atol=0)
        torch.testing.assert_close(scripted(x), fixed, rtol=0, atol=0)  # autotuning on: scripted never times
        monkeypatch.setattr(small_map_conv, 'median_seconds', FakeTimer({'conv2d': 1e-3, 'small_map': 2e-3}))
        y = scripted(x)
        torch.testing.assert_close(y, ours(x), rtol=1e-5, atol=1e-5)
        assert y.is_contiguous(memory_format=CL)


# --- autotuning: the choice, the cache, the switches ------------------------------------------------------------

def _gemm_case(batch: int = 2, side: int = 4, grad: bool = False):
    _, conv = _pair(CASES[0], torch.float32)
    x = torch.randn(batch, 16, side, side).contiguous(memory_format=CL).requires_grad_(grad)
    return conv, x


@pytest.mark.parametrize('faster, expected', [('small_map', 'gemm'), ('conv2d', 'own')])
def test_faster_route_is_chosen_and_timed_once(faster, expected, monkeypatch):
    timer = _fake_timer(monkeypatch, faster)
    conv, x = _gemm_case()
    assert _route(conv, x, monkeypatch) == expected
    assert timer.calls == [['conv2d', 'small_map']]
    timer = _fake_timer(monkeypatch, 'conv2d' if faster == 'small_map' else 'small_map')  # would flip the choice
    assert _route(conv, x, monkeypatch) == expected
    _, twin = _pair(CASES[0], torch.float32)  # another module, same shape: the same remembered route
    assert _route(twin, x, monkeypatch) == expected
    assert timer.calls == []


def test_tie_keeps_nn_conv2d(monkeypatch):
    monkeypatch.setattr(small_map_conv, 'median_seconds', FakeTimer({'conv2d': 1e-3, 'small_map': 1e-3}))
    conv, x = _gemm_case()
    assert _route(conv, x, monkeypatch) == 'own'


def test_each_shape_dtype_and_grad_mode_gets_its_own_entry(monkeypatch):
    timer = _fake_timer(monkeypatch, 'small_map')
    conv, x = _gemm_case()
    with torch.no_grad():
        conv(x)
        conv(x)
        conv(torch.randn(3, 16, 4, 4).contiguous(memory_format=CL))  # another batch size
        conv(torch.randn(2, 16, 5, 5).contiguous(memory_format=CL))  # another map size
        conv(torch.randn(2, 16, 3, 3).contiguous(memory_format=CL))  # and another
        conv.double()(x.double())  # another dtype
        conv.float()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            conv(x)
    assert len(timer.calls) == 6
    conv(x).sum().backward()  # records a graph (weights need grad): timed as forward + backward, its own entry
    conv(x).sum().backward()
    assert len(timer.calls) == 7
    conv.requires_grad_(False)
    conv(x.requires_grad_()).sum().backward()  # only the input's gradient
    assert len(timer.calls) == 8


def test_timing_a_train_call_runs_a_backward_off_the_graph(monkeypatch):
    """With a graph to record, each timed route runs forward + backward on detached copies: no gradient reaches
    the module's parameters or the input from the timing itself."""
    backwards = []
    monkeypatch.setattr(small_map_conv.torch.autograd, 'grad', _counting(torch.autograd.grad, backwards))
    timer = _fake_timer(monkeypatch, 'small_map')
    conv, x = _gemm_case(grad=True)
    y = conv(x)
    assert len(backwards) == 2 and len(timer.calls) == 1  # the fake timer ran each route once
    assert conv.weight.grad is None and x.grad is None
    backwards.clear()
    with torch.no_grad():
        conv(x)
    assert backwards == [] and len(timer.calls) == 2
    y.sum().backward()
    assert conv.weight.grad is not None and x.grad is not None


def _counting(fn, calls):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return wrapped


@pytest.mark.parametrize('switch', ['set', 'context', 'deterministic'])
def test_switches_give_the_fixed_rule_without_timing(switch, monkeypatch):
    monkeypatch.setattr(small_map_conv, 'median_seconds', _no_timing)
    conv, x = _gemm_case()
    if switch == 'set':
        set_small_map_autotune(False)
        assert not small_map_autotune_enabled()
        assert _route(conv, x, monkeypatch) == 'gemm'
    elif switch == 'context':
        with small_map_autotune(False):
            assert not small_map_autotune_enabled()
            assert _route(conv, x, monkeypatch) == 'gemm'
        assert small_map_autotune_enabled()
    else:
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            assert _route(conv, x, monkeypatch) == 'gemm'
        finally:
            torch.use_deterministic_algorithms(previous)


def test_fixed_rule_does_not_forget_timed_routes(monkeypatch):
    """Turning timing off and on again keeps the routes timed before (no second timing)."""
    timer = _fake_timer(monkeypatch, 'conv2d')
    conv, x = _gemm_case()
    assert _route(conv, x, monkeypatch) == 'own'
    with small_map_autotune(False):
        assert _route(conv, x, monkeypatch) == 'gemm'
    assert _route(conv, x, monkeypatch) == 'own' and len(timer.calls) == 1
    clear_small_map_routes()
    conv(x)
    assert len(timer.calls) == 2


@pytest.mark.parametrize('value, expected', [('1', True), ('0', False), (' 0 ', False)])
def test_environment_switch(value, expected, monkeypatch):
    monkeypatch.setenv(small_map_conv.AUTOTUNE_ENV, value)
    assert small_map_conv.autotune_from_env() is expected


def test_environment_switch_rejects_other_values(monkeypatch):
    monkeypatch.setenv('TIMM_EXT_SMALL_MAP_AUTOTUNE', 'yes')
    with pytest.raises(ValueError, match=r"^TIMM_EXT_SMALL_MAP_AUTOTUNE='yes': use 1 \(time both small-map routes, "
                                         r"keep the faster\) or 0 \(fixed rule\)$"):
        small_map_conv.autotune_from_env()


def test_large_maps_and_nchw_inputs_are_never_timed(monkeypatch):
    monkeypatch.setattr(small_map_conv, 'median_seconds', _no_timing)
    conv, _ = _gemm_case()
    conv(torch.randn(2, 16, 8, 8).contiguous(memory_format=CL))  # 64 > SMALL_MAP_PIXELS
    conv(torch.randn(2, 16, 4, 4))  # NCHW


def test_median_seconds_interleaves_warm_up_and_reps():
    order = []
    times = small_map_conv.median_seconds({'a': lambda: order.append('a'), 'b': lambda: order.append('b')}, reps=3)
    assert order == ['a', 'b'] * 4
    assert sorted(times) == ['a', 'b'] and all(t >= 0 for t in times.values())


def test_fx_graph_uses_the_timed_route(monkeypatch):
    """SmallMapConv2d is an FX leaf: the graph calls it, so it times and remembers like eager."""
    timer = _fake_timer(monkeypatch, 'small_map')
    conv, x = _gemm_case()
    graph = create_feature_extractor(nn.Sequential(conv), ['0'])
    with torch.no_grad():
        (out,) = graph(x).values()
        assert torch.equal(out, conv(x))
    assert len(timer.calls) == 1


def test_torch_compile_takes_the_fixed_rule(monkeypatch):
    monkeypatch.setattr(small_map_conv, 'median_seconds', _no_timing)
    conv, x = _gemm_case()
    compiled = torch.compile(conv, backend='eager', fullgraph=True, dynamic=False)
    with torch.no_grad():
        y = compiled(x)
        with small_map_autotune(False):
            torch.testing.assert_close(y, conv(x), rtol=0, atol=0)


def test_checkpointed_call_times_and_gives_nn_conv2d_gradients(monkeypatch):
    """The timing's private backward inside a non-reentrant checkpoint stays out of the checkpoint's saved
    tensors: gradients equal nn.Conv2d's."""
    timer = _fake_timer(monkeypatch, 'small_map')
    ref, ours = _pair(CASES[3])
    x = torch.randn(2, 16, 4, 4, dtype=torch.float64).contiguous(memory_format=CL)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.utils.checkpoint.checkpoint(ours, x_ours, use_reentrant=False)
    y.sum().backward()
    ref(x_ref).sum().backward()
    assert len(timer.calls) == 1
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-12, atol=1e-12)
