from functools import partial

import pytest
import torch
import torch.nn as nn
from timm.layers import Mlp
from timm.optim import param_groups_weight_decay

from timm_ext.layers import CBMlp, ContextBroadcast


def _hand_cb(x):
    """CB by explicit loops: x_i -> (x_i + 1/N sum_j x_j) / 2."""
    B, N, C = x.shape
    out = torch.empty_like(x)
    for b in range(B):
        mean = sum(x[b, j] for j in range(N)) / N
        for i in range(N):
            out[b, i] = (x[b, i] + mean) / 2
    return out


def test_cb_matches_hand_computation():
    x = torch.tensor([[[1., 2.], [3., 6.], [5., 10.]]])  # mean token = (3, 6)
    expected = torch.tensor([[[2., 4.], [3., 6.], [4., 8.]]])
    torch.testing.assert_close(ContextBroadcast()(x), expected)
    x = torch.randn(2, 7, 5)
    torch.testing.assert_close(ContextBroadcast()(x), _hand_cb(x))


def test_cb_has_no_parameters_and_no_state():
    cb = ContextBroadcast(dim=8)
    assert list(cb.parameters()) == [] and cb.state_dict() == {}


def test_cbs_matches_formula_per_channel():
    cb = ContextBroadcast(3, scaled=True)
    with torch.no_grad():
        cb.gamma.copy_(torch.tensor([0., 1., -2.]))
    x = torch.tensor([[[1., 1., 1.], [3., 5., 7.]]])  # mean token = (2, 3, 4)
    expected = x + torch.tensor([0., 3., -8.])
    torch.testing.assert_close(cb(x), expected)


def test_cbs_default_init_is_twice_cb():
    cb_s, cb = ContextBroadcast(4, scaled=True), ContextBroadcast()
    assert torch.equal(cb_s.gamma, torch.ones(4))
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(cb_s(x), 2 * cb(x))


def test_cbs_init_value_and_reset():
    cb = ContextBroadcast(6, scaled=True, init_value=0.25)
    assert torch.equal(cb.gamma, torch.full((6,), 0.25))
    with torch.no_grad():
        cb.gamma.zero_()
    cb.reset_parameters()
    assert torch.equal(cb.gamma, torch.full((6,), 0.25))


def test_patch_only_mean_skips_prefix_tokens_but_broadcasts_to_them():
    x = torch.randn(2, 5, 3)
    out = ContextBroadcast(num_prefix_tokens=1)(x)
    mean = x[:, 1:].mean(1, keepdim=True)
    torch.testing.assert_close(out, (x + mean) / 2)
    assert not torch.allclose(out[:, :1], x[:, :1])


def test_feature_map_formats_use_spatial_mean():
    x = torch.randn(2, 3, 4, 5)
    mean = x.flatten(2).mean(-1)[..., None, None]
    torch.testing.assert_close(ContextBroadcast(input_fmt='NCHW')(x), (x + mean) / 2)
    cb_s = ContextBroadcast(3, scaled=True, input_fmt='NCHW')
    with torch.no_grad():
        cb_s.gamma.copy_(torch.tensor([1., 2., 3.]))
    torch.testing.assert_close(cb_s(x), x + torch.tensor([1., 2., 3.]).view(1, 3, 1, 1) * mean)
    nhwc = ContextBroadcast(3, scaled=True, input_fmt='NHWC')
    nhwc.load_state_dict(cb_s.state_dict())  # Lambda is (C,) in every layout
    torch.testing.assert_close(nhwc(x.permute(0, 2, 3, 1)), cb_s(x).permute(0, 2, 3, 1))
    ncl = ContextBroadcast(input_fmt='NCL')
    torch.testing.assert_close(ncl(x.flatten(2)), ((x + mean) / 2).flatten(2))


def test_cb_equals_uniform_attention():
    """CB's context is attention with a uniform map: softmax of constant scores times the tokens."""
    x = torch.randn(2, 6, 4)
    uniform = torch.softmax(torch.zeros(2, 6, 6), dim=-1) @ x
    torch.testing.assert_close(ContextBroadcast()(x), 0.5 * x + 0.5 * uniform)


@pytest.mark.parametrize('fmt, shape', [('NLC', (4, 5)), ('NLC', (2, 3, 4, 5)), ('NCHW', (2, 3, 4))])
def test_wrong_rank_is_rejected(fmt, shape):
    """The layout is fixed at build time; another rank fails in forward with timm's _assert (AssertionError)."""
    ndim = 3 if fmt == 'NLC' else 4
    with pytest.raises(AssertionError, match=rf'\(input_fmt={fmt}\) expects a {ndim}-D tensor, got shape'):
        ContextBroadcast(input_fmt=fmt)(torch.randn(*shape))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match='needs the channel count dim > 0, got dim=None'):
        ContextBroadcast(scaled=True)
    with pytest.raises(ValueError, match='num_prefix_tokens must be an int >= 0, got -1'):
        ContextBroadcast(num_prefix_tokens=-1)
    with pytest.raises(ValueError, match=r"Unknown input_fmt 'BNC'; valid: NLC, NCL, NCHW, NHWC"):
        ContextBroadcast(input_fmt='BNC')
    with pytest.raises(ValueError, match=r"num_prefix_tokens=1 needs \(B, N, C\) tokens \(input_fmt=\"NLC\"\), got "
                                         r"input_fmt='NCHW'"):
        ContextBroadcast(num_prefix_tokens=1, input_fmt='NCHW')
    with pytest.raises(AssertionError, match='built for 4 channels, got 5'):
        ContextBroadcast(4, scaled=True)(torch.randn(1, 3, 5))


def test_init_value_only_for_cbs():
    with pytest.raises(ValueError, match=r'init_value=0.5 sets the initial Lambda of CB_S, but this is plain CB'):
        ContextBroadcast(4, init_value=0.5)
    with pytest.raises(ValueError, match=r"init_value must be a number \(the initial Lambda of CB_S\), got '0.5'"):
        ContextBroadcast(4, scaled=True, init_value='0.5')
    with pytest.raises(ValueError, match=r'cb_init=0.5 sets the initial Lambda of CB_S, but this is plain CB'):
        CBMlp(4, 8, cb_init=0.5)
    assert torch.equal(ContextBroadcast(2, scaled=True, init_value=2).gamma, torch.full((2,), 2.))


@pytest.mark.filterwarnings('ignore:`torch.jit.script` is deprecated:FutureWarning')
@pytest.mark.parametrize('fmt, shape', [('NLC', (2, 5, 4)), ('NCHW', (2, 4, 3, 3)), ('NHWC', (2, 3, 3, 4))])
@pytest.mark.parametrize('scaled', [False, True])
def test_fx_and_torchscript_match_eager(fmt, shape, scaled):
    cb = ContextBroadcast(4, scaled=scaled, input_fmt=fmt, num_prefix_tokens=1 if fmt == 'NLC' else 0)
    if scaled:
        with torch.no_grad():
            cb.gamma.copy_(torch.tensor([0.5, -1., 2., 3.]))
    x = torch.randn(*shape)
    torch.testing.assert_close(torch.fx.symbolic_trace(cb)(x), cb(x))
    torch.testing.assert_close(torch.jit.script(cb)(x), cb(x))
    with pytest.raises(Exception, match='expects a'):  # the rank check survives scripting
        torch.jit.script(cb)(torch.randn(2, 4))


def test_gamma_is_excluded_from_weight_decay():
    model = nn.Sequential(nn.Linear(4, 4), ContextBroadcast(4, scaled=True))
    groups = param_groups_weight_decay(model, weight_decay=0.05)
    no_decay = next(g for g in groups if g['weight_decay'] == 0.)
    assert any(p is model[1].gamma for p in no_decay['params'])


def test_cbmlp_is_mlp_then_cb_and_keeps_mlp_keys():
    mlp = CBMlp(8, 16, cb_scaled=True)
    ref = Mlp(8, 16)
    missing, unexpected = ref.load_state_dict(mlp.state_dict(), strict=False)
    assert missing == [] and unexpected == ['cb.gamma']
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(mlp(x), mlp.cb(ref(x)))


def test_cbmlp_from_mlp_copies_weights_config_and_mode():
    mlp = Mlp(8, 16, 6, act_layer=partial(nn.GELU, approximate='tanh'), norm_layer=nn.LayerNorm, bias=(True, False),
              drop=(0.1, 0.2)).eval()
    mlp.fc1.weight.requires_grad_(False)
    wrapped = CBMlp.from_mlp(mlp, cb_scaled=True, cb_init=0.5)
    assert type(wrapped) is CBMlp and not wrapped.training
    assert wrapped.act.approximate == 'tanh' and isinstance(wrapped.norm, nn.LayerNorm) and wrapped.fc2.bias is None
    assert (wrapped.drop1.p, wrapped.drop2.p) == (0.1, 0.2)
    assert not wrapped.fc1.weight.requires_grad and wrapped.fc2.weight.requires_grad
    assert set(wrapped.state_dict()) == set(mlp.state_dict()) | {'cb.gamma'}
    for k, v in mlp.state_dict().items():
        assert torch.equal(wrapped.state_dict()[k], v), k
    x = torch.randn(2, 5, 8)
    y = mlp(x)
    torch.testing.assert_close(wrapped(x), y + 0.5 * y.mean(1, keepdim=True))
    with pytest.raises(ValueError, match='needs a timm Mlp, got Linear'):
        CBMlp.from_mlp(nn.Linear(2, 2))


def test_cbmlp_from_mlp_constructs_through_init(monkeypatch):
    """A plain attribute timm's Mlp.__init__ sets (today or in a later release) exists on the new module."""
    orig = Mlp.__init__

    def init_with_attr(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        self.added_by_init = True

    monkeypatch.setattr(Mlp, '__init__', init_with_attr)
    mlp = Mlp(4, 8)
    assert CBMlp.from_mlp(mlp).added_by_init


def test_cbmlp_from_mlp_replaces_the_cb_of_a_cbmlp_and_handles_conv_mlps():
    cb_mlp = CBMlp(4, 8, cb_scaled=True, cb_init=3.)
    plain = CBMlp.from_mlp(cb_mlp)
    assert plain.cb.gamma is None and torch.equal(plain.fc1.weight, cb_mlp.fc1.weight)
    conv = CBMlp.from_mlp(Mlp(4, 8, use_conv=True))
    x = torch.randn(2, 4, 3, 3)
    y = nn.Sequential(conv.fc1, conv.act, conv.fc2)(x)
    torch.testing.assert_close(conv(x), (y + y.mean((2, 3), keepdim=True)) / 2)


def test_gradient_flows_through_cb():
    mlp = CBMlp(4, 8, cb_scaled=True)
    x = torch.randn(2, 3, 4, requires_grad=True)
    mlp(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mlp.parameters())
    assert x.grad.abs().sum() > 0


def test_cbmlp_as_timm_mlp_layer_puts_cb_in_every_block():
    import timm
    model = timm.create_model('deit_tiny_patch16_224', mlp_layer=CBMlp, img_size=32, depth=3)
    assert all(isinstance(b.mlp, CBMlp) for b in model.blocks)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
