""" volo_d1_convstem: timm's VOLO-D1 with the paper's Table 2 stems (strides (2,1,1,4) / patchify 8). """
import logging

import pytest
import timm
import torch
from timm.models.volo import VOLO

import timm_ext  # noqa: F401  (registers the models)
from timm_ext.models import VOLOConvStem

IMG = 64  # VOLO needs a multiple of 16 (patch 8, then a stride-2 downsample)
# one narrow block per stage keeps tests fast; the stem is VOLO-D1's (64 hidden channels, patch 8)
SHALLOW = dict(layers=(1, 1, 1, 1), embed_dims=(32, 64, 64, 64), num_heads=(2, 2, 2, 2), img_size=IMG)
# VOLO-d1 rows of Table 2 -> (conv kernels, conv strides) of the convs that run, proj last
TABLE2_VOLO = {
    '3Conv+3BN+3ReLU+1Proj': ((7, 3, 3, 4), (2, 1, 1, 4)),
    '3Conv+3BN+1Proj': ((7, 3, 3, 4), (2, 1, 1, 4)),
    '3Conv+3ReLU+1Proj': ((7, 3, 3, 4), (2, 1, 1, 4)),
    '3Conv+1Proj': ((7, 3, 3, 4), (2, 1, 1, 4)),
    '1Proj': ((8,), (8,)),
    '1Proj+1ReLU': ((8,), (8,)),
    '1Proj+1BN+1ReLU': ((8,), (8,)),
}


def convs(model):
    return [m for m in model.patch_embed.modules() if isinstance(m, torch.nn.Conv2d)]


@pytest.mark.parametrize('row', TABLE2_VOLO)
def test_table2_rows(row):
    model = timm.create_model('volo_d1_convstem', stem=row, num_classes=5, **SHALLOW)
    kernels, strides = TABLE2_VOLO[row]
    assert tuple(c.kernel_size[0] for c in convs(model)) == kernels
    assert tuple(c.stride[0] for c in convs(model)) == strides
    bns = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.patch_embed.modules())
    assert bns == (3 if '3BN' in row else 0) + (1 if '1BN' in row else 0)
    relus = sum(isinstance(m, torch.nn.ReLU) for m in model.patch_embed.modules())
    assert relus == (3 if '3ReLU' in row else 0) + (1 if '1ReLU' in row else 0)
    first_conv = 'patch_embed.conv.0' if row.startswith('3Conv') else 'patch_embed.proj'
    assert model.pretrained_cfg['first_conv'] == first_conv
    model.eval()
    assert model(torch.randn(2, 3, IMG, IMG)).shape == (2, 5)
    assert model.patch_embed(torch.randn(1, 3, IMG, IMG)).shape == (1, 32, IMG // 8, IMG // 8)


@pytest.mark.timm_models_only
def test_full_stem_is_timms_volo_d1():
    full = timm.create_model('volo_d1_convstem', device='meta')
    assert sum(p.numel() for p in full.parameters()) == 26_632_040  # timm's VOLO-D1 at 224
    torch.manual_seed(0)
    ref = VOLO(**SHALLOW).eval()
    model = timm.create_model('volo_d1_convstem', **SHALLOW).eval()
    assert isinstance(model, VOLOConvStem)
    model.load_state_dict(ref.state_dict())  # strict: identical keys, so timm's VOLO weights load as they are
    x = torch.randn(2, 3, IMG, IMG)
    torch.testing.assert_close(model(x), ref(x))


def test_timm_behaviours():
    torch.manual_seed(0)
    model = timm.create_model('volo_d1_convstem', stem='3conv_3relu_1proj', **SHALLOW).eval()
    x = torch.randn(2, 3, IMG, IMG)
    inters = model.forward_intermediates(x, intermediates_only=True)
    assert [t.shape for t in inters] == [(2, 32, 8, 8), (2, 64, 4, 4), (2, 64, 4, 4), (2, 64, 4, 4)]
    torch.manual_seed(0)
    features = timm.create_model('volo_d1_convstem', stem='3conv_3relu_1proj', features_only=True,
                                 out_indices=(0, 1), **SHALLOW).eval()
    outs = features(x)
    torch.testing.assert_close(outs[0], inters[0])
    assert features.feature_info.reduction() == [8, 16]
    model.reset_classifier(3)
    assert model(x).shape == (2, 3)
    model.train()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    assert model.patch_embed.conv[0].weight.grad is not None


def test_in_chans_and_stem_mismatch_loading(caplog):
    torch.manual_seed(0)
    src = timm.create_model('volo_d1_convstem', **SHALLOW)
    gray = timm.create_model('volo_d1_convstem', in_chans=1, pretrained=True, **SHALLOW,
                             pretrained_cfg_overlay=dict(state_dict=src.state_dict()))
    torch.testing.assert_close(gray.patch_embed.conv[0].weight, src.patch_embed.conv[0].weight.sum(1, keepdim=True))
    with caplog.at_level(logging.WARNING, logger='timm_ext.models._stem'):
        patchify = timm.create_model('volo_d1_convstem', stem='1proj', pretrained=True, **SHALLOW,
                                     pretrained_cfg_overlay=dict(state_dict=src.state_dict()))
    assert len(caplog.records) == 1 and 'patch_embed.conv.0.weight' in caplog.records[0].getMessage()
    torch.testing.assert_close(patchify.network[0][0].attn.v.weight, src.network[0][0].attn.v.weight)


def test_checkpoint_of_another_width_is_an_error():
    src = timm.create_model('volo_d1_convstem', stem_hidden_dim=32, **SHALLOW)
    with pytest.raises(RuntimeError, match=r"The checkpoint stem \(stem=.*, stem_hidden_dim=32\) does not fit this "
                                           r"model's \(stem='3conv_3bn_3relu_1proj', stem_hidden_dim=64\)"):
        timm.create_model('volo_d1_convstem', pretrained=True, pretrained_cfg_overlay=dict(state_dict=src.state_dict()),
                          **SHALLOW)
    model = timm.create_model('volo_d1_convstem', pretrained=True, pretrained_strict=False,
                              pretrained_cfg_overlay=dict(state_dict=src.state_dict()), **SHALLOW)
    torch.testing.assert_close(model.network[0][0].attn.v.weight, src.network[0][0].attn.v.weight)
    assert model.patch_embed.conv[0].out_channels == 64


def test_bad_stem():
    with pytest.raises(ValueError, match=r"Unknown stem 'bn'; valid: conv, patch, "):
        timm.create_model('volo_d1_convstem', stem='bn')
    with pytest.raises(ValueError, match=r'img_size \(100, 100\) is not divisible by the stem total stride 8'):
        timm.create_model('volo_d1_convstem', img_size=100)
