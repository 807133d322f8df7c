""" Conv2d that picks a faster CPU route on small channels-last maps

oneDNN's channels-last convolutions are slow when the output map is tiny (the last ResNet stage: 4 x 4 at 32 px,
7 x 7 at 224 px). Measured on 2 CPU threads (AlterNet-50 CIFAR shapes, batch 32): a 3 x 3 conv 512 -> 512 on a
4 x 4 map takes 12.7 ms channels-last vs 6.9 ms in NCHW, and a 1 x 1 conv 2048 -> 512 there 7.2 ms vs 3.8 ms as a
plain GEMM over the channels-last rows. Larger maps show no such gap (a GEMM is slower there), so the switch is
by output size. Same weights and state-dict keys as ``nn.Conv2d``, same numbers up to float rounding; CUDA,
NCHW inputs and larger maps take ``nn.Conv2d``'s own path. docs/alternet.md#speed has the whole-model effect.
"""
from typing import Final, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import get_padding, register_notrace_module

from timm_ext.layers.memory_format import is_channels_last

__all__ = ['SMALL_MAP_PIXELS', 'SmallMapConv2d', 'create_small_map_conv2d']

# Output maps of at most this many pixels take the small-map route: 7 x 7 (ImageNet's last stage) and below.
SMALL_MAP_PIXELS = 49


@register_notrace_module  # reason: the route follows the input's size and memory format
class SmallMapConv2d(nn.Conv2d):
    """ ``nn.Conv2d``; on CPU, for a channels-last input whose output map has at most ``SMALL_MAP_PIXELS``
    pixels, a 1 x 1 unpadded ungrouped conv runs as one GEMM over the (strided) channels-last rows and any other
    conv runs in NCHW. The output stays channels-last either way. """
    small_map_pixels: Final[int] = SMALL_MAP_PIXELS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.takes_small_map_route(x):
            if self._is_pointwise():
                out_h, out_w = self._output_size(x.shape[-2], x.shape[-1])
                return self._pointwise_gemm(x, out_h, out_w)
            y = self._conv_forward(x.contiguous(), self.weight, self.bias)
            return y.contiguous(memory_format=torch.channels_last)
        return self._conv_forward(x, self.weight, self.bias)

    def takes_small_map_route(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (CPU, channels-last, output map of at most ``small_map_pixels``) leaves oneDNN's path."""
        if not (x.is_cpu and x.dim() == 4 and is_channels_last(x)):
            return False
        out_h, out_w = self._output_size(x.shape[-2], x.shape[-1])
        return out_h * out_w <= self.small_map_pixels

    def _is_pointwise(self) -> bool:
        return (
            self.kernel_size[0] == 1 and self.kernel_size[1] == 1 and self.groups == 1
            and self.padding_mode == 'zeros' and not isinstance(self.padding, str)
            and self.padding[0] == 0 and self.padding[1] == 0)

    def _output_size(self, height: int, width: int) -> Tuple[int, int]:
        if isinstance(self.padding, str):  # 'same' keeps the size (stride 1 only); 'valid' pads nothing
            if self.padding == 'same':
                return height, width
            pad_h, pad_w = 0, 0
        else:
            pad_h, pad_w = self.padding[0], self.padding[1]
        out_h = (height + 2 * pad_h - self.dilation[0] * (self.kernel_size[0] - 1) - 1) // self.stride[0] + 1
        out_w = (width + 2 * pad_w - self.dilation[1] * (self.kernel_size[1] - 1) - 1) // self.stride[1] + 1
        return out_h, out_w

    def _pointwise_gemm(self, x: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
        if self.stride[0] != 1 or self.stride[1] != 1:
            x = x[:, :, ::self.stride[0], ::self.stride[1]]
        rows = x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])  # (B * H * W, C); a view for a channels-last map
        y = F.linear(rows, self.weight.reshape(self.out_channels, -1), self.bias)
        return y.view(x.shape[0], out_h, out_w, self.out_channels).permute(0, 3, 1, 2)


def create_small_map_conv2d(
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = False,
        padding: Optional[Union[int, str]] = None,
        device=None,
        dtype=None,
) -> SmallMapConv2d:
    """``timm.layers.create_conv2d``'s signature and defaults (no bias, symmetric 'same'-style padding) for the
    ``conv_layer=`` argument of timm's blocks, building a ``SmallMapConv2d``."""
    if padding is None or padding == '':
        padding = get_padding(kernel_size, stride, dilation)
    return SmallMapConv2d(
        in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation, groups=groups,
        bias=bias, device=device, dtype=dtype)
