""" Conv2d that picks the faster CPU route on small channels-last maps

oneDNN's channels-last convolutions can be slow when the output map is tiny (the last ResNet stage: 4 x 4 at
32 px, 7 x 7 at 224 px), and a GEMM over the channels-last rows or a conv in NCHW can be faster there; by how much,
and whether at all, depends on the CPU. On an Intel Xeon (2 threads, AlterNet-50 CIFAR shapes, batch 32) a 3 x 3
conv 512 -> 512 on a 4 x 4 map took 12.7 ms channels-last vs 6.9 ms in NCHW, and a 1 x 1 conv 2048 -> 512 there
7.2 ms vs 3.8 ms as a GEMM; on an AMD EPYC the same 3 x 3 conv takes 6.3 vs 5.7 ms but the 1 x 1 conv 3.3 ms
channels-last vs 5.3 ms as a GEMM. So no fixed rule is right on both: for each shape (input size, conv settings,
dtype, threads, whether a backward follows) the first call times both routes and the faster one is kept for the
process, the way ``torch.backends.cudnn.benchmark`` does. Only output maps of at most ``SMALL_MAP_PIXELS`` pixels
are candidates (larger maps favoured ``nn.Conv2d`` on both CPUs and never pay for the timing).

``set_small_map_autotune(False)``, the ``small_map_autotune(False)`` context, ``TIMM_EXT_SMALL_MAP_AUTOTUNE=0``,
``torch.use_deterministic_algorithms(True)``, TorchScript, ``torch.jit.trace`` and ``torch.compile`` use the fixed
rule instead (every candidate shape takes the small-map route), so a run does not depend on timings. Same weights
and state-dict keys as ``nn.Conv2d``, same numbers up to float rounding; CUDA and NCHW inputs take ``nn.Conv2d``'s
own path. docs/alternet.md#speed has the whole-model effect.
"""
import contextlib
import os
import statistics
import time
from typing import Callable, Dict, Final, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import get_padding, register_notrace_module

from timm_ext.layers.memory_format import is_channels_last

__all__ = [
    'SMALL_MAP_PIXELS', 'SmallMapConv2d', 'autotune_from_env', 'clear_small_map_routes', 'create_small_map_conv2d',
    'median_seconds', 'set_small_map_autotune', 'small_map_autotune', 'small_map_autotune_enabled']

# Output maps of at most this many pixels are candidates for the small-map route: 7 x 7 (ImageNet's last stage)
# and below. 8 x 8 and larger maps were faster through nn.Conv2d on both CPUs measured (docs/alternet.md#speed).
SMALL_MAP_PIXELS = 49

AUTOTUNE_ENV = 'TIMM_EXT_SMALL_MAP_AUTOTUNE'
AUTOTUNE_REPS = 3  # timed calls per route after one warm-up; the median is compared


def autotune_from_env() -> bool:
    """The ``TIMM_EXT_SMALL_MAP_AUTOTUNE`` switch (1, the default, or 0); a one-line error for anything else."""
    value = os.environ.get(AUTOTUNE_ENV, '1').strip()
    if value not in ('0', '1'):
        raise ValueError(
            f'{AUTOTUNE_ENV}={value!r}: use 1 (time both small-map routes, keep the faster) or 0 (fixed rule)')
    return value == '1'


_autotune = autotune_from_env()
_routes: Dict[tuple, bool] = {}  # route key -> takes the small-map route


def set_small_map_autotune(enabled: bool) -> None:
    """Time both routes per shape and keep the faster (True, the default) or use the fixed rule (False: every
    candidate shape takes the small-map route, whatever the timings; for bit-reproducible runs)."""
    global _autotune
    _autotune = bool(enabled)


def small_map_autotune_enabled() -> bool:
    return _autotune


@contextlib.contextmanager
def small_map_autotune(enabled: bool) -> Iterator[None]:
    """``set_small_map_autotune(enabled)`` inside the block, the previous setting after it."""
    previous = _autotune
    set_small_map_autotune(enabled)
    try:
        yield
    finally:
        set_small_map_autotune(previous)


def clear_small_map_routes() -> None:
    """Forget the routes chosen so far: the next call of each shape times both routes again."""
    _routes.clear()


def median_seconds(routes: Dict[str, Callable[[], None]], reps: int = AUTOTUNE_REPS) -> Dict[str, float]:
    """Median wall time per call of each route, after one warm-up, run in turn (A, B, A, B, ...) so that machine
    noise hits both."""
    for fn in routes.values():
        fn()
    times: Dict[str, List[float]] = {name: [] for name in routes}
    for _ in range(reps):
        for name, fn in routes.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _keep_saved(t: torch.Tensor) -> torch.Tensor:
    return t


@register_notrace_module  # reason: the route follows the input's size and memory format
class SmallMapConv2d(nn.Conv2d):
    """ ``nn.Conv2d``; on CPU, for a channels-last input whose output map has at most ``SMALL_MAP_PIXELS``
    pixels, the faster of two routes, timed at the first call of each shape: ``nn.Conv2d``'s own, or the small-map
    route (a 1 x 1 unpadded ungrouped conv as one GEMM over the (strided) channels-last rows, any other conv in
    NCHW). The output stays channels-last either way. """
    small_map_pixels: Final[int] = SMALL_MAP_PIXELS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.takes_small_map_route(x):
            return self._small_map_forward(x, self.weight, self.bias)
        return self._conv_forward(x, self.weight, self.bias)

    def takes_small_map_route(self, x: torch.Tensor) -> bool:
        """Whether ``x`` leaves oneDNN's path: CPU, channels-last, output map of at most ``small_map_pixels``,
        and (with autotuning on) the small-map route timed faster for this shape."""
        if not (x.is_cpu and x.dim() == 4 and is_channels_last(x)):
            return False
        out_h, out_w = self.output_size(x.shape[-2], x.shape[-1])
        if out_h * out_w > self.small_map_pixels:
            return False
        if torch.jit.is_scripting():
            return True  # the fixed rule
        return self._tuned_route(x)

    @torch.jit.unused
    def _tuned_route(self, x: torch.Tensor) -> bool:
        if (torch.compiler.is_compiling() or torch.jit.is_tracing() or not _autotune
                or torch.are_deterministic_algorithms_enabled()):
            return True  # the fixed rule
        params = [p for p in (self.weight, self.bias) if p is not None]
        records_grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))
        key = (
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding, self.dilation,
            self.groups, self.bias is not None, tuple(x.shape), x.dtype, self.weight.dtype,
            torch.is_autocast_enabled('cpu') and torch.get_autocast_dtype('cpu'), torch.get_num_threads(),
            records_grad and (x.requires_grad, *(p.requires_grad for p in params)))
        route = _routes.get(key)
        if route is None:
            route = _routes[key] = self._time_routes(x, records_grad)
        return route

    def _time_routes(self, x: torch.Tensor, records_grad: bool) -> bool:
        """Whether the small-map route beats ``nn.Conv2d``'s own on detached copies of ``x`` and the weights:
        the forward alone, or (when this call records a graph) forward + backward, since the backward of the two
        routes differs as well. Ties keep ``nn.Conv2d``."""
        inputs = [t.detach().requires_grad_(records_grad and t.requires_grad)
                  for t in (x, self.weight, self.bias) if t is not None]
        x_, weight = inputs[0], inputs[1]
        bias = inputs[2] if self.bias is not None else None
        needs_grad = [t for t in inputs if t.requires_grad]

        def run(route: Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]):
            def call() -> None:
                if not needs_grad:
                    with torch.no_grad():
                        route(x_, weight, bias)
                    return
                # own saved-tensor hooks: an enclosing checkpoint must not see this private graph
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_keep_saved, _keep_saved):
                    y = route(x_, weight, bias)
                    torch.autograd.grad(y, needs_grad, torch.ones_like(y))
            return call

        times = median_seconds({'conv2d': run(self._conv_forward), 'small_map': run(self._small_map_forward)})
        return times['small_map'] < times['conv2d']

    def _small_map_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if self._is_pointwise():
            out_h, out_w = self.output_size(x.shape[-2], x.shape[-1])
            return self._pointwise_gemm(x, weight, bias, out_h, out_w)
        y = self._conv_forward(x.contiguous(), weight, bias)
        return y.contiguous(memory_format=torch.channels_last)

    def _is_pointwise(self) -> bool:
        return (
            self.kernel_size[0] == 1 and self.kernel_size[1] == 1 and self.groups == 1
            and self.padding_mode == 'zeros' and not isinstance(self.padding, str)
            and self.padding[0] == 0 and self.padding[1] == 0)

    def output_size(self, height: int, width: int) -> Tuple[int, int]:
        """The output map's (height, width) for an input map of ``height`` x ``width``."""
        if isinstance(self.padding, str):  # 'same' keeps the size (stride 1 only); 'valid' pads nothing
            if self.padding == 'same':
                return height, width
            pad_h, pad_w = 0, 0
        else:
            pad_h, pad_w = self.padding[0], self.padding[1]
        out_h = (height + 2 * pad_h - self.dilation[0] * (self.kernel_size[0] - 1) - 1) // self.stride[0] + 1
        out_w = (width + 2 * pad_w - self.dilation[1] * (self.kernel_size[1] - 1) - 1) // self.stride[1] + 1
        return out_h, out_w

    def _pointwise_gemm(
            self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], out_h: int, out_w: int,
    ) -> torch.Tensor:
        if self.stride[0] != 1 or self.stride[1] != 1:
            x = x[:, :, ::self.stride[0], ::self.stride[1]]
        rows = x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])  # (B * H * W, C); a view for a channels-last map
        y = F.linear(rows, weight.reshape(self.out_channels, -1), bias)
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
