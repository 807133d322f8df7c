""" vit_*_convstem (the paper's ViT_c) and the ``stem=`` kwarg of every timm-ext ViT entrypoint. """
import logging

import pytest
import timm
import torch
from timm.layers import PatchEmbed
from timm.models import model_entrypoint

import timm_ext  # noqa: F401  (registers the models)
from timm_ext.layers import ConvStemPatchEmbed

CONVSTEM_MODELS = timm.list_models('vit_*_convstem')
TIMM_EXT_VITS = [n for n in timm.list_models('vit_*') if model_entrypoint(n).__module__.startswith('timm_ext.')]
SMALL = dict(img_size=32, depth=2)  # fast: 4 tokens, 2 blocks
STEM_LOGGER = 'timm_ext.models._stem'


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registered():
    assert CONVSTEM_MODELS == ['vit_base_convstem', 'vit_small_convstem', 'vit_tiny_convstem']
    assert {'vit_small_cb', 'vit_small_cbs', 'vit_small_convstem'} <= set(TIMM_EXT_VITS)


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name, params, patchify', [
    ('vit_tiny_convstem', 6_439_912, 'vit_tiny_patch16_224'),
    ('vit_small_convstem', 23_412_136, 'vit_small_patch16_224'),  # DeiT-S_c: the paper's 22M -> 23M
    ('vit_base_convstem', 89_207_080, 'vit_base_patch16_224'),
])
def test_param_counts(name, params, patchify):
    model = timm.create_model(name, device='meta')
    base = timm.create_model(patchify, device='meta')
    assert num_params(model) == params
    # the only difference is the stem: 3 convs + 3 BN (83,520) + proj 64*D*8*8 - patchify 3*D*16*16
    dim = model.embed_dim
    assert num_params(model) - num_params(base) == 83_520 + 64 * dim * 64 - 3 * dim * 256
    assert set(model.state_dict()) - set(base.state_dict()) == {
        k for k in model.state_dict() if k.startswith('patch_embed.conv.')}


@pytest.mark.parametrize('stem, delta', [
    ('3conv_3bn_1proj', 83_520 + 64 * 384 * 64 - 3 * 384 * 256),
    ('3conv_3relu_1proj', 83_520 - 384 + 64 * 384 * 64 - 3 * 384 * 256),  # no BN: 3 x 128 fewer
    ('1proj_1bn_1relu', 2 * 384),
    ('1proj_1relu', 0),
    ('patch', 0),
])
def test_variant_delta_at_model_level(stem, delta):
    model = timm.create_model('vit_small_convstem', stem=stem, device='meta', depth=1)
    base = timm.create_model('vit_small_patch16_224', device='meta', depth=1)
    assert num_params(model) - num_params(base) == delta


@pytest.mark.timm_models_only
def test_default_stem_and_cfg():
    model = timm.create_model('vit_small_convstem', **SMALL)
    assert isinstance(model.patch_embed, ConvStemPatchEmbed)
    assert model.patch_embed.stem == '3conv_3bn_3relu_1proj' and model.patch_embed.hidden_dim == 64
    assert model.pretrained_cfg['first_conv'] == 'patch_embed.conv.0'
    assert model.feature_info[-1]['reduction'] == 16
    patchy = timm.create_model('vit_small_convstem', stem='1proj_1relu', **SMALL)
    assert patchy.pretrained_cfg['first_conv'] == 'patch_embed.proj'
    wide = timm.create_model('vit_small_convstem', stem_hidden_dim=32, **SMALL)
    assert wide.patch_embed.conv[0].out_channels == 32 and wide.patch_embed.proj.in_channels == 32
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert sum(len(v) for v in groups.values()) == len(list(model.named_parameters()))
    stem_params = {n for n, _ in model.named_parameters() if n.startswith('patch_embed.')}
    assert len(stem_params) == 3 + 6 + 2 and stem_params <= set(groups[0])  # layer-wise lr decay: the stem group


def test_layer_as_embed_layer_of_any_timm_vit():
    model = timm.create_model('vit_small_patch16_224', embed_layer=ConvStemPatchEmbed, **SMALL)
    assert isinstance(model.patch_embed, ConvStemPatchEmbed) and model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
    own = timm.create_model('vit_small_convstem', embed_layer=PatchEmbed, **SMALL)  # a user's embed_layer wins
    assert type(own.patch_embed) is PatchEmbed


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name', TIMM_EXT_VITS)
def test_every_timm_ext_vit_takes_the_stem_kwarg(name):
    model = timm.create_model(name, stem='3conv_3relu_1proj', img_size=32, depth=1)
    assert isinstance(model.patch_embed, ConvStemPatchEmbed) and model.patch_embed.stem == '3conv_3relu_1proj'
    assert model.pretrained_cfg['first_conv'] == 'patch_embed.conv.0'
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, model.num_classes)
    patch = timm.create_model(name, stem='patch', img_size=32, depth=1)
    assert type(patch.patch_embed) is PatchEmbed and patch.pretrained_cfg['first_conv'] == 'patch_embed.proj'


@pytest.mark.timm_models_only
def test_cb_and_conv_stem_combine():
    model = timm.create_model('vit_small_cb', stem='conv', device='meta')
    assert type(model).__name__ == 'VisionTransformerCB' and model.cb_layers == tuple(range(6, 12))
    assert isinstance(model.patch_embed, ConvStemPatchEmbed)
    assert num_params(model) == 23_412_136  # CB adds no parameters
    assert type(timm.create_model('vit_small_cb', **SMALL).patch_embed) is PatchEmbed  # CB default unchanged


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name', CONVSTEM_MODELS)
def test_forward_features_head(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, **SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    feats = model.forward_features(x)
    assert feats.shape == (2, 1 + 4, model.embed_dim)
    assert model.forward_head(feats, pre_logits=True).shape == (2, model.embed_dim)
    torch.testing.assert_close(model(x), model.forward_head(feats))


@pytest.mark.timm_models_only
def test_forward_intermediates_and_features_only():
    torch.manual_seed(0)
    model = timm.create_model('vit_small_convstem', img_size=64, depth=3).eval()
    x = torch.randn(2, 3, 64, 64)
    final, inters = model.forward_intermediates(x, indices=2)
    assert [t.shape for t in inters] == [(2, 384, 4, 4)] * 2
    torch.testing.assert_close(final, model.forward_features(x))
    torch.manual_seed(0)  # same init as ``model``
    features = timm.create_model('vit_small_convstem', img_size=64, depth=3, features_only=True, out_indices=(0, 2))
    features.eval()
    outs = features(x)
    assert [o.shape for o in outs] == [(2, 384, 4, 4)] * 2 and features.feature_info.reduction() == [16, 16]
    torch.testing.assert_close(outs[1], inters[1])
    kept = model.prune_intermediate_layers(indices=(1,))
    assert kept == [1] and len(model.blocks) == 2


def test_reset_classifier_and_grad_checkpointing():
    torch.manual_seed(0)
    model = timm.create_model('vit_small_convstem', **SMALL)
    model.reset_classifier(5)
    assert model.get_classifier().out_features == 5
    x = torch.randn(2, 3, 32, 32)
    model.train()
    torch.manual_seed(1)
    ref = model(x)
    ref.sum().backward()
    ref_grad = model.patch_embed.conv[0].weight.grad.clone()
    model.zero_grad()
    model.set_grad_checkpointing(True)
    assert model.grad_checkpointing
    torch.manual_seed(1)
    out = model(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(model.patch_embed.conv[0].weight.grad, ref_grad)


@pytest.mark.timm_models_only
def test_dynamic_img_size_and_set_input_size():
    model = timm.create_model('vit_small_convstem', dynamic_img_size=True, **SMALL).eval()
    inters = model.forward_intermediates(torch.randn(1, 3, 48, 80), intermediates_only=True)
    assert inters[-1].shape == (1, 384, 3, 5)
    padded = timm.create_model('vit_small_convstem', dynamic_img_size=True, dynamic_img_pad=True, **SMALL).eval()
    assert padded.forward_intermediates(torch.randn(1, 3, 40, 20), intermediates_only=True)[-1].shape[-2:] == (3, 2)
    fixed = timm.create_model('vit_small_convstem', **SMALL)
    fixed.set_input_size(img_size=(48, 64))
    assert fixed.pos_embed.shape[1] == 1 + 12 and fixed(torch.randn(1, 3, 48, 64)).shape == (1, 1000)


@pytest.mark.parametrize('in_chans', [1, 4])
def test_in_chans_adapts_the_first_conv(in_chans):
    torch.manual_seed(0)
    src = timm.create_model('vit_small_convstem', **SMALL)
    model = timm.create_model(
        'vit_small_convstem', pretrained=True, in_chans=in_chans,
        pretrained_cfg_overlay=dict(state_dict=src.state_dict()), **SMALL)
    w = src.patch_embed.conv[0].weight
    expected = w.sum(1, keepdim=True) if in_chans == 1 else w.repeat(1, 2, 1, 1)[:, :4] * (3 / 4)
    torch.testing.assert_close(model.patch_embed.conv[0].weight, expected)
    torch.testing.assert_close(model.patch_embed.proj.weight, src.patch_embed.proj.weight)
    assert model(torch.randn(1, in_chans, 32, 32)).shape == (1, 1000)


def test_in_chans_adapts_proj_of_a_conv_free_stem():
    src = timm.create_model('vit_small_convstem', stem='1proj_1bn_1relu', **SMALL)
    model = timm.create_model(
        'vit_small_convstem', stem='1proj_1bn_1relu', pretrained=True, in_chans=1,
        pretrained_cfg_overlay=dict(state_dict=src.state_dict()), **SMALL)
    torch.testing.assert_close(model.patch_embed.proj.weight, src.patch_embed.proj.weight.sum(1, keepdim=True))


@pytest.mark.parametrize('name', ['vit_small_convstem', 'vit_small_cbs'])
def test_finetune_from_patchify_checkpoint(name, caplog):
    """Everything but the stem loads from a timm patchify ViT; the stem keeps its init; one warning says so."""
    torch.manual_seed(0)
    src = timm.create_model('vit_small_patch16_224', num_classes=10, **SMALL)
    kwargs = dict(SMALL, num_classes=10) if name == 'vit_small_convstem' else dict(SMALL, num_classes=10, stem='conv')
    torch.manual_seed(1)
    fresh = timm.create_model(name, **kwargs)
    torch.manual_seed(1)
    with caplog.at_level(logging.WARNING, logger=STEM_LOGGER):
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(state_dict=src.state_dict()),
                                  **kwargs)
    records = [r for r in caplog.records if r.name == STEM_LOGGER]
    assert len(records) == 1
    msg = records[0].getMessage()
    assert 'skipped checkpoint keys [patch_embed.proj.bias, patch_embed.proj.weight]' in msg
    assert 'patch_embed.conv.0, patch_embed.conv.1' in msg and 'everything else was loaded' in msg
    src_sd, sd, fresh_sd = src.state_dict(), model.state_dict(), fresh.state_dict()
    for k, v in sd.items():
        if k.startswith(('patch_embed.', 'head.')):  # the stem keeps its init; a 10-class head is new (timm's rule)
            torch.testing.assert_close(v, fresh_sd[k], msg=k)
        elif k in src_sd:
            torch.testing.assert_close(v, src_sd[k], msg=k)
        else:
            assert name == 'vit_small_cbs' and k.endswith('.cb.gamma'), k


def test_patchify_model_from_conv_stem_checkpoint(caplog):
    torch.manual_seed(0)
    src = timm.create_model('vit_small_convstem', **SMALL)
    with caplog.at_level(logging.WARNING, logger=STEM_LOGGER):
        model = timm.create_model('vit_small_cb', pretrained=True,
                                  pretrained_cfg_overlay=dict(state_dict=src.state_dict()), **SMALL)
    assert len([r for r in caplog.records if r.name == STEM_LOGGER]) == 1
    assert 'patch_embed.conv.0.weight' in caplog.records[0].getMessage()
    torch.testing.assert_close(model.blocks[1].mlp.fc1.weight, src.blocks[1].mlp.fc1.weight)


def test_same_stem_checkpoint_loads_silently(caplog):
    src = timm.create_model('vit_small_convstem', **SMALL)
    with caplog.at_level(logging.WARNING, logger=STEM_LOGGER):
        model = timm.create_model('vit_small_convstem', pretrained=True,
                                  pretrained_cfg_overlay=dict(state_dict=src.state_dict()), **SMALL)
    assert not [r for r in caplog.records if r.name == STEM_LOGGER]
    torch.testing.assert_close(model.patch_embed.conv[3].weight, src.patch_embed.conv[3].weight)


@pytest.mark.parametrize('src_kwargs, model_kwargs, ckpt_stem, model_stem, reason', [
    (dict(stem_hidden_dim=32), dict(),
     r"stem='3conv_3bn_3relu_1proj' or .*, stem_hidden_dim=32", r"stem='3conv_3bn_3relu_1proj', stem_hidden_dim=64",
     r'patch_embed.conv.0.weight is \(32, 3, 7, 7\) in the checkpoint, \(64, 3, 7, 7\) here'),
    (dict(stem='3conv_1proj'), dict(),
     r"stem='3conv_3relu_1proj' or '3conv_1proj' or .*, stem_hidden_dim=64",
     r"stem='3conv_3bn_3relu_1proj', stem_hidden_dim=64", r'patch_embed.conv.1.bias is not in the checkpoint'),
    (dict(), dict(stem='3conv_3relu_1proj'),
     r"stem='3conv_3bn_3relu_1proj' or .*", r"stem='3conv_3relu_1proj', stem_hidden_dim=64",
     r'patch_embed.conv.1.bias is not in this model'),
    (dict(stem='patch'), dict(stem='1proj_1bn_1relu'),
     r"stem='1proj_1relu' or '1proj'", r"stem='1proj_1bn_1relu'",
     r'patch_embed.proj_norm.bias is not in the checkpoint'),
])
def test_checkpoint_of_another_stem_variant_or_width_is_an_error(src_kwargs, model_kwargs, ckpt_stem, model_stem,
                                                                 reason):
    """Leniency is for patchify <-> conv stem only; any other stem mismatch names both stems."""
    src = timm.create_model('vit_small_convstem', **SMALL, **src_kwargs)
    message = (rf"The checkpoint stem \({ckpt_stem}\) does not fit this model's \({model_stem}\): {reason}\. "
               rf"Create the model with the checkpoint's stem, or pass pretrained_strict=False")
    with pytest.raises(RuntimeError, match=message):
        timm.create_model('vit_small_convstem', pretrained=True,
                          pretrained_cfg_overlay=dict(state_dict=src.state_dict()), **SMALL, **model_kwargs)


@pytest.mark.parametrize('name', ['vit_small_convstem', 'vit_small_cb'])
def test_pretrained_strict_false_keeps_this_stem(name, caplog):
    """timm's pretrained_strict=False is the opt-in: the rest loads, the stem keeps its init, one warning says so."""
    torch.manual_seed(0)
    src = timm.create_model('vit_small_convstem', stem_hidden_dim=32, **SMALL)
    torch.manual_seed(1)
    fresh = timm.create_model(name, stem='conv', **SMALL)
    torch.manual_seed(1)
    with caplog.at_level(logging.WARNING, logger=STEM_LOGGER):
        model = timm.create_model(name, stem='conv', pretrained=True, pretrained_strict=False,
                                  pretrained_cfg_overlay=dict(state_dict=src.state_dict()), **SMALL)
    assert len([r for r in caplog.records if r.name == STEM_LOGGER]) == 1
    torch.testing.assert_close(model.patch_embed.conv[0].weight, fresh.patch_embed.conv[0].weight)
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"Unknown stem 'convv'; valid: conv, patch, 3conv_3bn_3relu_1proj"):
        timm.create_model('vit_small_cb', stem='convv')
    with pytest.raises(ValueError, match=r'img_size \(100, 100\) is not divisible by the stem total stride 16'):
        timm.create_model('vit_small_convstem', img_size=100, depth=1)
    with pytest.raises(ValueError, match=r"stem_hidden_dim=32 has no effect with stem='1proj_1relu'"):
        timm.create_model('vit_small_convstem', stem='1proj_1relu', stem_hidden_dim=32)
    with pytest.raises(ValueError, match=r"Pass either stem='3conv_3bn_3relu_1proj' or embed_layer=, not both"):
        timm.create_model('vit_small_cb', stem='conv', embed_layer=PatchEmbed)
    with pytest.raises(RuntimeError, match='No pretrained weights are published for vit_small_convstem'):
        timm.create_model('vit_small_convstem', pretrained=True)
    padded = timm.create_model('vit_small_convstem', img_size=40, dynamic_img_pad=True, depth=1)
    assert padded.pos_embed.shape[1] == 1 + 9 and padded(torch.randn(1, 3, 40, 40)).shape == (1, 1000)


@pytest.mark.slow
def test_torch_compile_forward():
    torch.manual_seed(0)
    model = timm.create_model('vit_tiny_convstem', img_size=32, depth=1).eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
