"""GELU, LayerNorm, Conv2d and eval-mode BatchNorm whose second derivatives are cheap to apply again and again.

A Hessian-vector product by double backward runs the backward of the gradient graph. torch's double
backwards for these layers are generic composites that rebuild, on every product, factors that do not depend
on the vector. Power iteration, Lanczos and Hutchinson reuse one gradient graph for tens of products, so
here those factors are computed at the first product and kept with the graph:

* GELU: ``gelu'(x)`` and ``gy * gelu''(x)``; each product is then two multiplications (torch: about nine
  passes over the MLP's hidden activations, a third of a warm product of a ViT at batch 64).
* LayerNorm: the closed form (derivation in ``_LayerNormGrad.backward``) with the normalised input, the
  scaled gradient and its projection kept: about 17 passes over the rows (torch: some 40 operations).
* Conv2d: the double backward as four plain oneDNN convolutions (torch's goes partly through slower
  transposed-weight paths: 3.0x -> 2.4x a forward+backward on ``resnet50_cifar``).
* BatchNorm in eval mode: a per-channel affine map, so a few multiplications (torch's generic one also
  computes the batch-statistics terms: a quarter of a warm product on AlterNet).

Each is checked by ``gradgradcheck`` and whole-model products against torch's own in the tests. A third
derivative raises (``once_differentiable``) instead of using the cached factors wrongly. Used only inside
:func:`timm_ext.analysis.hessian.hessian_context`, which swaps the ``forward`` of those modules for the
duration and restores it on exit.
"""
import contextlib
import math
import types
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

__all__ = ['batch_norm_eval', 'conv2d', 'gelu', 'layer_norm', 'second_order_activations']

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class _GeluGrad(torch.autograd.Function):
    """``gy * gelu'(x)``; its backward caches the factors that do not depend on the incoming gradient."""

    @staticmethod
    def forward(ctx, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad, x)
        ctx.factors = None
        return torch.ops.aten.gelu_backward(grad, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, ggx: torch.Tensor) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        if ctx.factors is None:
            grad, x = ctx.saved_tensors
            first = torch.ops.aten.gelu_backward(torch.ones_like(x), x)  # gelu'(x) = Phi(x) + x phi(x)
            x_sq = x.square()
            # gy * gelu''(x) = gy * phi(x) * (2 - x^2)
            second = x_sq.mul(-0.5).exp_().mul_(_INV_SQRT_2PI).mul_(x_sq.neg_().add_(2.0)).mul_(grad)
            ctx.factors = (first, second)
        first, second = ctx.factors
        return (ggx * first if ctx.needs_input_grad[0] else None,
                ggx * second if ctx.needs_input_grad[1] else None)


class _Gelu(torch.autograd.Function):
    """Exact GELU whose backward is :class:`_GeluGrad` (differentiable once more)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return _GeluGrad.apply(grad, x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x)`` (exact, erf form), with a double backward that caches its vector-independent factors."""
    return _Gelu.apply(x)


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    return t.reshape(-1, d)


def _project(z: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """``z - mean(z) - x_hat * mean(z * x_hat)`` per row: the LayerNorm Jacobian without its ``rstd``."""
    return z - z.mean(1, keepdim=True) - x_hat * (z * x_hat).mean(1, keepdim=True)


class _LayerNormGrad(torch.autograd.Function):
    """(grad_input, grad_weight, grad_bias) of a LayerNorm over the last dims; closed-form backward with cached
    factors."""

    @staticmethod
    def forward(ctx, grad, x, weight, bias, mean, rstd, normalized_shape: List[int]):
        ctx.save_for_backward(grad, x, weight, mean, rstd)
        ctx.normalized_shape = normalized_shape
        ctx.factors = None
        mask = [True, weight is not None and ctx.needs_input_grad[2], bias is not None and ctx.needs_input_grad[3]]
        return torch.ops.aten.native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, mask)

    @staticmethod
    @once_differentiable
    def backward(ctx, u: Optional[torch.Tensor], u_weight: Optional[torch.Tensor], u_bias: Optional[torch.Tensor]):
        """Per row (D features), with x_hat = (x - mean) r, g = grad * weight, P(z) = z - mean(z) - x_hat mean(z x_hat),
        a = mean(g), b = mean(g x_hat), and u, u_w, u_b the gradients of grad_input = r P(g),
        grad_weight = sum_rows grad x_hat and grad_bias = sum_rows grad:

            d grad   = weight * r P(u) + u_w x_hat + u_b
            d weight = sum_rows grad * r P(u)
            d x      = -(r^2 / D) [(<u, g> - a sum(u) - <u, x_hat> b) x_hat + D b P(u) + <u, x_hat> P(g)]
                       + r P(u_w grad)

        (dr/dx = -r^2 x_hat / D and d x_hat / dx = r P, P symmetric.) x_hat, r, g, a, b, P(g) do not depend on
        (u, u_w): computed at the first product, kept with the graph."""
        grad, x, weight, mean, rstd = ctx.saved_tensors
        d = math.prod(ctx.normalized_shape)
        if ctx.factors is None:
            r = _rows(rstd, 1)
            x_hat = (_rows(x, d) - _rows(mean, 1)) * r
            g = _rows(grad, d) if weight is None else _rows(grad, d) * weight.reshape(1, d)
            a = g.mean(1, keepdim=True)
            b = (g * x_hat).mean(1, keepdim=True)
            ctx.factors = (r, x_hat, g, a, b, g - a - x_hat * b)
        r, x_hat, g, a, b, p_g = ctx.factors
        grad_rows = _rows(grad, d)
        if u is None:
            u = torch.zeros_like(x_hat)
        u = _rows(u, d)
        u_mean = u.mean(1, keepdim=True)
        ux_mean = (u * x_hat).mean(1, keepdim=True)
        p_u = u - u_mean - x_hat * ux_mean
        w = r * p_u
        d_grad = d_weight = d_x = None
        if ctx.needs_input_grad[0]:
            d_grad = w if weight is None else w * weight.reshape(1, d)
            if u_weight is not None:
                d_grad = d_grad + x_hat * u_weight.reshape(1, d)
            if u_bias is not None:
                d_grad = d_grad + u_bias.reshape(1, d)
            d_grad = d_grad.view_as(grad)
        if weight is not None and ctx.needs_input_grad[2]:
            d_weight = (grad_rows * w).sum(0).view_as(weight)
        if ctx.needs_input_grad[1]:
            s_u = d * ux_mean  # <u, x_hat>
            coef = (u * g).sum(1, keepdim=True) - a * (d * u_mean) - s_u * b
            d_x = (coef * x_hat).add_(p_u * (d * b)).add_(p_g * s_u).mul_(-r.square() / d)
            if u_weight is not None:
                d_x.add_(r * _project(grad_rows * u_weight.reshape(1, d), x_hat))
            d_x = d_x.view_as(x)
        return d_grad, d_x, d_weight, None, None, None, None


class _LayerNorm(torch.autograd.Function):
    """LayerNorm over the last dims whose backward is :class:`_LayerNormGrad` (differentiable once more)."""

    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape: List[int], eps: float):
        out, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.normalized_shape = normalized_shape
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        grad_input, grad_weight, grad_bias = _LayerNormGrad.apply(
            grad, x, weight, bias, mean, rstd, ctx.normalized_shape)
        return grad_input, grad_weight, grad_bias, None, None


def layer_norm(
        x: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor] = None,
        bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm`` with a closed-form double backward that caches its vector-independent factors."""
    return _LayerNorm.apply(x, weight, bias, list(normalized_shape), eps)


class _Conv2dGrad(torch.autograd.Function):
    """(grad_input, grad_weight) of a 2-D convolution; its backward is four oneDNN convolutions."""

    @staticmethod
    def forward(ctx, grad, x, weight, conv_args: Tuple, input_mask: List[bool]):
        ctx.save_for_backward(grad, x, weight)
        ctx.conv_args = conv_args
        grad_input, grad_weight, _ = torch.ops.aten.convolution_backward(
            grad, x, weight, None, *conv_args, [input_mask[0], input_mask[1], False])
        return grad_input, grad_weight

    @staticmethod
    @once_differentiable
    def backward(ctx, u: Optional[torch.Tensor], u_weight: Optional[torch.Tensor]):
        """grad_input = conv_input_grad(grad, weight), grad_weight = conv_weight_grad(x, grad), both bilinear:

            d grad   = conv(u, weight) + conv(x, u_w)
            d weight = conv_weight_grad(u, grad)
            d x      = conv_input_grad(grad, u_w)
        """
        grad, x, weight = ctx.saved_tensors
        stride, padding, dilation, _, _, groups = ctx.conv_args
        d_grad = d_x = d_weight = None
        if ctx.needs_input_grad[0]:
            if u is not None:
                d_grad = F.conv2d(u, weight, None, stride, padding, dilation, groups)
            if u_weight is not None:
                part = F.conv2d(x, u_weight, None, stride, padding, dilation, groups)
                d_grad = part if d_grad is None else d_grad.add_(part)
        if u is not None and ctx.needs_input_grad[2]:
            d_weight = torch.ops.aten.convolution_backward(
                grad, u, weight, None, *ctx.conv_args, [False, True, False])[1]
        if u_weight is not None and ctx.needs_input_grad[1]:
            d_x = torch.ops.aten.convolution_backward(
                grad, x, u_weight, None, *ctx.conv_args, [True, False, False])[0]
        return d_grad, d_x, d_weight, None, None


class _Conv2d(torch.autograd.Function):
    """2-D convolution whose backward is :class:`_Conv2dGrad` (differentiable once more)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(x, weight)
        ctx.conv_args = (stride, padding, dilation, False, [0, 0], groups)
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1]]
        grad_input = grad_weight = grad_bias = None
        if mask[0] or mask[1]:
            grad_input, grad_weight = _Conv2dGrad.apply(grad, x, weight, ctx.conv_args, mask)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum((0, 2, 3))
        return grad_input, grad_weight, grad_bias, None, None, None, None


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=(1, 1),
           padding=(0, 0), dilation=(1, 1), groups: int = 1) -> torch.Tensor:
    """``F.conv2d`` (int or pair padding, zeros mode) whose double backward runs as four plain convolutions."""
    pair = torch.nn.modules.utils._pair
    return _Conv2d.apply(x, weight, bias, list(pair(stride)), list(pair(padding)), list(pair(dilation)), groups)


def _channel(t: torch.Tensor) -> torch.Tensor:
    return t.view(1, -1, 1, 1)


class _EvalBatchNorm2d(torch.autograd.Function):
    """BatchNorm on running statistics (eval mode): ``F.batch_norm`` forward, a backward made of plain
    differentiable ops. In eval mode BatchNorm is a per-channel affine map, so its double backward is a few
    multiplications; torch's generic one computes the batch-statistics terms too (a quarter of a warm
    product on AlterNet)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps: float):
        ctx.save_for_backward(x, weight, running_mean, running_var)
        ctx.eps = eps
        ctx.has_bias = bias is not None
        return F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)

    @staticmethod
    def backward(ctx, grad):
        x, weight, running_mean, running_var = ctx.saved_tensors
        rstd = torch.rsqrt(running_var + ctx.eps)
        scale = rstd if weight is None else weight * rstd
        grad_input = grad * _channel(scale) if ctx.needs_input_grad[0] else None
        grad_weight = grad_bias = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (grad * ((x - _channel(running_mean)) * _channel(rstd))).sum((0, 2, 3))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum((0, 2, 3))
        return grad_input, grad_weight, grad_bias, None, None, None


def batch_norm_eval(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                    weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                    eps: float = 1e-5) -> torch.Tensor:
    """``F.batch_norm(x, running_mean, running_var, weight, bias, training=False, eps=eps)`` on (B, C, H, W),
    with a double backward of a few multiplications."""
    return _EvalBatchNorm2d.apply(x, weight, bias, running_mean, running_var, eps)


def _is_exact_gelu(module: nn.Module) -> bool:
    """torch's ``nn.GELU`` and timm's ``GELU`` in their exact (erf) form; tanh GELU keeps torch's path."""
    if isinstance(module, nn.GELU):
        return module.approximate == 'none'
    from timm.layers.activations import GELU as TimmGELU
    return type(module) is TimmGELU


def _is_last_dim_layer_norm(module: nn.Module) -> bool:
    """torch's ``nn.LayerNorm`` and timm's ``LayerNorm`` (both normalise the last dims); subclasses that permute
    first (timm's ``LayerNorm2d``) keep their own forward."""
    from timm.layers.norm import LayerNorm as TimmLayerNorm
    return type(module) in (nn.LayerNorm, TimmLayerNorm)


def _is_plain_conv2d(module: nn.Module) -> bool:
    """``nn.Conv2d`` itself (and timm-ext's ``SmallMapConv2d``), zero padding given as numbers."""
    from timm_ext.layers.small_map_conv import SmallMapConv2d
    return (type(module) in (nn.Conv2d, SmallMapConv2d) and module.padding_mode == 'zeros'
            and not isinstance(module.padding, str))


def _conv2d_forward(self: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    takes_route = getattr(self, 'takes_small_map_route', None)
    if takes_route is not None and takes_route(x):  # SmallMapConv2d on a tiny channels-last map
        if self._is_pointwise():
            return type(self).forward(self, x)  # a GEMM: its double backward is GEMMs already
        y = conv2d(x.contiguous(), self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return y.contiguous(memory_format=torch.channels_last)
    return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def _is_batch_norm_2d(module: nn.Module) -> bool:
    """``nn.BatchNorm2d`` and timm's ``BatchNormAct2d`` (norm, then its dropout and activation)."""
    from timm.layers import BatchNormAct2d
    return type(module) in (nn.BatchNorm2d, BatchNormAct2d)


def _batch_norm_forward(self: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    if self.training or self.running_mean is None or self.running_var is None or x.dim() != 4:
        return type(self).forward(self, x)  # batch statistics: torch's own path
    x = batch_norm_eval(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
    if hasattr(self, 'act'):  # BatchNormAct2d
        x = self.act(self.drop(x))
    return x


def _gelu_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return gelu(x)


def _layer_norm_forward(self: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


@contextlib.contextmanager
def second_order_activations(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the context, exact-GELU, last-dim LayerNorm, plain Conv2d and BatchNorm2d modules of ``model`` use
    :func:`gelu`, :func:`layer_norm`, :func:`conv2d` and (in eval mode) :func:`batch_norm_eval`; restored on exit.
    Modules whose ``forward`` is already replaced on the instance are left alone."""
    swapped: List[Tuple[nn.Module, types.MethodType]] = []
    try:
        for module in model.modules():
            if 'forward' in module.__dict__:
                continue
            if _is_exact_gelu(module):
                forward = _gelu_forward
            elif _is_last_dim_layer_norm(module):
                forward = _layer_norm_forward
            elif _is_plain_conv2d(module):
                forward = _conv2d_forward
            elif _is_batch_norm_2d(module):
                forward = _batch_norm_forward
            else:
                continue
            module.forward = types.MethodType(forward, module)
            swapped.append((module, module.forward))
        yield model
    finally:
        for module, forward in swapped:
            if module.__dict__.get('forward') is forward:  # not replaced meanwhile by someone else
                del module.forward
