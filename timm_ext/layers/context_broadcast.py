""" Context Broadcasting (CB) and its dimension-scaled variant (CB_S).

Paper: 'Scratching Visual Transformer's Back with Uniform Attention' (Hyeon-Woo et al., ICCV 2023),
https://arxiv.org/abs/2210.08457

ViTs spend capacity learning dense (near-uniform) attention, which softmax finds hardest to learn.
CB supplies it for free by adding the token mean back to every token:

    CB(x_i)   = (x_i + mean_j x_j) / 2               no parameters (the paper's one line)
    CB_S(x_i) = x_i + Lambda * mean_j x_j             Lambda: one learnable value per channel

``CBMlp`` is timm's ``Mlp`` with CB at its output, the paper's best placement ("End" of the MLP,
Table 4b). It keeps every ``Mlp`` key, so pretrained timm weights load into it unchanged.
"""
from typing import Optional

import torch
from timm.layers import Mlp
from torch import nn

__all__ = ['ContextBroadcast', 'CBMlp']


class ContextBroadcast(nn.Module):
    """ Add the token mean to every token: (B, N, C) over N, or (B, C, H, W) over H, W.

    Args:
        dim: channel count C; only needed (and checked) when ``scaled=True``.
        scaled: False gives CB ``(x + mean) / 2``; True gives CB_S ``x + Lambda * mean``.
        init_value: initial value of every entry of Lambda (CB_S only). The paper does not state
            it; the default 1.0 starts CB_S with CB's 1:1 ratio of token to context (CB_S then
            equals 2 * CB), so both variants begin with the same token mixing.
        num_prefix_tokens: leading tokens (class/register) left out of the mean of a (B, N, C)
            input; they still receive the broadcast. 0 (default) averages all tokens, as the paper.
    """

    def __init__(
            self,
            dim: Optional[int] = None,
            scaled: bool = False,
            init_value: float = 1.0,
            num_prefix_tokens: int = 0,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        if scaled and (dim is None or dim <= 0):
            raise ValueError(f'ContextBroadcast(scaled=True) needs the channel count dim > 0, got dim={dim!r}.')
        if num_prefix_tokens < 0:
            raise ValueError(f'num_prefix_tokens must be >= 0, got {num_prefix_tokens!r}.')
        self.scaled = scaled
        self.init_value = init_value
        self.num_prefix_tokens = num_prefix_tokens
        if scaled:
            self.gamma = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
            self.reset_parameters()
        else:
            self.register_parameter('gamma', None)

    def reset_parameters(self) -> None:
        if self.gamma is not None:
            nn.init.constant_(self.gamma, self.init_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 3:
            context = x[:, self.num_prefix_tokens:].mean(dim=1, keepdim=True)
            channel_dim = 2
        elif x.ndim == 4:
            context = x.mean(dim=(2, 3), keepdim=True)
            channel_dim = 1
        else:
            raise ValueError(
                f'ContextBroadcast expects a (B, N, C) or (B, C, H, W) tensor, got shape {tuple(x.shape)}.')
        if self.gamma is None:
            return (x + context) * 0.5
        if x.shape[channel_dim] != self.gamma.shape[0]:
            raise ValueError(
                f'ContextBroadcast(scaled=True) was built for {self.gamma.shape[0]} channels, '
                f'got {x.shape[channel_dim]} in input of shape {tuple(x.shape)}.')
        gamma = self.gamma if channel_dim == 2 else self.gamma.view(-1, 1, 1)
        return x + gamma * context

    def extra_repr(self) -> str:
        s = f'scaled={self.scaled}'
        if self.num_prefix_tokens:
            s += f', num_prefix_tokens={self.num_prefix_tokens}'
        return s


class CBMlp(Mlp):
    """ timm ``Mlp`` followed by Context Broadcasting: CB at the "End" of the MLP branch.

    A drop-in ``mlp_layer`` for timm blocks, e.g.
    ``timm.create_model('vit_small_patch16_224', mlp_layer=CBMlp)`` puts CB in every block.
    """

    def __init__(
            self,
            in_features: int,
            hidden_features: Optional[int] = None,
            out_features: Optional[int] = None,
            *args,
            cb_scaled: bool = False,
            cb_init: float = 1.0,
            cb_num_prefix_tokens: int = 0,
            device=None,
            dtype=None,
            **kwargs,
    ) -> None:
        super().__init__(in_features, hidden_features, out_features, *args, device=device, dtype=dtype, **kwargs)
        self.cb = ContextBroadcast(
            out_features or in_features,
            scaled=cb_scaled,
            init_value=cb_init,
            num_prefix_tokens=cb_num_prefix_tokens,
            device=device,
            dtype=dtype,
        )

    @classmethod
    def from_mlp(cls, mlp: Mlp, cb: ContextBroadcast) -> 'CBMlp':
        """Wrap an existing ``Mlp`` (its sub-modules are reused, not copied) so it ends with ``cb``."""
        if not isinstance(mlp, Mlp):
            raise ValueError(f'CBMlp.from_mlp needs a timm Mlp, got {type(mlp).__name__}.')
        if isinstance(mlp, CBMlp):
            mlp.cb = cb
            return mlp
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        for name, child in mlp.named_children():
            new.add_module(name, child)
        new.cb = cb
        new.train(mlp.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cb(super().forward(x))
