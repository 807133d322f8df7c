"""WindowAttention2d against a direct softmax(QK^T / sqrt(d) + bias) V computation, window by window."""
import math

import pytest
import torch

from timm_ext.layers import WindowAttention2d


def _bias_from_table(table: torch.Tensor, ws: int) -> torch.Tensor:
    """bias[q, k] = table[(r_q - r_k + ws - 1) * (2 ws - 1) + (c_q - c_k + ws - 1)], tokens row-major."""
    n = ws * ws
    bias = torch.empty(n, n, dtype=table.dtype)
    for q in range(n):
        for k in range(n):
            (rq, cq), (rk, ck) = divmod(q, ws), divmod(k, ws)
            bias[q, k] = table[(rq - rk + ws - 1) * (2 * ws - 1) + (cq - ck + ws - 1)]
    return bias


def _reference(layer: WindowAttention2d, x: torch.Tensor) -> torch.Tensor:
    """Loop over windows; a window at the border holds only its real tokens, keeping their grid positions."""
    B, C, H, W = x.shape
    ws, heads, d = layer.window_size, layer.num_heads, layer.head_dim
    full_bias = _bias_from_table(layer.relative_position_bias_table.detach(), ws)
    w_qkv, w_proj, b_proj = layer.qkv.weight, layer.proj.weight, layer.proj.bias
    out = torch.zeros(B, w_proj.shape[0], H, W, dtype=x.dtype)
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
                    attn = torch.softmax(qh @ kh.T / math.sqrt(d) + bias, dim=-1)
                    heads_out.append(attn @ vh)
                y = torch.cat(heads_out, dim=1) @ w_proj.T + b_proj
                for (r, c), value in zip(coords, y):
                    out[b, :, r, c] = value
    return out


@pytest.fixture
def layer() -> WindowAttention2d:
    torch.manual_seed(0)
    layer = WindowAttention2d(6, 10, num_heads=2, head_dim=4, window_size=3).double().eval()
    with torch.no_grad():
        layer.relative_position_bias_table.normal_(0, 1.0)  # large enough to matter in the comparison
    return layer


@pytest.mark.parametrize('size', [(6, 9), (7, 5), (2, 2), (4, 8)])
def test_matches_direct_softmax_attention(layer, size):
    """Divisible maps, padded maps and a map smaller than the window all equal the direct computation."""
    torch.manual_seed(1)
    x = torch.randn(2, 6, *size, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x)
    assert out.shape == (2, 10, *size)
    torch.testing.assert_close(out, _reference(layer, x), rtol=1e-10, atol=1e-10)


def test_padding_path_equals_unpadded_path_where_the_window_divides(layer):
    torch.manual_seed(2)
    x = torch.randn(2, 6, 6, 9, dtype=torch.float64)
    strict = WindowAttention2d(6, 10, num_heads=2, head_dim=4, window_size=3, pad_to_window=False).double().eval()
    strict.load_state_dict(layer.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(layer(x), strict(x), rtol=0, atol=0)


def test_padded_tokens_do_not_leak_into_real_ones(layer):
    """Cropping a padded result equals running on the map cut to whole windows, window by window."""
    torch.manual_seed(3)
    x = torch.randn(1, 6, 7, 7, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        inner = layer(x[:, :, :6, :6])
    torch.testing.assert_close(full[:, :, :6, :6], inner, rtol=1e-12, atol=1e-12)


def test_bias_is_shared_by_heads_and_oriented_like_timm_swin(layer):
    from timm.models.swin_transformer import get_relative_position_index
    index = get_relative_position_index(3, 3)
    expected = layer.relative_position_bias_table.detach()[index]
    torch.testing.assert_close(layer.relative_position_bias().detach(), expected)
    assert layer.relative_position_bias_table.shape == (25,)


def test_no_padding_raises_for_a_window_larger_than_the_map():
    layer = WindowAttention2d(8, num_heads=1, head_dim=8, window_size=7, pad_to_window=False)
    with pytest.raises(ValueError, match=r'Feature map 4x4 is smaller than window_size 7 and pad_to_window=False'):
        layer(torch.randn(1, 8, 4, 4))


def test_no_padding_raises_for_a_non_divisible_map():
    layer = WindowAttention2d(8, num_heads=1, head_dim=8, window_size=4, pad_to_window=False)
    with pytest.raises(ValueError, match=r'Feature map 6x8 is not divisible by window_size 4'):
        layer(torch.randn(1, 8, 6, 8))


def test_bad_window_size():
    with pytest.raises(ValueError, match=r'window_size must be a positive int, got 0'):
        WindowAttention2d(8, window_size=0)


def test_dense_prediction_sized_map_is_finite():
    """A 800x1333 input's stride-8 map (100x167): windows of 7 do not divide it."""
    torch.manual_seed(4)
    layer = WindowAttention2d(4, num_heads=1, head_dim=4, window_size=7).eval()
    with torch.no_grad():
        out = layer(torch.randn(1, 4, 100, 167))
    assert out.shape == (1, 4, 100, 167)
    assert torch.isfinite(out).all()


def test_gradients_reach_the_bias_table(layer):
    x = torch.randn(1, 6, 5, 5, dtype=torch.float64)
    layer.train()
    layer(x).sum().backward()
    assert layer.relative_position_bias_table.grad is not None
    assert layer.relative_position_bias_table.grad.abs().sum() > 0
