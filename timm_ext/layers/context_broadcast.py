""" Context Broadcasting (CB) and its dimension-scaled variant (CB_S).

Paper: 'Scratching Visual Transformer's Back with Uniform Attention' (Hyeon-Woo et al., ICCV 2023),
https://arxiv.org/abs/2210.08457

ViTs spend capacity learning dense (near-uniform) attention, which softmax finds hardest to learn.
CB supplies it for free by adding the token mean back to every token:

    CB(x_i)   = (x_i + mean_j x_j) / 2               no parameters (the paper's one line)
    CB_S(x_i) = x_i + Lambda * mean_j x_j             Lambda: one learnable value per channel

``CBMlp`` is timm's ``Mlp`` with CB at its output, the paper's best placement ("End" of the MLP,
Table 4b). It keeps every ``Mlp`` key, so pretrained timm weights load into it unchanged.

The tensor layout is fixed when the layer is built (``input_fmt``), never read off the input in
``forward``, so the layers trace with ``torch.fx`` and compile with TorchScript like timm's own.
"""
import copy
import numbers
from typing import Callable, List, Optional, Tuple, Type, Union

import torch
import torch.nn as nn
from timm.layers import Format, Mlp, _assert, get_channel_dim, get_spatial_dim

__all__ = ['ContextBroadcast', 'CBMlp', 'check_cb_init']

_NDIM = {Format.NLC: 3, Format.NCL: 3, Format.NCHW: 4, Format.NHWC: 4}


def check_cb_init(init_value: Optional[float], scaled: bool, name: str = 'cb_init') -> None:
    """``init_value`` (the argument ``name``) is CB_S's initial Lambda: a real number, and only meaningful when
    ``scaled``; shared by the layers, the CB models and the retrofit, so each refuses it with the same line."""
    if init_value is None:
        return
    if isinstance(init_value, bool) or not isinstance(init_value, numbers.Real):
        raise ValueError(f'{name} must be a number (the initial Lambda of CB_S), got {init_value!r}.')
    if not scaled:
        raise ValueError(
            f'{name}={init_value!r} sets the initial Lambda of CB_S, but this is plain CB (scaled=False), '
            f'which has no Lambda; use CB_S (a *_cbs model, cb_scaled=True / scaled=True) or drop {name}.')


class ContextBroadcast(nn.Module):
    """ Add the token mean to every token of a (B, N, C) token tensor (or a map in ``input_fmt``).

    Args:
        dim: channel count C; only needed (and checked) when ``scaled=True``.
        scaled: False gives CB ``(x + mean) / 2``; True gives CB_S ``x + Lambda * mean``.
        init_value: initial value of every entry of Lambda (CB_S only; default 1.0). The paper does
            not state it; 1.0 starts CB_S with CB's 1:1 ratio of token to context (CB_S then equals
            2 * CB), so both variants begin with the same token mixing.
        num_prefix_tokens: leading tokens (class/register) left out of the mean of a (B, N, C)
            input; they still receive the broadcast. 0 (default) averages all tokens, as the paper.
        input_fmt: layout of the input: 'NLC' (B, N, C) tokens (default), 'NCHW' / 'NHWC' feature
            maps (mean over H, W) or 'NCL'.
    """
    num_prefix_tokens: torch.jit.Final[int]
    input_ndim: torch.jit.Final[int]
    channel_dim: torch.jit.Final[int]

    def __init__(
            self,
            dim: Optional[int] = None,
            scaled: bool = False,
            init_value: Optional[float] = None,
            num_prefix_tokens: int = 0,
            input_fmt: Union[str, Format] = 'NLC',
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        if scaled and (dim is None or dim <= 0):
            raise ValueError(f'ContextBroadcast(scaled=True) needs the channel count dim > 0, got dim={dim!r}.')
        check_cb_init(init_value, scaled, 'init_value')
        if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
            raise ValueError(f'num_prefix_tokens must be an int >= 0, got {num_prefix_tokens!r}.')
        if input_fmt not in _NDIM:
            raise ValueError(f'Unknown input_fmt {input_fmt!r}; valid: {", ".join(f.value for f in _NDIM)}.')
        input_fmt = Format(input_fmt)
        if num_prefix_tokens and input_fmt is not Format.NLC:
            raise ValueError(f'num_prefix_tokens={num_prefix_tokens} needs (B, N, C) tokens (input_fmt="NLC"), '
                             f'got input_fmt={input_fmt.value!r}.')
        self.scaled = scaled
        self.init_value = 1.0 if init_value is None else float(init_value)
        self.num_prefix_tokens = num_prefix_tokens
        self.input_fmt = input_fmt.value
        self.input_ndim = _NDIM[input_fmt]
        self.channel_dim = get_channel_dim(input_fmt)
        self.token_dims: List[int] = list(get_spatial_dim(input_fmt))
        # Lambda is stored as (C,) whatever the layout (checkpoint keys and shapes do not depend on it)
        self.gamma_shape: List[int] = [-1] + [1] * (self.input_ndim - 1 - self.channel_dim)
        if scaled:
            self.gamma = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
            self.reset_parameters()
        else:
            self.register_parameter('gamma', None)

    def reset_parameters(self) -> None:
        if self.gamma is not None:
            nn.init.constant_(self.gamma, self.init_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _assert(x.ndim == self.input_ndim,
                f'ContextBroadcast(input_fmt={self.input_fmt}) expects a {self.input_ndim}-D tensor, got shape '
                f'{x.shape}.')
        tokens = x[:, self.num_prefix_tokens:] if self.num_prefix_tokens else x
        context = tokens.mean(dim=self.token_dims, keepdim=True)
        if self.gamma is None:
            return (x + context) * 0.5
        _assert(x.shape[self.channel_dim] == self.gamma.shape[0],
                f'ContextBroadcast(scaled=True) was built for {self.gamma.shape[0]} channels, got '
                f'{x.shape[self.channel_dim]} in input of shape {x.shape}.')
        return x + self.gamma.view(self.gamma_shape) * context

    def extra_repr(self) -> str:
        s = f'scaled={self.scaled}, input_fmt={self.input_fmt}'
        if self.num_prefix_tokens:
            s += f', num_prefix_tokens={self.num_prefix_tokens}'
        return s


def _reuse(module: nn.Module) -> Callable[..., nn.Module]:
    """A layer factory for ``Mlp.__init__`` that returns a copy of ``module`` (keeps e.g. GELU's approximation)."""
    return lambda *args, **kwargs: copy.deepcopy(module)


class CBMlp(Mlp):
    """ timm ``Mlp`` followed by Context Broadcasting: CB at the "End" of the MLP branch.

    A drop-in ``mlp_layer`` for timm blocks, e.g.
    ``timm.create_model('vit_small_patch16_224', mlp_layer=CBMlp)`` puts CB in every block. With
    ``use_conv=True`` (1x1 convs on a (B, C, H, W) map) the mean is spatial.
    """

    def __init__(
            self,
            in_features: int,
            hidden_features: Optional[int] = None,
            out_features: Optional[int] = None,
            act_layer: Callable[..., nn.Module] = nn.GELU,
            norm_layer: Optional[Callable[..., nn.Module]] = None,
            bias: Union[bool, Tuple[bool, bool]] = True,
            drop: Union[float, Tuple[float, float]] = 0.,
            use_conv: bool = False,
            cb_scaled: bool = False,
            cb_init: Optional[float] = None,
            cb_num_prefix_tokens: int = 0,
            device=None,
            dtype=None,
    ) -> None:
        check_cb_init(cb_init, cb_scaled, 'cb_init')
        super().__init__(
            in_features, hidden_features, out_features, act_layer=act_layer, norm_layer=norm_layer, bias=bias,
            drop=drop, use_conv=use_conv, device=device, dtype=dtype)
        self.cb = ContextBroadcast(
            out_features or in_features,
            scaled=cb_scaled,
            init_value=cb_init,
            num_prefix_tokens=cb_num_prefix_tokens,
            input_fmt='NCHW' if use_conv else 'NLC',
            device=device,
            dtype=dtype,
        )

    @classmethod
    def from_mlp(
            cls: Type['CBMlp'],
            mlp: Mlp,
            cb_scaled: bool = False,
            cb_init: Optional[float] = None,
            cb_num_prefix_tokens: int = 0,
    ) -> 'CBMlp':
        """A ``CBMlp`` with the layers, weights and mode of ``mlp`` (a timm ``Mlp``), ending with a new CB.

        Built through ``__init__`` with ``mlp``'s configuration, then loads ``mlp``'s state (strict), so
        the weights are copied: create optimizers after retrofitting. A ``CBMlp`` gets its CB replaced.
        """
        if not isinstance(mlp, Mlp):
            raise ValueError(f'CBMlp.from_mlp needs a timm Mlp, got {type(mlp).__name__}.')
        fc1, fc2 = mlp.fc1, mlp.fc2
        use_conv = isinstance(fc1, nn.Conv2d)
        new = cls(
            fc1.in_channels if use_conv else fc1.in_features,
            fc1.out_channels if use_conv else fc1.out_features,
            fc2.out_channels if use_conv else fc2.out_features,
            act_layer=_reuse(mlp.act),
            norm_layer=None if isinstance(mlp.norm, nn.Identity) else _reuse(mlp.norm),
            bias=(fc1.bias is not None, fc2.bias is not None),
            drop=(mlp.drop1.p, mlp.drop2.p),
            use_conv=use_conv,
            cb_scaled=cb_scaled,
            cb_init=cb_init,
            cb_num_prefix_tokens=cb_num_prefix_tokens,
            device=fc1.weight.device,
            dtype=fc1.weight.dtype,
        )
        state = {k: v for k, v in mlp.state_dict().items() if not k.startswith('cb.')}
        state.update({f'cb.{k}': v for k, v in new.cb.state_dict().items()})
        new.load_state_dict(state)
        old = dict(mlp.named_parameters())
        for name, param in new.named_parameters():
            if name in old and not name.startswith('cb.'):  # a frozen layer stays frozen
                param.requires_grad_(old[name].requires_grad)
        return new.train(mlp.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Mlp's forward, spelled out: TorchScript cannot call super().forward
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return self.cb(x)
