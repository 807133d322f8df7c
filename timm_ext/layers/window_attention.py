""" Local (windowed) multi-head self-attention on a (B, C, H, W) map, as in AlterNet.

Non-overlapping, non-shifted windows; one relative-position-bias table shared by all heads
("How Do Vision Transformers Work?", Park & Kim, ICLR 2022). Maps the window does not divide are
zero-padded at the bottom/right and the padded keys masked, so any input size works (the official
code raises on them); ``pad_to_window=False`` turns that into a clear error instead.

Layout, chosen for speed: the module returns the memory format it is given (contiguous NCHW, or
channels-last), like the convs around it. The map is cut into window-major token rows by one copy and q/k/v
come from one GEMM over those rows. The attention output goes back to raster order (batch, row, column) by one
copy before the output projection, so the projected rows already are a channels-last map: no copy for a
channels-last input the window divides, one (to NCHW, or to crop the padding) otherwise. In eval mode q/k/v go
to ``F.scaled_dot_product_attention`` as 4-D strided views (its fused CPU kernel, no copy); in training the
bias needs its gradient, which that kernel does not give, so the softmax is explicit (batched matmuls) on
head-major q/k/v from ``split_heads`` (one copy, whose backward writes the three gradients back in one pass). The
window helpers depend on the input size, so they are FX leaves (``register_notrace_function``), as timm's
Swin window helpers are.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_function, trunc_normal_
from timm.models.swin_transformer import get_relative_position_index

from timm_ext.arg_types import positive_int
from timm_ext.layers.memory_format import contiguous_like, is_channels_last

__all__ = [
    'WindowAttention2d', 'raster_rows_to_nchw', 'split_heads', 'window_attention_mask', 'window_partition_nchw',
    'window_reverse_nchw', 'windows_to_raster_rows',
]


def _num_windows(height: int, width: int, window_size: int, pad_to_window: bool) -> Tuple[int, int]:
    """Windows along H and W (ceil); a ValueError if the window does not divide the map and padding is off."""
    nh = (height + window_size - 1) // window_size
    nw = (width + window_size - 1) // window_size
    if not pad_to_window and (nh * window_size != height or nw * window_size != width):
        why = 'is smaller than' if height < window_size or width < window_size else 'is not divisible by'
        raise ValueError(
            f'Feature map {height}x{width} {why} window_size {window_size} and pad_to_window=False: use '
            f'pad_to_window=True (pads and masks) or a window_size that divides every stage\'s map.')
    return nh, nw


@register_notrace_function  # reason: the window counts and padding follow the input size
def window_partition_nchw(x: torch.Tensor, window_size: int, pad_to_window: bool = True) -> torch.Tensor:
    """(B, C, H, W) -> (B * nh * nw * ws * ws, C) token rows: batch, window row, window column, then the
    window's tokens row-major. A map the window does not divide is zero-padded at the bottom/right first.
    One copy from a contiguous or a channels-last map (two when padding)."""
    B, C, H, W = x.shape
    ws = window_size
    nh, nw = _num_windows(H, W, ws, pad_to_window)
    x = x.permute(0, 2, 3, 1)
    if nh * ws != H or nw * ws != W:
        x = F.pad(x, [0, 0, 0, nw * ws - W, 0, nh * ws - H])
    return x.reshape(B, nh, ws, nw, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, C)


@register_notrace_function  # reason: the window counts and padding follow the input size
def window_reverse_nchw(tokens: torch.Tensor, like: torch.Tensor, window_size: int) -> torch.Tensor:
    """Inverse of ``window_partition_nchw(like, window_size)``: token rows -> (B, C, H, W) of ``like``'s size,
    padding cropped, in one copy; channels-last memory if ``like`` is channels-last, else contiguous."""
    B, _, H, W = like.shape
    C = tokens.shape[-1]
    ws = window_size
    nh, nw = (H + ws - 1) // ws, (W + ws - 1) // ws
    channels_last = is_channels_last(like)
    x = tokens.reshape(B, nh, nw, ws, ws, C)
    if channels_last:
        x = x.permute(0, 1, 3, 2, 4, 5).reshape(B, nh * ws, nw * ws, C).permute(0, 3, 1, 2)
    else:
        x = x.permute(0, 5, 1, 3, 2, 4).reshape(B, C, nh * ws, nw * ws)
    if nh * ws != H or nw * ws != W:
        x = contiguous_like(x[:, :, :H, :W], like)
    return x


@register_notrace_function  # reason: the window counts and padding follow the input size
def windows_to_raster_rows(out: torch.Tensor, like: torch.Tensor, window_size: int) -> torch.Tensor:
    """Attention output (B * nW, N, heads, head_dim), any strides, over the windows of
    ``window_partition_nchw(like, window_size)`` -> (B * Hp * Wp, heads * head_dim) rows in raster order
    (batch, row, column) of the padded map, in one copy whatever the strides.

    Always a copy, never a view: with a single window a reshape would be a view for SDPA's CPU kernel's
    token-major output and a copy for head-major strides, and torch.onnx's default exporter traces SDPA with
    either in different passes (a baked-in view then fails: 'Failed to decompose the FX graph')."""
    B, _, H, W = like.shape
    ws = window_size
    nh, nw = (H + ws - 1) // ws, (W + ws - 1) // ws
    heads, head_dim = out.shape[-2:]
    x = out.reshape(B, nh, nw, ws, ws, heads, head_dim).permute(0, 1, 3, 2, 4, 5, 6)  # splits dims only: a view
    return x.clone(memory_format=torch.contiguous_format).view(B * nh * ws * nw * ws, heads * head_dim)


@register_notrace_function  # reason: the window counts and padding follow the input size
def raster_rows_to_nchw(rows: torch.Tensor, like: torch.Tensor, window_size: int) -> torch.Tensor:
    """(B * Hp * Wp, C) raster rows of ``like``'s padded map -> (B, C, H, W), padding cropped, in ``like``'s
    memory format: a view (no copy) when ``like`` is channels-last and the window divides it, else one copy."""
    B, _, H, W = like.shape
    ws = window_size
    x = rows.view(B, (H + ws - 1) // ws * ws, (W + ws - 1) // ws * ws, rows.shape[-1])[:, :H, :W]
    return contiguous_like(x.permute(0, 3, 1, 2), like)


@register_notrace_function  # reason: the window counts and padding follow the input size
def window_attention_mask(bias: torch.Tensor, like: torch.Tensor, window_size: int) -> torch.Tensor:
    """Float mask for attention over the windows of ``window_partition_nchw(like, window_size)``: the (N, N)
    ``bias`` as (1, 1, N, N) when the window divides the map, else (B * nW, 1, N, N) with -inf on padded keys."""
    B, _, H, W = like.shape
    ws = window_size
    nh, nw = (H + ws - 1) // ws, (W + ws - 1) // ws
    if nh * ws == H and nw * ws == W:
        return bias[None, None]
    rows = torch.arange(nh * ws, device=bias.device) < H
    cols = torch.arange(nw * ws, device=bias.device) < W
    valid = (rows[:, None] & cols[None, :]).reshape(nh, ws, nw, ws).permute(0, 2, 1, 3).reshape(nh * nw, 1, 1, -1)
    return bias.masked_fill(~valid, float('-inf')).repeat(B, 1, 1, 1)


class _SplitHeads(torch.autograd.Function):
    """(T, 3 * heads * head_dim) q/k/v rows -> q, k, v, each (T / N * heads, N, head_dim) contiguous. The same
    bytes as autograd's permute + reshape + unbind, but the backward writes the three gradients straight into
    one buffer in the rows' layout; unbind's backward stacks them first (one full copy more per step)."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, n: int, heads: int, head_dim: int):
        ctx.n, ctx.heads, ctx.head_dim = n, heads, head_dim
        q, k, v = qkv.view(-1, n, 3, heads, head_dim).permute(2, 0, 3, 1, 4).reshape(3, -1, n, head_dim).unbind(0)
        return q, k, v

    @staticmethod
    def backward(ctx, *grads: Optional[torch.Tensor]):
        n, heads, head_dim = ctx.n, ctx.heads, ctx.head_dim
        like = next(g for g in grads if g is not None)
        out = like.new_empty(like.shape[0] // heads, n, 3, heads, head_dim)
        for i, g in enumerate(grads):
            if g is None:
                out[:, :, i].zero_()
            else:
                out[:, :, i].copy_(g.view(-1, heads, n, head_dim).transpose(1, 2))
        return out.view(-1, 3 * heads * head_dim), None, None, None


@register_notrace_function  # reason: an autograd.Function (an FX leaf, as timm's notrace helpers)
def split_heads(
        qkv: torch.Tensor, n: int, heads: int, head_dim: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(T, 3 * heads * head_dim) rows of T / n windows -> q, k, v as contiguous (windows * heads, n, head_dim)."""
    if torch.jit.is_scripting() or not torch.is_grad_enabled():
        q, k, v = qkv.view(-1, n, 3, heads, head_dim).permute(2, 0, 3, 1, 4).reshape(3, -1, n, head_dim).unbind(0)
        return q, k, v
    return _SplitHeads.apply(qkv, n, heads, head_dim)


class WindowAttention2d(nn.Module):
    """ Multi-head self-attention inside ``window_size`` x ``window_size`` windows of a (B, C, H, W) map.

    The bias table follows timm's Swin orientation (``bias[q, k] = table[idx(q - k)]``) but is one flat
    ((2 ws - 1) ** 2,) table: every head adds the same bias. The output is (B, dim_out, H, W), in the
    input's memory format.
    """

    def __init__(
            self,
            dim: int,
            dim_out: Optional[int] = None,
            num_heads: int = 8,
            head_dim: int = 64,
            window_size: int = 7,
            pad_to_window: bool = True,
            qkv_bias: bool = False,
            attn_drop: float = 0.,
            proj_drop: float = 0.,
            device=None,
            dtype=None,
    ) -> None:
        dd = {'device': device, 'dtype': dtype}
        super().__init__()
        positive_int('num_heads', num_heads)
        positive_int('head_dim', head_dim)
        positive_int('window_size', window_size)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.window_size = window_size
        self.pad_to_window = pad_to_window
        attn_dim = num_heads * head_dim
        dim_out = dim_out or dim

        self.relative_position_bias_table = nn.Parameter(torch.empty((2 * window_size - 1) ** 2, **dd))
        self.register_buffer(
            'relative_position_index',
            torch.empty(window_size ** 2, window_size ** 2, device=device, dtype=torch.long),
            persistent=False,
        )
        self.qkv = nn.Linear(dim, 3 * attn_dim, bias=qkv_bias, **dd)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(attn_dim, dim_out, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        trunc_normal_(self.relative_position_bias_table, std=.02)
        self._init_buffers()

    def _init_buffers(self) -> None:
        index = self.relative_position_index
        if index.device.type != 'meta':
            index.copy_(get_relative_position_index(self.window_size, self.window_size, device=index.device))

    def init_non_persistent_buffers(self) -> None:
        """Refill the index buffer (e.g. after materialising a model built on the meta device)."""
        self._init_buffers()

    def relative_position_bias(self) -> torch.Tensor:
        """The (N, N) bias, N = window_size ** 2, added to every head's logits."""
        n = self.window_size * self.window_size
        return self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, heads, head_dim = self.window_size * self.window_size, self.num_heads, self.head_dim
        tokens = window_partition_nchw(x, self.window_size, self.pad_to_window)  # (B * nW * N, C)
        qkv = self.qkv(tokens).view(-1, n, 3, heads, head_dim)
        mask = window_attention_mask(self.relative_position_bias().to(qkv.dtype), x, self.window_size)
        if self.training:
            # the bias needs its gradient, which the fused CPU kernel does not give: explicit softmax on
            # contiguous (B * nW * heads, N, head_dim) operands (one copy of q, k, v), faster than SDPA's fallback
            q, k, v = split_heads(qkv.view(-1, 3 * heads * head_dim), n, heads, head_dim)
            attn = torch.add(mask, torch.bmm(q, k.transpose(1, 2)).view(-1, heads, n, n), alpha=head_dim ** -0.5)
            attn = self.attn_drop(attn.softmax(dim=-1))
            out = torch.bmm(attn.view(-1, n, n), v).view(-1, heads, n, head_dim)
        else:
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B * nW, heads, N, head_dim) views
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        rows = windows_to_raster_rows(out.transpose(1, 2), x, self.window_size)  # (B * Hp * Wp, heads * head_dim)
        return raster_rows_to_nchw(self.proj_drop(self.proj(rows)), x, self.window_size)
