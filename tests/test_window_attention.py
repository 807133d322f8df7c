"""WindowAttention2d against a naive float64 reference: a loop over windows with an explicit softmax and the bias
looked up from the tokens' relative coordinates. Both kernels (eval: fused SDPA; train: explicit bmm), both memory
formats, padded maps and gradients are checked against it."""
import math

import pytest
import torch

from timm_ext.layers import WindowAttention2d
from timm_ext.layers.window_attention import (
    raster_rows_to_nchw,
    split_heads,
    window_attention_mask,
    window_partition_nchw,
    window_reverse_nchw,
    windows_to_raster_rows,
)

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def _bias_from_table(table: torch.Tensor, ws: int) -> torch.Tensor:
    """bias[q, k] = table[(r_q - r_k + ws - 1) * (2 ws - 1) + (c_q - c_k + ws - 1)], tokens row-major."""
    n = ws * ws
    rows = []
    for q in range(n):
        row = []
        for k in range(n):
            (rq, cq), (rk, ck) = divmod(q, ws), divmod(k, ws)
            row.append(table[(rq - rk + ws - 1) * (2 * ws - 1) + (cq - ck + ws - 1)])
        rows.append(torch.stack(row))
    return torch.stack(rows)


def _reference(layer: WindowAttention2d, x: torch.Tensor) -> torch.Tensor:
    """Loop over windows; a window at the border holds only its real tokens, keeping their grid positions.
    Differentiable in the layer's parameters (for the gradient checks)."""
    B, C, H, W = x.shape
    ws, heads, d = layer.window_size, layer.num_heads, layer.head_dim
    full_bias = _bias_from_table(layer.relative_position_bias_table, ws)
    w_qkv, w_proj, b_proj = layer.qkv.weight, layer.proj.weight, layer.proj.bias
    out = [[[None] * W for _ in range(H)] for _ in range(B)]
    for b in range(B):
        for r0 in range(0, H, ws):
            for c0 in range(0, W, ws):
                coords = [(r, c) for r in range(r0, min(r0 + ws, H)) for c in range(c0, min(c0 + ws, W))]
                local = [(r - r0) * ws + (c - c0) for r, c in coords]
                tokens = torch.stack([x[b, :, r, c] for r, c in coords])  # (n, C)
                q, k, v = (tokens @ w_qkv.T).split(heads * d, dim=1)
                bias = full_bias[local][:, local]
                heads_out = []
                for h in range(heads):
                    qh, kh, vh = (t[:, h * d:(h + 1) * d] for t in (q, k, v))
                    logits = qh @ kh.T / math.sqrt(d) + bias
                    attn = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)
                    heads_out.append(attn @ vh)
                y = torch.cat(heads_out, dim=1) @ w_proj.T + b_proj
                for (r, c), value in zip(coords, y):
                    out[b][r][c] = value
    return torch.stack([torch.stack([torch.stack(row, dim=-1) for row in img], dim=-2) for img in out])


@pytest.fixture
def layer() -> WindowAttention2d:
    torch.manual_seed(0)
    layer = WindowAttention2d(6, 10, num_heads=2, head_dim=4, window_size=3).double().eval()
    with torch.no_grad():
        layer.relative_position_bias_table.normal_(0, 1.0)  # large enough to matter in the comparison
    return layer


@pytest.mark.parametrize('training', [False, True], ids=['eval_sdpa', 'train_bmm'])
@pytest.mark.parametrize('size', [(6, 9), (7, 5), (2, 2), (4, 8)])
def test_matches_naive_reference(layer, size, training):
    """Divisible maps, padded maps and a map smaller than the window, through both kernels."""
    torch.manual_seed(1)
    x = torch.randn(2, 6, *size, dtype=torch.float64)
    layer.train(training)
    with torch.no_grad():
        out = layer(x)
        expected = _reference(layer, x)
    assert out.shape == (2, 10, *size) and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('size', [(6, 9), (7, 5)])
def test_channels_last_input_gives_channels_last_output(layer, size):
    torch.manual_seed(2)
    x = torch.randn(2, 6, *size, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        out = layer(x)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    torch.testing.assert_close(out, _reference(layer, x), rtol=1e-10, atol=1e-10)


def test_unpadded_layer_matches_the_reference_where_the_window_divides(layer):
    torch.manual_seed(3)
    strict = WindowAttention2d(6, 10, num_heads=2, head_dim=4, window_size=3, pad_to_window=False).double().eval()
    strict.load_state_dict(layer.state_dict())
    x = torch.randn(2, 6, 6, 9, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(strict(x), _reference(layer, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('training', [False, True], ids=['eval_sdpa', 'train_bmm'])
def test_gradients_match_the_reference(layer, training):
    """Gradients of the input, the bias table and both projections on a padded map, against the loop's autograd."""
    torch.manual_seed(4)
    x = torch.randn(1, 6, 5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(1, 10, 5, 4, dtype=torch.float64)
    layer.train(training)
    params = [x, layer.relative_position_bias_table, layer.qkv.weight, layer.proj.weight, layer.proj.bias]
    grads = torch.autograd.grad((layer(x) * weight).sum(), params)
    expected = torch.autograd.grad((_reference(layer, x) * weight).sum(), params)
    assert grads[1].abs().sum() > 0
    for got, ref in zip(grads, expected):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-10)


def test_bias_matches_the_relative_coordinates(layer):
    """relative_position_bias()[q, k] is the table entry of (row_q - row_k, col_q - col_k): every head adds it."""
    torch.testing.assert_close(
        layer.relative_position_bias().detach(), _bias_from_table(layer.relative_position_bias_table.detach(), 3))
    assert layer.relative_position_bias_table.shape == (25,)


def test_mask_is_minus_inf_exactly_on_padded_keys():
    """A 4x5 map in windows of 3: padded rows/columns per window, written out by hand."""
    ws = 3
    bias = torch.arange(81, dtype=torch.float64).view(9, 9)
    mask = window_attention_mask(bias, torch.empty(2, 1, 4, 5), ws)
    assert mask.shape == (2 * 4, 1, 9, 9)
    # windows (row-major): (0, 0) full; (0, 1) columns 3-4 real, 5 padded; (1, 0) row 3 real; (1, 1) rows 3, cols 3-4
    real_keys = [range(9), [0, 1, 3, 4, 6, 7], [0, 1, 2], [0, 1]]
    for b in range(2):
        for w, keys in enumerate(real_keys):
            m = mask[b * 4 + w, 0]
            for k in range(9):
                if k in keys:
                    assert torch.equal(m[:, k], bias[:, k])
                else:
                    assert torch.isneginf(m[:, k]).all()
    assert window_attention_mask(bias, torch.empty(2, 1, 6, 3), ws).shape == (1, 1, 9, 9)


@pytest.mark.parametrize('used', [(0, 1, 2), (0, 2), (1,)], ids=['qkv', 'q_v', 'k_only'])
def test_split_heads_values_and_gradients(used):
    """q, k, v as (windows * heads, N, head_dim) from rows (window, token, [q|k|v], head, dim), written out by
    index; the gradient (the hand-written backward, also when some of q, k, v get none) equals the plain
    permute + unbind's."""
    torch.manual_seed(5)
    windows, n, heads, d = 3, 4, 2, 5
    qkv = torch.randn(windows * n, 3 * heads * d, dtype=torch.float64, requires_grad=True)
    parts = split_heads(qkv, n, heads, d)
    for i, part in enumerate(parts):
        assert part.shape == (windows * heads, n, d) and part.is_contiguous()
        for w in range(windows):
            for h in range(heads):
                for t in range(n):
                    start = (i * heads + h) * d
                    assert torch.equal(part[w * heads + h, t], qkv[w * n + t, start:start + d])
    weights = [torch.randn(windows * heads, n, d, dtype=torch.float64) for _ in range(3)]
    loss = sum((parts[i] * weights[i]).sum() for i in used)
    (grad,) = torch.autograd.grad(loss, qkv)
    plain = qkv.view(-1, n, 3, heads, d).permute(2, 0, 3, 1, 4).reshape(3, -1, n, d).unbind(0)
    (expected,) = torch.autograd.grad(sum((plain[i] * weights[i]).sum() for i in used), qkv)
    assert torch.equal(grad, expected)
    with torch.no_grad():  # the no-grad route (and TorchScript's) gives the same tensors
        assert all(torch.equal(a, b) for a, b in zip(split_heads(qkv, n, heads, d), parts))


def test_split_heads_is_twice_differentiable():
    """Hessians of a training-mode AlterNet (``hessian_context(train=True)``) go through its backward again."""
    torch.manual_seed(6)
    qkv = torch.randn(8, 3 * 2 * 3, dtype=torch.float64, requires_grad=True)

    def fn(t):
        q, k, v = split_heads(t, 4, 2, 3)
        return (q * q).sum() + (k * v).sum()

    assert torch.autograd.gradgradcheck(fn, (qkv,))


def test_partition_order_and_reverse():
    """Token rows are batch, window row, window column, then row-major inside the window; reverse crops padding."""
    x = torch.arange(2 * 1 * 4 * 5, dtype=torch.float32).view(2, 1, 4, 5)
    tokens = window_partition_nchw(x, 2)
    assert tokens.shape == (2 * 2 * 3 * 4, 1)
    assert tokens[:8, 0].tolist() == [0, 1, 5, 6, 2, 3, 7, 8]  # image 0: window (0, 0), then (0, 1)
    assert tokens[8:12, 0].tolist() == [4, 0, 9, 0]  # window (0, 2): column 4 real, column 5 padded with zeros
    assert tokens[24, 0].item() == 20  # image 1 starts after image 0's six windows
    torch.testing.assert_close(window_reverse_nchw(tokens, x, 2), x)


def test_windows_to_raster_rows_order():
    """Row (b, r, c) of the padded map, channel (h, d) = window output (b, r // ws, c // ws), token
    (r % ws, c % ws), head h, dim d; checked element by element on a 5x3 map in windows of 2 (padded to 6x4)."""
    B, ws, heads, d, H, W = 2, 2, 3, 2, 5, 3
    nh, nw, Hp, Wp = 3, 2, 6, 4
    out = torch.randn(B * nh * nw, ws * ws, heads, d)
    rows = windows_to_raster_rows(out.transpose(0, 1).contiguous().transpose(0, 1), torch.empty(B, 1, H, W), ws)
    assert rows.shape == (B * Hp * Wp, heads * d)
    for b in range(B):
        for r in range(Hp):
            for c in range(Wp):
                window = (b * nh + r // ws) * nw + c // ws
                expected = out[window, (r % ws) * ws + c % ws].reshape(-1)
                assert torch.equal(rows[(b * Hp + r) * Wp + c], expected), (b, r, c)


@pytest.mark.parametrize('size', [(4, 6), (5, 3)], ids=['divisible', 'padded'])
@pytest.mark.parametrize('channels_last', [False, True], ids=['nchw', 'channels_last'])
def test_raster_rows_to_nchw(size, channels_last):
    """Values cropped to the map, memory format of ``like``; a channels-last map the window divides is a view."""
    B, C, ws = 2, 3, 2
    H, W = size
    Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
    rows = torch.randn(B * Hp * Wp, C)
    like = torch.empty(B, C, H, W)
    like = like.contiguous(memory_format=torch.channels_last) if channels_last else like
    x = raster_rows_to_nchw(rows, like, ws)
    assert x.shape == (B, C, H, W)
    assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    for b, c, r, col in ((0, 0, 0, 0), (1, 2, H - 1, W - 1), (1, 1, 2, 1), (0, 2, H - 1, 0)):
        assert x[b, c, r, col] == rows[(b * Hp + r) * Wp + col, c]
    assert (x.data_ptr() == rows.data_ptr()) == (channels_last and size == (4, 6))


def test_channels_last_output_needs_no_copy_after_the_projection(layer):
    """The projection writes the channels-last map directly: the output is the projection's own tensor."""
    x = torch.randn(2, 6, 6, 9, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    projected = []
    handle = layer.proj.register_forward_hook(lambda module, args, out: projected.append(out))
    with torch.no_grad():
        out = layer(x)
    handle.remove()
    assert out.data_ptr() == projected[0].data_ptr()


def test_no_padding_raises_for_a_window_larger_than_the_map():
    layer = WindowAttention2d(8, num_heads=1, head_dim=8, window_size=7, pad_to_window=False)
    with pytest.raises(ValueError, match=r'Feature map 4x4 is smaller than window_size 7 and pad_to_window=False'):
        layer(torch.randn(1, 8, 4, 4))


def test_no_padding_raises_for_a_non_divisible_map():
    layer = WindowAttention2d(8, num_heads=1, head_dim=8, window_size=4, pad_to_window=False)
    with pytest.raises(ValueError, match=r'Feature map 6x8 is not divisible by window_size 4'):
        layer(torch.randn(1, 8, 6, 8))


@pytest.mark.parametrize('kwargs, message', [
    (dict(window_size=0), r'window_size must be a positive integer, got 0'),
    (dict(head_dim=0), r'head_dim must be a positive integer, got 0'),
    (dict(num_heads=-2), r'num_heads must be a positive integer, got -2'),
    (dict(num_heads=2.0), r'num_heads must be a positive integer, got 2\.0'),
])
def test_bad_head_and_window_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WindowAttention2d(8, **kwargs)


def test_dense_prediction_sized_map_is_finite():
    """A 800x1333 input's stride-8 map (100x167): windows of 7 do not divide it."""
    torch.manual_seed(4)
    layer = WindowAttention2d(4, num_heads=1, head_dim=4, window_size=7).eval()
    with torch.no_grad():
        out = layer(torch.randn(1, 4, 100, 167))
    assert out.shape == (1, 4, 100, 167)
    assert torch.isfinite(out).all()
