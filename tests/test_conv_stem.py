""" ConvStemPatchEmbed: every stem of the paper's Tables 2, 3 and 5, layer by layer, and its PatchEmbed interface.

Expected layers are derived here from the table-row names themselves (3conv, 3bn, 3relu, 1proj, ...) and the
paper's kernels/strides, independently of the library's variant table.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import PatchEmbed

from timm_ext.layers import STEM_VARIANTS, ConvStemPatchEmbed, resolve_stem

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

HIDDEN, EMBED, PATCH, IMG = 64, 24, 16, 64

# Paper rows -> variant names. Table 2 (DeiT-S/DINO/VOLO), Table 3 (stride (2,2,2,2)), Table 5 (GELU).
PAPER_ROWS = {
    '3Conv+3BN+3ReLU+1Proj': '3conv_3bn_3relu_1proj',
    '3Conv+3BN+1Proj': '3conv_3bn_1proj',
    '3Conv+3ReLU+1Proj': '3conv_3relu_1proj',
    '3Conv+1Proj': '3conv_1proj',
    '3Conv+1Proj+1ReLU': '3conv_1proj_1relu',
    '1Proj+1BN+1ReLU': '1proj_1bn_1relu',
    '1Proj+1ReLU': '1proj_1relu',
    '1Proj (baseline)': '1proj',
}
TABLE3 = ['3conv_3bn_3relu_1proj_s2222', '3conv_1proj_s2222', '3conv_1proj_1relu_s2222']
TABLE5 = ['3conv_3bn_3gelu_1proj']
# (kernel, stride, padding) of conv0..2 and proj for P=16: the paper's (7,3,3,8)/(2,1,1,8), and (2,2,2,2)
VOLO_SCHEDULE = [(7, 2, 3), (3, 1, 1), (3, 1, 1), (8, 8, 0)]
EVEN_SCHEDULE = [(7, 2, 3), (3, 2, 1), (3, 2, 1), (8, 2, 3)]


def expected_layers(name: str, in_chans: int = 3, embed_dim: int = EMBED):
    """[(kind, details...)] in execution order, read off the row name."""
    parts = name.split('_')
    act = 'gelu' if '3gelu' in parts else 'relu'
    layers = []
    chs = in_chans
    if '3conv' in parts:
        schedule = EVEN_SCHEDULE if 's2222' in parts else VOLO_SCHEDULE
        for k, s, p in schedule[:3]:
            layers.append(('conv', chs, HIDDEN, k, s, p, False))
            if '3bn' in parts:
                layers.append(('bn', HIDDEN))
            if '3relu' in parts or '3gelu' in parts:
                layers.append((act,))
            chs = HIDDEN
        layers.append(('conv', HIDDEN, embed_dim) + schedule[3] + (True,))
    else:
        layers.append(('conv', in_chans, embed_dim, PATCH, PATCH, 0, True))
    if '1bn' in parts:
        layers.append(('bn', embed_dim))
    if '1relu' in parts:
        layers.append(('relu',))
    return layers


def layer_params(layers) -> int:
    total = 0
    for layer in layers:
        if layer[0] == 'conv':
            _, cin, cout, k, _, _, bias = layer
            total += cin * cout * k * k + (cout if bias else 0)
        elif layer[0] == 'bn':
            total += 2 * layer[1]
    return total


def describe(m: nn.Module):
    if isinstance(m, nn.Conv2d):
        return ('conv', m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0], m.padding[0], m.bias is not None)
    if isinstance(m, nn.BatchNorm2d):
        return ('bn', m.num_features)
    if isinstance(m, nn.ReLU):
        return ('relu',)
    if isinstance(m, nn.GELU):
        return ('gelu',)
    raise AssertionError(f'unexpected layer {m}')


def run_traced(stem: nn.Module, x: torch.Tensor):
    """Leaf layers in the order the forward actually runs them, with their output spatial sizes."""
    trace = []
    hooks = [
        m.register_forward_hook(lambda mod, _, out: trace.append((describe(mod), tuple(out.shape[-2:]))))
        for m in stem.modules() if not list(m.children()) and not isinstance(m, nn.Identity)]
    out = stem(x)
    for h in hooks:
        h.remove()
    return out, trace


ALL_VARIANTS = list(PAPER_ROWS.values()) + TABLE3 + TABLE5


def test_every_paper_row_is_a_variant():
    assert set(ALL_VARIANTS) <= set(STEM_VARIANTS)
    for row, name in PAPER_ROWS.items():
        assert resolve_stem(row) == name  # the paper's spelling works as is
    assert resolve_stem('conv') == '3conv_3bn_3relu_1proj' and resolve_stem('patch') == '1proj'


@pytest.mark.parametrize('name', ALL_VARIANTS)
def test_layers_in_execution_order(name):
    stem = ConvStemPatchEmbed(img_size=IMG, patch_size=PATCH, embed_dim=EMBED, stem=name)
    out, trace = run_traced(stem, torch.randn(2, 3, IMG, IMG))
    assert [layer for layer, _ in trace] == expected_layers(name)
    assert out.shape == (2, (IMG // PATCH) ** 2, EMBED)


@pytest.mark.parametrize('name, sizes', [
    ('3conv_3bn_3relu_1proj', [32, 32, 32, 4]),
    ('3conv_3bn_3relu_1proj_s2222', [32, 16, 8, 4]),
    ('1proj_1bn_1relu', [4]),
])
def test_spatial_size_after_each_conv(name, sizes):
    stem = ConvStemPatchEmbed(img_size=IMG, patch_size=PATCH, embed_dim=EMBED, stem=name)
    _, trace = run_traced(stem, torch.randn(1, 3, IMG, IMG))
    assert [hw for layer, hw in trace if layer[0] == 'conv'] == [(s, s) for s in sizes]


@pytest.mark.parametrize('name', ALL_VARIANTS)
def test_param_count_is_layer_sum(name):
    stem = ConvStemPatchEmbed(img_size=IMG, patch_size=PATCH, embed_dim=EMBED, stem=name)
    baseline = PatchEmbed(img_size=IMG, patch_size=PATCH, embed_dim=EMBED)
    count = sum(p.numel() for p in stem.parameters())
    delta = count - sum(p.numel() for p in baseline.parameters())
    assert count == layer_params(expected_layers(name))
    assert delta == layer_params(expected_layers(name)) - layer_params(expected_layers('1proj'))


def test_full_stem_params_for_deit_small_width():
    stem = ConvStemPatchEmbed(patch_size=16, embed_dim=384)
    # 3 convs + 3 BN = 83,520; proj 64*384*8*8 + 384; the patchify stem it replaces has 3*384*16*16 + 384
    assert sum(p.numel() for p in stem.parameters()) == 83_520 + 1_573_248
    assert sum(p.numel() for p in stem.parameters()) - (3 * 384 * 256 + 384) == 1_361_472


@pytest.mark.parametrize('train', [True, False])
def test_bn_relu_is_the_papers_scaled_relu(train):
    """BN + ReLU == beta * max(x_hat + alpha / beta, 0), x_hat the normalised conv output (paper eq. 1)."""
    torch.manual_seed(0)
    stem = ConvStemPatchEmbed(img_size=32, embed_dim=8)
    conv, bn, relu = stem.conv[0], stem.conv[1], stem.conv[2]
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)  # beta > 0
        bn.bias.normal_()
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    bn.train(train)
    z = conv(torch.randn(4, 3, 32, 32)).detach()
    if train:
        mean, var = z.mean((0, 2, 3), keepdim=True), z.var((0, 2, 3), unbiased=False, keepdim=True)
    else:
        mean, var = bn.running_mean.view(1, -1, 1, 1), bn.running_var.view(1, -1, 1, 1)
    x_hat = (z - mean) / torch.sqrt(var + bn.eps)
    alpha, beta = bn.bias.view(1, -1, 1, 1), bn.weight.view(1, -1, 1, 1)
    expected = beta * torch.clamp(x_hat + alpha / beta, min=0)
    torch.testing.assert_close(relu(bn(z)), expected, atol=1e-5, rtol=1e-5)


def test_baseline_is_timms_patch_embed():
    torch.manual_seed(0)
    ref = PatchEmbed(img_size=32, patch_size=16, embed_dim=EMBED)
    stem = ConvStemPatchEmbed(img_size=32, patch_size=16, embed_dim=EMBED, stem='patch')
    stem.load_state_dict(ref.state_dict())  # strict: same keys and shapes
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(stem(x), ref(x))


def test_patchembed_interface():
    """What a timm ViT reads from its embed_layer (timm's PatchEmbed / HybridEmbed interface)."""
    stem = ConvStemPatchEmbed(img_size=(48, 64), patch_size=16, embed_dim=EMBED)
    assert stem.img_size == (48, 64) and stem.patch_size == (16, 16)
    assert stem.grid_size == (3, 4) and stem.num_patches == 12 and stem.feat_ratio() == 16
    assert stem.feat_ratio(as_scalar=False) == (16, 16)
    assert stem.flatten and stem.output_fmt == 'NCHW' and stem.strict_img_size and not stem.dynamic_img_pad
    assert stem.dynamic_feat_size((80, 96)) == (5, 6)
    stem.set_input_size(img_size=(32, 80))
    assert stem.grid_size == (2, 5) and stem.num_patches == 10
    stem.set_input_size(patch_size=16)  # timm's ViT passes its own patch size along: a no-op
    assert stem.patch_size == (16, 16) and stem.img_size == (32, 80)
    assert stem(torch.randn(1, 3, 32, 80)).shape == (1, 10, EMBED)
    nhwc = ConvStemPatchEmbed(img_size=32, embed_dim=EMBED, output_fmt='NHWC', strict_img_size=False)
    assert not nhwc.flatten and nhwc(torch.randn(1, 3, 48, 32)).shape == (1, 3, 2, EMBED)
    nchw = ConvStemPatchEmbed(img_size=32, embed_dim=EMBED, flatten=False)
    assert nchw(torch.randn(1, 3, 32, 32)).shape == (1, EMBED, 2, 2)
    normed = ConvStemPatchEmbed(img_size=32, embed_dim=EMBED, norm_layer=nn.LayerNorm)
    assert list(dict(normed.named_children())) == ['conv', 'proj', 'proj_norm', 'proj_act', 'norm']
    assert isinstance(normed.norm, nn.LayerNorm) and normed.norm.normalized_shape == (EMBED,)


def test_state_dict_keys_unchanged():
    """The layout of the released stem (VOLO's module indices), so existing checkpoints keep loading."""
    stem = ConvStemPatchEmbed(img_size=32, embed_dim=EMBED)
    bn = ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    assert list(stem.state_dict()) == (
        ['conv.0.weight'] + [f'conv.1.{k}' for k in bn] + ['conv.3.weight'] + [f'conv.4.{k}' for k in bn]
        + ['conv.6.weight'] + [f'conv.7.{k}' for k in bn] + ['proj.weight', 'proj.bias'])
    bn_proj = ConvStemPatchEmbed(img_size=32, embed_dim=EMBED, stem='1proj_1bn_1relu')
    assert list(bn_proj.state_dict()) == ['proj.weight', 'proj.bias'] + [f'proj_norm.{k}' for k in bn]


@pytest.mark.filterwarnings('ignore:`torch.jit.script` is deprecated:FutureWarning')
@pytest.mark.parametrize('name, kwargs', [
    ('conv', dict(img_size=32)),
    ('1proj_1bn_1relu', dict(img_size=32)),
    ('conv', dict(img_size=None, dynamic_img_pad=True)),
    ('conv', dict(img_size=32, output_fmt='NHWC', strict_img_size=False)),
])
def test_fx_and_torchscript_match_eager(name, kwargs):
    stem = ConvStemPatchEmbed(embed_dim=EMBED, stem=name, **kwargs).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(torch.fx.symbolic_trace(stem)(x), stem(x))
    torch.testing.assert_close(torch.jit.script(stem)(x), stem(x))


def test_first_conv_is_conv0_for_every_conv_variant():
    for name in ALL_VARIANTS:
        stem = ConvStemPatchEmbed(img_size=32, embed_dim=EMBED, stem=name, in_chans=1)
        first = stem.conv[0] if stem.conv is not None else stem.proj
        assert isinstance(first, nn.Conv2d) and first.in_channels == 1


def test_dynamic_img_pad_pads_to_the_total_stride():
    torch.manual_seed(0)
    stem = ConvStemPatchEmbed(img_size=None, embed_dim=EMBED, dynamic_img_pad=True).eval()
    x = torch.randn(1, 3, 70, 50)
    out = stem(x)
    assert out.shape == (1, 5 * 4, EMBED)  # ceil(70/16) x ceil(50/16)
    assert stem.dynamic_feat_size((70, 50)) == (5, 4)
    expected = stem.proj(stem.conv(F.pad(x, (0, 14, 0, 10)))).flatten(2).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    fixed = ConvStemPatchEmbed(img_size=200, embed_dim=EMBED, dynamic_img_pad=True)
    assert fixed.grid_size == (13, 13) and fixed(torch.randn(1, 3, 200, 200)).shape == (1, 169, EMBED)


def test_unknown_variant_lists_valid_names():
    with pytest.raises(ValueError, match=r"Unknown stem '3conv_2bn'; valid: conv, patch, 3conv_3bn_3relu_1proj, "):
        ConvStemPatchEmbed(stem='3conv_2bn')
    with pytest.raises(ValueError, match=r'stem must be a variant name \(str\), got 3; valid: conv, patch'):
        ConvStemPatchEmbed(stem=3)


def test_img_size_not_divisible_by_total_stride():
    with pytest.raises(ValueError, match=r'img_size \(100, 100\) is not divisible by the stem total stride 16; '
                                         r'use a multiple of 16 or dynamic_img_pad=True'):
        ConvStemPatchEmbed(img_size=100)
    stem = ConvStemPatchEmbed(img_size=64, embed_dim=EMBED)
    with pytest.raises(ValueError, match=r'img_size \(64, 72\) is not divisible by the stem total stride 16'):
        stem.set_input_size(img_size=(64, 72))


def test_input_size_errors():
    """Checked in forward with timm's _assert (AssertionError), as timm's PatchEmbed does; traceable."""
    strict = ConvStemPatchEmbed(img_size=64, embed_dim=EMBED)
    with pytest.raises(AssertionError, match=r'Input height 32 does not match the model img_size \(64, 64\)'):
        strict(torch.randn(1, 3, 32, 64))
    with pytest.raises(AssertionError, match=r'Input width .* does not match the model img_size \(64, 64\)'):
        torch.fx.symbolic_trace(strict)(torch.randn(1, 3, 64, 48))  # the check survives tracing
    dynamic = ConvStemPatchEmbed(img_size=64, embed_dim=EMBED, strict_img_size=False)
    with pytest.raises(AssertionError, match=r'Input height 70 is not divisible by the stem total stride 16; .*'
                                             r'dynamic_img_pad=True'):
        dynamic(torch.randn(1, 3, 70, 64))
    free = ConvStemPatchEmbed(img_size=None, embed_dim=EMBED)
    with pytest.raises(AssertionError, match=r'Input width 40 is not divisible by the stem total stride 16'):
        free(torch.randn(1, 3, 64, 40))


def test_bad_patch_sizes():
    with pytest.raises(ValueError, match=r"stem '3conv_3bn_3relu_1proj_s2222' needs a square patch_size divisible "
                                         r"by 16, got 8"):
        ConvStemPatchEmbed(img_size=64, patch_size=8, stem='3conv_3bn_3relu_1proj_s2222')
    with pytest.raises(ValueError, match=r"stem '3conv_3bn_3relu_1proj' needs a square patch_size divisible by 2"):
        ConvStemPatchEmbed(img_size=63, patch_size=7)
    stem = ConvStemPatchEmbed(img_size=64, embed_dim=EMBED)
    with pytest.raises(ValueError, match=r'The patch size of a conv stem cannot be changed \(\(16, 16\) -> \(8, 8\)\)'):
        stem.set_input_size(patch_size=8)
