import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import Mlp

import timm_ext  # noqa: F401
from timm_ext.layers import CBMlp, ContextBroadcast
from timm_ext.models import VisionTransformerCB

SIZES = {'tiny': 'vit_tiny_patch16_224', 'small': 'vit_small_patch16_224', 'base': 'vit_base_patch16_224'}
PAPER_PARAMS_M = {'tiny': 5.7, 'small': 22.0, 'base': 86.6}  # Table 5
EMBED = {'tiny': 192, 'small': 384, 'base': 768}


def _nparams(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.timm_models_only
@pytest.mark.parametrize('size', list(SIZES))
def test_param_counts_match_paper_and_base(size):
    base = _nparams(timm.create_model(SIZES[size], device='meta'))
    for suffix in ('cb', 'cb_all'):
        assert _nparams(timm.create_model(f'vit_{size}_{suffix}', device='meta')) == base
    assert abs(base / 1e6 - PAPER_PARAMS_M[size]) < 0.06
    # CB_S adds exactly one C-vector per CB block (12 blocks)
    assert _nparams(timm.create_model(f'vit_{size}_cbs', device='meta')) == base + 12 * EMBED[size]


def test_vit_small_cbs_adds_the_papers_two_hundredths_of_a_percent():
    extra = _nparams(timm.create_model('vit_small_cbs', device='meta')) - 22_050_664
    assert extra == 4_608 and round(100 * extra / 22_050_664, 2) == 0.02


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name,layers,scaled', [
    ('vit_small_cb', tuple(range(6, 12)), False),
    ('vit_small_cb_all', tuple(range(12)), False),
    ('vit_small_cbs', tuple(range(12)), True),
])
def test_default_cb_layers(name, layers, scaled):
    model = timm.create_model(name, device='meta')
    assert model.cb_layers == layers
    for i, blk in enumerate(model.blocks):
        assert isinstance(blk.mlp, CBMlp) == (i in layers)
        if i in layers:
            assert blk.mlp.cb.scaled == scaled


def _reference_forward(base, x, cb_layers, patch_mean=False):
    """Forward of a timm ViT with CB applied by hand to the MLP output of ``cb_layers``."""
    x = base.norm_pre(base.patch_drop(base._pos_embed(base.patch_embed(x))))
    n0 = base.num_prefix_tokens if patch_mean else 0
    for i, blk in enumerate(base.blocks):
        x = x + blk.ls1(blk.attn(blk.norm1(x)))
        m = blk.mlp(blk.norm2(x))
        if i in cb_layers:
            m = 0.5 * (m + m[:, n0:].mean(dim=1, keepdim=True))
        x = x + blk.ls2(m)
    return base.forward_head(base.norm(x))


@pytest.mark.timm_models_only
@pytest.mark.parametrize('patch_mean', [False, True])
def test_cb_model_matches_hand_reference(patch_mean):
    model = timm.create_model('vit_tiny_cb', img_size=32, reg_tokens=2, cb_patch_mean=patch_mean).eval()
    base = timm.create_model('vit_tiny_patch16_224', img_size=32, reg_tokens=2).eval()
    base.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), _reference_forward(base, x, range(6, 12), patch_mean))
        assert not torch.allclose(model(x), base(x), atol=1e-4)


@pytest.mark.timm_models_only
def test_cb_model_equals_base_vit_when_cb_removed():
    model = timm.create_model('vit_tiny_cb_all', img_size=32).eval()
    base = timm.create_model('vit_tiny_patch16_224', img_size=32).eval()
    base.load_state_dict(model.state_dict(), strict=True)
    for blk in model.blocks:
        blk.mlp.cb = torch.nn.Identity()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), base(x), rtol=0, atol=0)


@pytest.mark.timm_models_only
def test_gradient_reaches_every_parameter():
    model = timm.create_model('vit_tiny_cbs', img_size=32, num_classes=5)
    model(torch.randn(2, 3, 32, 32)).logsumexp(-1).sum().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert no_grad == []


def test_base_vit_weights_load_with_file_overlay(tmp_path):
    base = timm.create_model('vit_tiny_patch16_224', img_size=32)
    path = tmp_path / 'vit_tiny.safetensors'
    save_file(base.state_dict(), str(path))
    model = timm.create_model(
        'vit_tiny_cb', pretrained=True, img_size=32, pretrained_cfg_overlay=dict(file=str(path)))
    for k, v in base.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_base_vit_weights_load_into_cbs_and_fill_is_reported(tmp_path, caplog):
    base = timm.create_model('vit_tiny_patch16_224', img_size=32)
    path = tmp_path / 'vit_tiny.safetensors'
    save_file(base.state_dict(), str(path))
    model = timm.create_model(
        'vit_tiny_cbs', pretrained=True, img_size=32, cb_init=0.5, pretrained_cfg_overlay=dict(file=str(path)))
    assert torch.equal(model.blocks[3].attn.qkv.weight, base.blocks[3].attn.qkv.weight)
    assert torch.equal(model.blocks[3].mlp.cb.gamma, torch.full((192,), 0.5))
    assert '12 CB_S scale(s) not in the checkpoint keep their init value' in caplog.text


def test_pretrained_true_without_published_weights_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r'No pretrained weights are published for vit_small_cb yet'):
        timm.create_model('vit_small_cb', pretrained=True)


@pytest.mark.parametrize('layers,message', [
    ([12], r'cb_layers \[12\] outside the model depth: block indices must be in 0..11'),
    ([-1, 3], r'cb_layers \[-1\] outside the model depth'),
    ('middle', r"Unknown cb_layers 'middle'; use 'all', 'upper' or a list of block indices"),
    (np.array([6, 7]), r"cb_layers must be 'all', 'upper' or a list of block indices \(ints\), got a ndarray: "
                       r'array\(\[6, 7\]\)'),
    ([6.0, 7], r'cb_layers \[6.0\] are not block indices: use ints in 0..11'),
    ([], r'cb_layers \[\] is empty: a CB model needs at least one CB block \(indices 0..11\)'),
    (3, r"cb_layers must be 'all', 'upper' or a list of block indices \(ints\), got a int: 3"),
])
def test_bad_cb_layers(layers, message):
    with pytest.raises(ValueError, match=message):
        timm.create_model('vit_tiny_cb', cb_layers=layers, device='meta')


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name', ['vit_tiny_cb', 'vit_tiny_cb_all', 'pit_b_cb', 'mixer_s16_cb'])
def test_cb_init_on_a_model_without_cbs_is_an_error(name):
    with pytest.raises(ValueError, match=r'cb_init=0.5 sets the initial Lambda of CB_S, but this is plain CB'):
        timm.create_model(name, cb_init=0.5, device='meta')
    model = timm.create_model(name, cb_scaled=True, cb_init=0.5, cb_layers=[1], device='meta')  # with CB_S: fine
    assert [(m.scaled, m.init_value) for m in model.modules() if isinstance(m, ContextBroadcast)] == [(True, 0.5)]


def test_explicit_cb_layers_and_custom_depth():
    model = timm.create_model('vit_tiny_cb', depth=4, cb_layers=[0, 3], device='meta')
    assert [isinstance(b.mlp, CBMlp) for b in model.blocks] == [True, False, False, True]
    model = timm.create_model('vit_tiny_cb', depth=6, device='meta')  # 'upper' follows the real depth
    assert model.cb_layers == (3, 4, 5)


@pytest.mark.timm_models_only
def test_reset_parameters_through_init_weights_restores_cb_init():
    model = timm.create_model('vit_tiny_cbs', cb_init=0.3, img_size=32)
    with torch.no_grad():
        model.blocks[0].mlp.cb.gamma.zero_()
    model.init_weights()
    assert torch.equal(model.blocks[0].mlp.cb.gamma, torch.full((192,), 0.3))


def test_is_a_timm_vision_transformer_with_plain_mlps_elsewhere():
    model = timm.create_model('vit_tiny_cb', device='meta')
    assert isinstance(model, VisionTransformerCB) and type(model.blocks[0].mlp) is Mlp
    assert model.no_weight_decay() >= {'pos_embed', 'cls_token'}
