""" Local (windowed) multi-head self-attention on a (B, C, H, W) map, as in AlterNet.

Non-overlapping, non-shifted windows; one relative-position-bias table shared by all heads
("How Do Vision Transformers Work?", Park & Kim, ICLR 2022). Attention runs through
``F.scaled_dot_product_attention`` with the bias as its float mask. Maps the window does not divide
are zero-padded at the bottom/right and the padded keys masked, so any input size works (the
official code raises on them); ``pad_to_window=False`` turns that into a clear error instead.
"""

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.swin_transformer import get_relative_position_index
from torch import nn

__all__ = ['WindowAttention2d']


class WindowAttention2d(nn.Module):
    """ Multi-head self-attention inside ``window_size`` x ``window_size`` windows of a (B, C, H, W) map.

    The bias table follows timm's Swin orientation (``bias[q, k] = table[idx(q - k)]``) but is one flat
    ((2 ws - 1) ** 2,) table: every head adds the same bias. The output is (B, dim_out, H, W).
    """

    def __init__(
            self,
            dim: int,
            dim_out: int | None = None,
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
        if window_size < 1:
            raise ValueError(f'window_size must be a positive int, got {window_size}')
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.window_size = window_size
        self.pad_to_window = pad_to_window
        self.attn_drop = attn_drop
        attn_dim = num_heads * head_dim
        dim_out = dim_out or dim

        self.relative_position_bias_table = nn.Parameter(torch.empty((2 * window_size - 1) ** 2, **dd))
        self.register_buffer(
            'relative_position_index',
            torch.empty(window_size ** 2, window_size ** 2, device=device, dtype=torch.long),
            persistent=False,
        )
        self.qkv = nn.Linear(dim, 3 * attn_dim, bias=qkv_bias, **dd)
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
        n = self.window_size ** 2
        return self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n)

    def _num_windows(self, height: int, width: int) -> tuple[int, int]:
        """Windows along H and W (ceil), checked against ``pad_to_window``. Written as ceil-divisions so
        torch.compile's dynamic shapes stay simple (Hp = nh * ws rather than H + (-H) % ws)."""
        ws = self.window_size
        nh, nw = (height + ws - 1) // ws, (width + ws - 1) // ws
        if (nh * ws != height or nw * ws != width) and not self.pad_to_window:
            why = 'is smaller than' if height < ws or width < ws else 'is not divisible by'
            raise ValueError(
                f'Feature map {height}x{width} {why} window_size {ws} and pad_to_window=False: use '
                f'pad_to_window=True (pads and masks) or a window_size that divides every stage\'s map.')
        return nh, nw

    def _attn_mask(self, height: int, width: int, nh: int, nw: int, dtype: torch.dtype) -> torch.Tensor:
        """Bias (1, 1, N, N), or bias plus -inf on padded keys (num_windows, 1, N, N)."""
        bias = self.relative_position_bias().to(dtype)
        ws = self.window_size
        if nh * ws == height and nw * ws == width:
            return bias[None, None]
        rows = torch.arange(nh * ws, device=bias.device) < height
        cols = torch.arange(nw * ws, device=bias.device) < width
        valid = (rows[:, None] & cols[None, :])[None, :, :, None]  # (1, Hp, Wp, 1)
        valid_keys = _partition(valid, ws, nh, nw)  # (1, nW, N, 1)
        return bias.masked_fill(~valid_keys.reshape(nh * nw, 1, 1, ws * ws), float('-inf'))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        ws = self.window_size
        nh, nw = self._num_windows(H, W)
        x = x.permute(0, 2, 3, 1)
        if nh * ws != H or nw * ws != W:
            x = F.pad(x, (0, 0, 0, nw * ws - W, 0, nh * ws - H))

        q, k, v = self.qkv(_partition(x, ws, nh, nw)).reshape(
            B, nh * nw, ws * ws, 3, self.num_heads, self.head_dim).permute(3, 0, 1, 4, 2, 5).unbind(0)
        mask = self._attn_mask(H, W, nh, nw, q.dtype)  # each of q, k, v: (B, nW, heads, N, head_dim)
        x = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.attn_drop if self.training else 0.)

        x = _merge(x.transpose(2, 3).reshape(B, nh * nw, ws * ws, -1), ws, nh, nw)[:, :H, :W]
        x = self.proj_drop(self.proj(x))
        return x.permute(0, 3, 1, 2)


def _partition(x: torch.Tensor, ws: int, nh: int, nw: int) -> torch.Tensor:
    """(B, nh*ws, nw*ws, C) -> (B, nh*nw, ws*ws, C), windows row-major. Explicit counts keep shapes simple
    for torch.compile's dynamic shapes (timm's window_partition infers them with -1)."""
    B, C = x.shape[0], x.shape[-1]
    return x.reshape(B, nh, ws, nw, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, nh * nw, ws * ws, C)


def _merge(windows: torch.Tensor, ws: int, nh: int, nw: int) -> torch.Tensor:
    """Inverse of ``_partition``: (B, nh*nw, ws*ws, C) -> (B, nh*ws, nw*ws, C)."""
    B, C = windows.shape[0], windows.shape[-1]
    return windows.reshape(B, nh, nw, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, nh * ws, nw * ws, C)
