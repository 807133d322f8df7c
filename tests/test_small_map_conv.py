"""SmallMapConv2d against nn.Conv2d with the same weights: outputs and gradients in float64, the route each input
takes, the memory format handed back, and the factory's padding against timm's create_conv2d."""
import pytest
import torch
import torch.nn as nn
from timm.layers import create_conv2d

from timm_ext.layers import SMALL_MAP_PIXELS, SmallMapConv2d, create_small_map_conv2d

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


def _pair(case, dtype=torch.float64):
    cin, cout, k, s, p, d, g, bias, _ = case
    torch.manual_seed(0)
    ref = nn.Conv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=bias, dtype=dtype)
    ours = SmallMapConv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=bias, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize('case', CASES, ids=lambda c: 'k{2}s{3}p{4}d{5}g{6}b{7}-{8}px'.format(*c))
@pytest.mark.parametrize('channels_last', [True, False], ids=['channels_last', 'nchw'])
def test_outputs_and_gradients_equal_nn_conv2d(case, channels_last):
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
    """'gemm', 'nchw' or 'own': which path ``conv(x)`` took, from the input its ``_conv_forward`` saw."""
    seen = []
    original = SmallMapConv2d._conv_forward

    def spy(self, inp, weight, bias):
        seen.append(inp)
        return original(self, inp, weight, bias)

    monkeypatch.setattr(SmallMapConv2d, '_conv_forward', spy)
    conv(x)
    monkeypatch.undo()
    if not seen:
        return 'gemm'
    return 'own' if seen[0] is x else 'nchw'


@pytest.mark.parametrize('case, expected', [
    (CASES[0], 'gemm'), (CASES[1], 'gemm'), (CASES[3], 'nchw'), (CASES[4], 'nchw'), (CASES[5], 'nchw'),
    (CASES[6], 'nchw'), (CASES[7], 'own'), (CASES[8], 'own'),
])
def test_route_by_output_size_and_kernel(case, expected, monkeypatch):
    _, ours = _pair(case, torch.float32)
    x = torch.randn(2, case[0], case[-1], case[-1]).contiguous(memory_format=CL)
    assert _route(ours, x, monkeypatch) == expected
    # an NCHW input always takes nn.Conv2d's own path, whatever the size
    assert _route(ours, x.contiguous(), monkeypatch) == 'own'


def test_threshold_is_seven_by_seven():
    """49 output pixels (ImageNet's last stage) take the small-map route, 64 do not."""
    conv = SmallMapConv2d(8, 8, 1)
    assert SMALL_MAP_PIXELS == 49
    assert conv._output_size(7, 7) == (7, 7) and conv._output_size(8, 8) == (8, 8)
    strided = SmallMapConv2d(8, 8, 3, stride=2, padding=1)
    assert strided._output_size(14, 14) == (7, 7)


@pytest.mark.parametrize('kernel, stride, dilation', [(1, 1, 1), (1, 2, 1), (3, 1, 1), (3, 2, 1), (3, 1, 2), (7, 2, 1)])
def test_factory_matches_timm_create_conv2d(kernel, stride, dilation):
    timm_conv = create_conv2d(8, 16, kernel, stride=stride, dilation=dilation)
    ours = create_small_map_conv2d(8, 16, kernel, stride=stride, dilation=dilation)
    assert type(timm_conv) is nn.Conv2d and isinstance(ours, SmallMapConv2d)
    for attr in ('kernel_size', 'stride', 'padding', 'dilation', 'groups'):
        assert getattr(ours, attr) == getattr(timm_conv, attr), attr
    assert ours.bias is None and timm_conv.bias is None
    assert ours.state_dict().keys() == timm_conv.state_dict().keys()


@pytest.mark.parametrize('case', [CASES[1], CASES[3], CASES[8]], ids=['gemm', 'nchw', 'own'])
def test_torchscript_takes_the_same_routes(case):
    _, ours = _pair(case, torch.float32)
    scripted = torch.jit.script(ours)
    x = torch.randn(2, case[0], case[-1], case[-1]).contiguous(memory_format=CL)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), ours(x), rtol=0, atol=0)
