"""timm behaviours every Context Broadcasting model must show, parametrised over the registry."""
import copy

import pytest
import timm
import torch

import timm_ext  # noqa: F401

CB_MODELS = timm.list_models(module=['vision_transformer_cb', 'pit_cb', 'mlp_mixer_cb'])
# one model per class and CB variant for the heavier checks
REPRESENTATIVES = ['vit_tiny_cb', 'vit_tiny_cbs', 'pit_b_cb', 'mixer_s16_cb']
IMG = 64
# narrower PiT for the heavier checks: same classes and code paths, a tenth of the compute
SHRINK = {'pit_b_cb': dict(base_dims=[32, 32, 32], heads=[2, 4, 8])}
_cache = {}


def _create(name, **kwargs):
    return timm.create_model(name, img_size=IMG, **SHRINK.get(name, {}), **kwargs)


def _model(name):
    if name not in _cache:
        _cache[name] = _create(name).eval()
    return _cache[name]


def _x(batch=2, chans=3):
    return torch.randn(batch, chans, IMG, IMG)


def test_all_cb_models_are_registered_and_listed():
    assert set(timm.list_models('*_cb*')) >= {
        'vit_tiny_cb', 'vit_small_cb', 'vit_base_cb', 'vit_tiny_cb_all', 'vit_small_cb_all', 'vit_base_cb_all',
        'pit_b_cb', 'mixer_s16_cb'}
    assert set(timm.list_models('*_cbs')) == {'vit_tiny_cbs', 'vit_small_cbs', 'vit_base_cbs'}
    assert len(CB_MODELS) == 11


@pytest.mark.parametrize('name', CB_MODELS)
def test_create_forward_backward_and_pretrained_cfg(name):
    model = timm.create_model(name, img_size=IMG, num_classes=7)
    out = model(_x())
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    cfg = model.pretrained_cfg
    assert cfg['architecture'] == name and cfg['num_classes'] == 1000 and cfg['paper_ids'] == 'arXiv:2210.08457'
    assert timm.get_pretrained_cfg(name) is not None


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_forward_head_pre_logits_and_reset_classifier(name):
    model = copy.deepcopy(_model(name))
    x = _x()
    with torch.no_grad():
        feats = model.forward_features(x)
        pre = model.forward_head(feats, pre_logits=True)
        assert pre.shape == (2, model.num_features)
        torch.testing.assert_close(model.forward_head(feats), model.get_classifier()(pre))
        model.reset_classifier(10)
        assert model(x).shape == (2, 10)
        model.reset_classifier(0)
        assert model(x).shape == (2, model.num_features)


BASE_OF = {'vit_tiny_cb': 'vit_tiny_patch16_224', 'vit_tiny_cbs': 'vit_tiny_patch16_224',
           'pit_b_cb': 'pit_b_224', 'mixer_s16_cb': 'mixer_s16_224'}


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_features_only_same_as_timm_base_model(name):
    model = _create(name, features_only=True).eval()
    base = timm.create_model(BASE_OF[name], img_size=IMG, features_only=True, **SHRINK.get(name, {})).eval()
    x = _x()
    with torch.no_grad():
        assert [f.shape for f in model(x)] == [f.shape for f in base(x)]
    assert model.feature_info.channels() == base.feature_info.channels()
    assert model.feature_info.reduction() == base.feature_info.reduction()
    assert [f.shape[1] for f in model(x)] == model.feature_info.channels()


def test_vit_feature_reduction_is_the_patch_size():
    model = timm.create_model('vit_tiny_cb', img_size=IMG, features_only=True)
    assert [IMG // f.shape[-1] for f in model(_x())] == model.feature_info.reduction() == [16, 16, 16]


@pytest.mark.parametrize('name', ['vit_tiny_cb', 'vit_tiny_cbs', 'mixer_s16_cb'])
def test_forward_intermediates_matches_forward_features(name):
    model = _model(name)
    x = _x()
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, indices=[5, 7])
        torch.testing.assert_close(final, model.forward_features(x))
        assert len(inter) == 2 and inter[0].ndim == 4 and inter[0].shape[-1] == IMG // 16


def test_forward_intermediates_pit():
    model = _model('pit_b_cb')
    with torch.no_grad():
        final, inter = model.forward_intermediates(_x())
    assert [t.shape[1] for t in inter] == [64, 128, 256]


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_grad_checkpointing_gives_same_gradients(name):
    model = copy.deepcopy(_model(name)).train()
    x = _x()
    model(x).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], msg=n)


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_in_chans_and_group_matcher(name):
    model = _create(name, in_chans=1)
    assert model(_x(chans=1)).shape == (2, 1000)
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert sum(len(v) for v in groups.values()) == len(list(model.named_parameters()))


@pytest.mark.slow
def test_torch_compile_forward_matches_eager():
    model = timm.create_model('vit_tiny_cbs', img_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
