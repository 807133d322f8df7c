"""AlterNet: sizes against the research note, block layout, timm behaviour and bad input.

Parameter and MAC counts are taken on the meta device (shapes only, no compute), so ImageNet models
cost no real forward. MACs are counted "thop-style", the way the paper's authors counted them (their
issue 33): Conv2d and Linear multiply-accumulates, 4 per element for an affine BatchNorm, kernel+1 per
output of adaptive average pooling, nothing for activations, max-pooling or the attention matmuls.
"""
from functools import partial
from typing import List, Tuple

import pytest
import timm
import torch
import torch.nn as nn
from timm.layers import BatchNormAct2d, DropPath, create_conv2d
from timm.models._features_fx import create_feature_extractor, get_graph_node_names
from timm.models.resnetv2 import DownsampleConv, PreActBasic, PreActBottleneck
from torch.nn.modules.batchnorm import _BatchNorm

from timm_ext.models.alternet import (
    AlterNet,
    AlterNetBasic,
    AlterNetBottleneck,
    AlterNetFeatureList,
    LocalMsaBlock,
    alternet_msa_indices,
)

DEPTHS = (18, 34, 50, 101, 152)
_CONV_KW = dict(conv_layer=create_conv2d, norm_layer=partial(BatchNormAct2d, act_layer='relu'))
TINY = dict(channels=(16, 32, 64, 128), num_heads=(1, 1, 2, 2), head_dim=8, num_classes=10)


def thop_style_macs(model: nn.Module, input_size: Tuple[int, ...]) -> int:
    total = 0

    def hook(module, inputs, output):
        nonlocal total
        x = inputs[0]
        if isinstance(module, nn.Conv2d):
            k_h, k_w = module.kernel_size
            total += output.numel() * (module.in_channels // module.groups) * k_h * k_w
        elif isinstance(module, nn.Linear):
            total += module.in_features * output.numel()
        elif isinstance(module, _BatchNorm):
            total += 2 * x.numel() * (2 if module.affine else 1)
        elif isinstance(module, nn.AdaptiveAvgPool2d):
            total += (x.shape[-2] * x.shape[-1] // (output.shape[-2] * output.shape[-1]) + 1) * output.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model.eval()(torch.empty(1, *input_size, device='meta'))
    finally:
        for handle in handles:
            handle.remove()
    return total


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta_model(name: str, **kwargs) -> AlterNet:
    return timm.create_model(name, device='meta', **kwargs)


def _closed_form_params(depth: int, msa_blocks, cifar: bool, num_classes: int, window: int) -> int:
    """Parameter count from the block formulas (research note §1.6-1.8), independent of the model code."""
    basic = depth in (18, 34)
    layers = {18: (2, 2, 2, 2), 34: (3, 4, 6, 4), 50: (3, 4, 6, 4), 101: (3, 4, 23, 4), 152: (3, 8, 36, 4)}[depth]
    expansion = 1 if basic else 4
    total = 64 * 3 * (3 * 3 if cifar else 7 * 7)
    c_in = 64
    for stage, (n, m, heads) in enumerate(zip(layers, msa_blocks, (3, 6, 12, 24))):
        c = (64 << stage) * expansion
        w = c // expansion
        msa = set(range(n - 2 * m + 1, n, 2))
        for i in range(n):
            cin = c_in if i == 0 else c
            if i in msa:  # 2C + C w + 2w + 3 w h d + h d C + C + (2s-1)^2
                total += 2 * c + c * w + 2 * w + 3 * w * heads * 64 + heads * 64 * c + c + (2 * window - 1) ** 2
            elif basic:
                total += 2 * cin + 9 * cin * c + 2 * c + 9 * c * c
            else:
                total += 2 * cin + cin * w + 2 * w + 9 * w * w + 2 * w + w * c
            if i == 0 and (stage > 0 or cin != c):
                total += cin * c  # projection shortcut
        c_in = c
    return total + 2 * c_in + c_in * num_classes + num_classes


# --- sizes --------------------------------------------------------------------------------------------------

@pytest.mark.timm_models_only
@pytest.mark.parametrize('name, kwargs, params, macs', [
    # the targets (maintainer's issue 33: 33.0M / 1.52G, 28.2M / 1.38G, 30.0M / 4.35G) and the note's
    # exact reproduction with the official code: 33,012,840 / 1.515G, 28.16M / 1.381G, 30.01M / 4.344G
    ('alternet_50_cifar', {}, 33_012_840, 1_515_268_096),
    ('alternet_50_nomsa_cifar', {}, 28_160_164, 1_381_312_512),
    ('alternet_50_nomsa', {}, 30_011_944, 4_344_281_088),
    ('alternet_50', {}, 35_915_038, 4_959_639_552),  # official dnn_50 on ImageNet: 35,915,038 / 4.960G
    ('alternet_50', dict(msa_blocks=(0, 1, 1, 2)), 34_865_100, 4_754_520_064),  # issue 33's 34.9M / 4.75G
    ('alternet_50_cifar', dict(msa_blocks=(0, 1, 3, 2)), 34_062_538, 1_582_245_888),  # note: 34,062,538 / 1.582G
])
def test_params_and_thop_macs_match_the_paper_and_note(name, kwargs, params, macs):
    model = _meta_model(name, **kwargs)
    assert _params(model) == params
    assert thop_style_macs(model, model.pretrained_cfg['input_size']) == macs


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name, kwargs, millions', [
    # research note §2: other code builders, ImageNet / CIFAR-100 with window 4 and the code's MSA layout
    ('alternet_18', {}, 9.97), ('alternet_34', {}, 22.83), ('alternet_101', {}, 54.91), ('alternet_152', {}, 70.55),
    ('alternet_18_cifar', {}, 9.50),
    ('alternet_34_cifar', dict(msa_blocks=(0, 1, 3, 2)), 22.36),
    ('alternet_101_cifar', dict(msa_blocks=(0, 1, 3, 2)), 53.05),
    ('alternet_152_cifar', dict(msa_blocks=(0, 1, 3, 2)), 68.70),
])
def test_params_of_the_other_depths_match_the_note(name, kwargs, millions):
    assert round(_params(_meta_model(name, **kwargs)) / 1e6, 2) == millions


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name', timm.list_models('alternet_*'))
def test_params_of_every_registered_model_match_the_closed_form(name):
    model = _meta_model(name)
    cifar = name.endswith('_cifar')
    depth = int(name.split('_')[1])
    assert _params(model) == _closed_form_params(
        depth, model.msa_blocks, cifar, model.num_classes, window=4 if cifar else 7)


def test_registered_names_and_cfgs():
    names = set(timm.list_models('alternet_*'))
    expected = {f'alternet_{d}{suffix}' for d in DEPTHS for suffix in ('', '_cifar', '_nomsa', '_nomsa_cifar')}
    assert names == expected
    cfg = timm.get_pretrained_cfg('alternet_50_cifar').to_dict()
    assert (cfg['num_classes'], cfg['input_size'], cfg['crop_pct']) == (100, (3, 32, 32), 1.0)
    assert timm.get_pretrained_cfg('alternet_50').to_dict()['input_size'] == (3, 224, 224)
    assert _meta_model('alternet_50_cifar').num_classes == 100


# --- structure ----------------------------------------------------------------------------------------------

def _msa_layout(model: AlterNet) -> List[List[int]]:
    return [[i for i, b in enumerate(stage.blocks) if isinstance(b, LocalMsaBlock)] for stage in model.stages]


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name, layout', [
    ('alternet_50_cifar', [[], [3], [5], [1, 3]]),  # paper Fig. 11: CCC | CCCM | CCCCCM | CMCM
    ('alternet_50', [[], [3], [1, 3, 5], [1, 3]]),  # CCC | CCCM | CMCMCM | CMCM
    ('alternet_18', [[], [1], [1], [1]]),
    ('alternet_34', [[], [3], [1, 3, 5], [1, 3]]),
    ('alternet_101', [[], [3], [18, 20, 22], [1, 3]]),  # 17 C then CMCMCM
    ('alternet_152', [[], [7], [31, 33, 35], [1, 3]]),  # 30 C then CMCMCM
    ('alternet_152_cifar', [[], [7], [35], [1, 3]]),
    ('alternet_50_nomsa', [[], [], [], []]),
])
def test_msa_block_indices_per_stage(name, layout):
    assert _msa_layout(_meta_model(name)) == layout


def test_msa_indices_helper():
    assert alternet_msa_indices(6, 3) == (1, 3, 5)
    assert alternet_msa_indices(6, 1) == (5,)
    assert alternet_msa_indices(4, 0) == ()


def test_stage_structure_of_alternet_50():
    model = _meta_model('alternet_50')
    first = [stage.blocks[0] for stage in model.stages]
    assert [b.conv2.stride for b in first] == [(1, 1), (2, 2), (2, 2), (2, 2)]  # stride on the 3x3 (v1.5)
    assert all(b.downsample is not None for b in first)
    assert all(b.downsample is None for s in model.stages for b in s.blocks[1:] if not isinstance(b, LocalMsaBlock))
    msa = model.stages[3].blocks[1]
    assert msa.proj_in.weight.shape == (512, 2048, 1, 1)
    assert msa.attn.qkv.weight.shape == (3 * 24 * 64, 512)
    assert msa.attn.proj.weight.shape == (2048, 24 * 64) and msa.attn.proj.bias is not None
    assert msa.attn.relative_position_bias_table.shape == (13 * 13,)
    assert isinstance(model.stem.pool, nn.MaxPool2d) and model.stem.conv.kernel_size == (7, 7)
    cifar = _meta_model('alternet_50_cifar')
    assert not hasattr(cifar.stem, 'pool') and cifar.stem.conv.kernel_size == (3, 3)
    assert cifar.stem.conv.stride == (1, 1)


def test_basic_depths_have_no_shortcut_in_stage_1():
    """As the official BasicBlock: 64 -> 64 at stride 1 keeps the identity."""
    model = _meta_model('alternet_18')
    assert model.stages[0].blocks[0].downsample is None
    assert model.stages[1].blocks[0].downsample is not None


def test_stochastic_depth_is_linear_over_all_blocks():
    model = _meta_model('alternet_50_cifar', drop_path_rate=0.1)
    blocks = [b for s in model.stages for b in s.blocks]
    rates = [b.drop_path.drop_prob if isinstance(b.drop_path, DropPath) else 0. for b in blocks]
    assert len(rates) == 17
    assert rates == pytest.approx([0.1 * j / 16 for j in range(17)])
    assert isinstance(blocks[0].drop_path, nn.Identity)


# --- forward ------------------------------------------------------------------------------------------------

@pytest.mark.timm_models_only
def test_alternet_50_cifar_forward():
    torch.manual_seed(0)
    model = timm.create_model('alternet_50_cifar').eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 100) and torch.isfinite(out).all()


@pytest.fixture
def tiny() -> AlterNet:
    torch.manual_seed(0)
    return timm.create_model('alternet_18_cifar', **TINY).eval()


def test_inputs_the_window_does_not_divide_work(tiny):
    """ImageNet-style windows on odd sizes (the official code crashes): padded and masked, finite."""
    torch.manual_seed(1)
    model = timm.create_model('alternet_18', **TINY).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 100, 133))
        out_cifar = tiny(torch.randn(1, 3, 20, 28))
    assert out.shape == (1, 10) and torch.isfinite(out).all()
    assert out_cifar.shape == (1, 10) and torch.isfinite(out_cifar).all()


def test_features_only_stem_then_one_feature_per_stage():
    """Level 0 is the stem conv (reduction 1 for the CIFAR stem, 2 before the ImageNet stem's max-pool), then one
    level per stage, as timm's ResNetV2."""
    torch.manual_seed(0)
    model = timm.create_model('alternet_18_cifar', features_only=True, **TINY).eval()
    assert model.feature_info.channels() == [64, 16, 32, 64, 128]
    assert model.feature_info.reduction() == [1, 1, 2, 4, 8]
    with torch.no_grad():
        feats = model(torch.randn(2, 3, 32, 32))
    assert [tuple(f.shape) for f in feats] == [
        (2, 64, 32, 32), (2, 16, 32, 32), (2, 32, 16, 16), (2, 64, 8, 8), (2, 128, 4, 4)]
    imagenet = timm.create_model('alternet_18', features_only=True, out_indices=(0, 2, 4), **TINY).eval()
    assert imagenet.feature_info.reduction() == [2, 8, 32]
    assert imagenet.feature_info.module_name() == ['stem.conv', 'stages.1', 'stages.3']
    with torch.no_grad():
        assert [f.shape[-1] for f in imagenet(torch.randn(1, 3, 64, 64))] == [32, 8, 2]


@pytest.mark.timm_models_only
def test_resnet50_out_indices_pick_the_same_levels_on_alternet_50():
    """A resnet50 FPN config (out_indices=(1, 2, 3, 4)) on alternet_50: reductions 4/8/16/32 and resnet50's channels;
    the maps have the sizes and channels feature_info names."""
    resnet = timm.create_model('resnet50', features_only=True, out_indices=(1, 2, 3, 4), device='meta')
    model = timm.create_model('alternet_50', features_only=True, out_indices=(1, 2, 3, 4)).eval()
    assert model.feature_info.reduction() == resnet.feature_info.reduction() == [4, 8, 16, 32]
    assert model.feature_info.channels() == resnet.feature_info.channels() == [256, 512, 1024, 2048]
    with torch.no_grad():
        feats = model(torch.randn(1, 3, 64, 64))
    assert [f.shape[1] for f in feats] == model.feature_info.channels()
    assert [64 // f.shape[-1] for f in feats] == [64 // f.shape[-2] for f in feats] == [4, 8, 16, 32]
    levels = timm.create_model('alternet_50', device='meta').feature_info
    assert [(f['module'], f['reduction'], f['num_chs']) for f in levels][0] == ('stem.conv', 2, 64)


def test_features_only_equals_forward_intermediates(tiny):
    """The same levels through timm's feature wrapper (module by module) and through forward_intermediates."""
    features = AlterNetFeatureList(tiny, out_indices=(0, 1, 2, 3, 4), flatten_sequential=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        inters = tiny.forward_intermediates(x, intermediates_only=True)
        feats = features(x)
    assert len(feats) == len(inters) == len(tiny.feature_info) == 5
    for feat, inter in zip(feats, inters):
        torch.testing.assert_close(feat, inter, rtol=1e-5, atol=1e-5)


LEVELS_50 = (
    'this AlterNet has 5 feature levels, 0 stem.conv (reduction 2, 64 chs), 1 stages.0 (reduction 4, 256 chs), '
    '2 stages.1 (reduction 8, 512 chs), 3 stages.2 (reduction 16, 1024 chs), 4 stages.3 (reduction 32, 2048 chs); '
    'use indices 0 to 4 (negative ones count from the end) or an int n <= 5 for the last n.')


def test_out_of_range_feature_index_names_the_levels():
    with pytest.raises(ValueError) as e:
        timm.create_model('alternet_50', features_only=True, out_indices=(1, 2, 3, 4, 5), device='meta')
    assert str(e.value) == f'out_indices=(1, 2, 3, 4, 5) is out of range: {LEVELS_50}'
    model = timm.create_model('alternet_50', device='meta')
    with pytest.raises(ValueError) as e:
        model.forward_intermediates(torch.empty(1, 3, 64, 64, device='meta'), indices=[-6, 0])
    assert str(e.value) == f'indices=[-6, 0] is out of range: {LEVELS_50}'
    with pytest.raises(ValueError, match=r'^indices=6 is out of range: this AlterNet has 5 feature levels, 0 stem'):
        model.prune_intermediate_layers(indices=6)


def test_forward_intermediates_match_features_and_forward(tiny):
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, inters = tiny.forward_intermediates(x)
        torch.testing.assert_close(final, tiny.forward_features(x))
        assert [t.shape[1] for t in inters] == [64, 16, 32, 64, 128]
        torch.testing.assert_close(inters[0], tiny.stem(x))
        last_two = tiny.forward_intermediates(x, indices=2, intermediates_only=True)
        torch.testing.assert_close(last_two[0], inters[3])
        normed = tiny.forward_intermediates(x, indices=[4], norm=True, intermediates_only=True)
        torch.testing.assert_close(normed[0], final)
        early = tiny.forward_intermediates(x, indices=[2], stop_early=True, intermediates_only=True)
        torch.testing.assert_close(early[0], inters[2])


def test_forward_intermediates_stem_level_is_before_the_max_pool():
    torch.manual_seed(0)
    model = timm.create_model('alternet_18', **TINY).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        final, (stem,) = model.forward_intermediates(x, indices=[0], stop_early=True)
        torch.testing.assert_close(stem, model.stem.conv(x))
    assert stem.shape == (1, 64, 32, 32) and final.shape == (1, 64, 16, 16)  # final: after the max-pool


def test_prune_intermediate_layers(tiny):
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        full = tiny.forward_intermediates(x, intermediates_only=True)
    assert tiny.prune_intermediate_layers(indices=(1, 2)) == [1, 2]
    assert len(tiny.stages) == 2 and tiny.num_classes == 0 and tiny.num_features == 32
    with torch.no_grad():
        final, pruned = tiny.forward_intermediates(x, indices=(1, 2))
    torch.testing.assert_close(pruned[1], full[2])
    torch.testing.assert_close(final, full[2])  # the final norm is sized for the last stage: pruned with it
    stem_only = timm.create_model('alternet_18', **TINY)
    assert stem_only.prune_intermediate_layers(indices=(0,)) == [0]
    assert len(stem_only.stages) == 0 and list(dict(stem_only.stem.named_children())) == ['conv']


def test_reset_classifier_and_pre_logits(tiny):
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert tiny.forward_head(tiny.forward_features(x), pre_logits=True).shape == (2, 128)
        tiny.reset_classifier(5)
        assert tiny(x).shape == (2, 5) and tiny.get_classifier().out_features == 5
        tiny.reset_classifier(0)
        assert tiny(x).shape == (2, 128)


def test_grad_checkpointing_gives_the_same_gradients(tiny):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 32, 32)
    tiny.train()
    reference = timm.create_model('alternet_18_cifar', **TINY).train()
    reference.load_state_dict(tiny.state_dict())
    tiny.set_grad_checkpointing(True)
    assert all(stage.grad_checkpointing for stage in tiny.stages)
    tiny(x).square().mean().backward()
    reference(x).square().mean().backward()
    for (name, p), p_ref in zip(tiny.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, msg=name)


def test_group_matcher_and_no_weight_decay(tiny):
    from timm.models import group_parameters
    groups = group_parameters(tiny, tiny.group_matcher())
    params = [n for n, _ in tiny.named_parameters()]
    assert sorted(n for g in groups.values() for n in g) == sorted(params)
    ordered = [groups[k] for k in sorted(groups)]
    assert all(n.startswith('stem.') for n in ordered[0])
    assert 'norm.weight' in ordered[-2] and ordered[-1] == ['head.fc.weight', 'head.fc.bias']
    coarse = group_parameters(tiny, tiny.group_matcher(coarse=True))
    assert len(coarse) == 1 + 4 + 1  # stem, 4 stages, head/norm
    nwd = tiny.no_weight_decay()
    assert nwd == {n for n in params if n.endswith('relative_position_bias_table')} and len(nwd) == 3


@pytest.mark.slow
def test_torch_compile_forward(tiny):
    """fullgraph=True: no graph break; dynamic=False: a new input size recompiles (padded path) quickly."""
    compiled = torch.compile(tiny, backend='aot_eager', fullgraph=True, dynamic=False)
    with torch.no_grad():
        for size in ((32, 32), (20, 28)):
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(compiled(x), tiny(x))


@pytest.mark.slow
def test_torch_compile_train_step(tiny):
    """fullgraph=True in training mode too (the explicit-softmax kernel): same loss and gradients as eager."""
    torch.manual_seed(3)
    x = torch.randn(2, 3, 20, 28)
    tiny.train()
    eager = timm.create_model('alternet_18_cifar', **TINY).train()
    eager.load_state_dict(tiny.state_dict())
    compiled = torch.compile(tiny, backend='aot_eager', fullgraph=True, dynamic=False)
    compiled(x).square().mean().backward()
    eager(x).square().mean().backward()
    for (name, p), p_ref in zip(tiny.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, msg=name)


def test_channels_last_input_gives_the_same_output(tiny):
    """Every layer keeps the memory format it is given (the attention included); the numbers do not change."""
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(tiny(x.contiguous(memory_format=torch.channels_last)), tiny(x))
        feats = tiny.to(memory_format=torch.channels_last).forward_features(
            x.contiguous(memory_format=torch.channels_last))
    assert feats.is_contiguous(memory_format=torch.channels_last)


def _block_reference(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The blocks' formulas with an out-of-place residual sum: timm's own forward for the Conv blocks."""
    if isinstance(block, LocalMsaBlock):
        return block.drop_path(block.attn(block.norm2(block.proj_in(block.norm1(x))))) + x
    base = PreActBottleneck if isinstance(block, PreActBottleneck) else PreActBasic
    return base.forward(block, x)


@pytest.mark.parametrize('training', [False, True], ids=['eval', 'train'])
@pytest.mark.parametrize('make_block', [
    lambda: AlterNetBottleneck(16, 32, stride=2, proj_layer=DownsampleConv, **_CONV_KW),
    lambda: AlterNetBottleneck(32, 32, drop_path_rate=0.5, **_CONV_KW),
    lambda: AlterNetBasic(16, 16, drop_path_rate=0.5, **_CONV_KW),
    lambda: LocalMsaBlock(16, num_heads=2, head_dim=4, window_size=2, drop_path_rate=0.5),
], ids=['bottleneck_downsample', 'bottleneck_drop_path', 'basic', 'msa'])
def test_in_place_residual_sum_keeps_outputs_and_gradients(make_block, training):
    """The residual sum written into the block's last output gives timm's out-of-place result and gradients
    (input and every parameter), with drop-path masks drawn alike, in both modes and both memory formats."""
    torch.manual_seed(5)
    block = make_block().train(training)
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(4, block.norm1.num_features, 6, 6).contiguous(memory_format=fmt).requires_grad_()
        outs, grads = [], []
        for forward in (block, lambda t: _block_reference(block, t)):
            torch.manual_seed(6)
            out = forward(x)
            outs.append(out)
            grads.append(torch.autograd.grad(out.square().sum(), [x, *block.parameters()]))
        torch.testing.assert_close(outs[0], outs[1])
        for got, ref in zip(*grads):
            torch.testing.assert_close(got, ref)


def _stage_output_is_channels_last(model: AlterNet, x: torch.Tensor) -> Tuple[torch.Tensor, List[bool]]:
    flags = []
    hooks = [stage.register_forward_hook(lambda m, args, out: flags.append(
        out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous())) for stage in model.stages]
    with torch.no_grad():
        logits = model(x)
    for hook in hooks:
        hook.remove()
    return logits, flags


def test_trunk_runs_channels_last_and_hands_back_the_input_format(tiny):
    """channels_last=True (default): an NCHW input runs every stage channels-last; forward_features and
    forward_intermediates give it back NCHW; the logits equal those of channels_last=False."""
    torch.manual_seed(7)
    x = torch.randn(2, 3, 32, 32)
    keep = timm.create_model('alternet_18_cifar', channels_last=False, **TINY).eval()
    keep.load_state_dict(tiny.state_dict())
    logits, flags = _stage_output_is_channels_last(tiny, x)
    logits_keep, flags_keep = _stage_output_is_channels_last(keep, x)
    torch.testing.assert_close(logits, logits_keep, rtol=1e-5, atol=1e-5)
    assert flags == [True] * 4 and flags_keep == [False] * 4
    with torch.no_grad():
        final, inters = tiny.forward_intermediates(x)
        assert tiny.forward_features(x).is_contiguous() and final.is_contiguous()
        assert all(t.is_contiguous() for t in inters)
        cl_feats = tiny.forward_features(x.contiguous(memory_format=torch.channels_last))
    assert cl_feats.is_contiguous(memory_format=torch.channels_last) and not cl_feats.is_contiguous()


# --- timm's model contract (its tests/test_models.py) on small AlterNets ---------------------------------------
# the padded ImageNet-style layout at 64 px (stage maps 16/8/4/2 against window 7), the CIFAR layout, a baseline
CONTRACT = [('alternet_18', 64), ('alternet_18_cifar', 32), ('alternet_34_cifar', 24), ('alternet_18_nomsa', 64)]


def _contract_model(name: str, **kwargs) -> AlterNet:
    torch.manual_seed(0)
    return timm.create_model(name, **dict(TINY, **kwargs))


def _output_graph(model: nn.Module) -> nn.Module:
    train_nodes, eval_nodes = get_graph_node_names(model)
    return create_feature_extractor(model, [train_nodes[-1] if model.training else eval_nodes[-1]])


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name, size', CONTRACT)
def test_fx_forward_equals_eager(name, size):
    model = _contract_model(name).eval()
    x = torch.randn(1, 3, size, size)
    with torch.inference_mode():
        out = model(x)
        (fx_out,) = _output_graph(model)(x).values()
    assert torch.equal(fx_out, out)


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name, size', CONTRACT)
def test_fx_backward_reaches_every_parameter(name, size):
    model = _contract_model(name, num_classes=7).train()
    graph = _output_graph(model)
    (out,) = graph(torch.randn(2, 3, size, size)).values()
    assert out.shape == (2, 7)
    out.mean().backward()
    assert [n for n, p in graph.named_parameters() if p.grad is None] == []
    assert len(list(graph.parameters())) == len(list(model.parameters()))


@pytest.mark.timm_models_only
@pytest.mark.filterwarnings('ignore:`torch.jit.script` is deprecated:FutureWarning')
@pytest.mark.parametrize('name, size', CONTRACT)
def test_torchscript_and_fx_torchscript(name, size):
    with timm.set_scriptable(True):
        model = _contract_model(name).eval()
    x = torch.randn(1, 3, size, size)
    scripted = torch.jit.script(model)
    fx_scripted = torch.jit.script(_output_graph(model))
    with torch.inference_mode():
        out = model(x)
        torch.testing.assert_close(scripted(x), out)
        (fx_out,) = fx_scripted(x).values()
        torch.testing.assert_close(fx_out, out)


def test_pretrained_true_raises_clear_error():
    with pytest.raises(RuntimeError, match='No pretrained weights are published for alternet_50_cifar'):
        timm.create_model('alternet_50_cifar', pretrained=True)


# --- bad input ----------------------------------------------------------------------------------------------

def test_more_msas_than_a_stage_fits():
    with pytest.raises(ValueError, match=r'msa_blocks=\(0, 1, 2, 1\): stage 3 has 2 blocks, which fits at most 1 MSA'):
        timm.create_model('alternet_18', msa_blocks=(0, 1, 2, 1), device='meta')
    with pytest.raises(ValueError, match=r'stage 1 has 3 blocks, which fits at most 1 MSA blocks .*, got 4'):
        AlterNet(depth=50, msa_blocks=(4, 0, 0, 0), device='meta')


def test_msa_pattern_of_the_wrong_length():
    with pytest.raises(ValueError, match=r'msa_blocks=\(0, 1, 1\) needs one entry per stage \(4 stages'):
        AlterNet(depth=50, msa_blocks=(0, 1, 1), device='meta')


def test_window_larger_than_the_map_without_padding():
    model = timm.create_model('alternet_18_cifar', window_size=8, pad_to_window=False, **TINY).eval()
    with pytest.raises(ValueError, match=r'Feature map 4x4 is smaller than window_size 8 and pad_to_window=False'):
        model(torch.randn(1, 3, 32, 32))


def test_unknown_depth():
    with pytest.raises(ValueError, match=r'Unknown AlterNet depth 42: choose one of 18, 34, 50, 101, 152\.'):
        AlterNet(depth=42)


@pytest.mark.parametrize('kwargs, message', [
    (dict(head_dim=0), r'head_dim must be a positive integer, got 0$'),
    (dict(head_dim=32.0), r'head_dim must be a positive integer, got 32\.0$'),
    (dict(num_heads=(3, 6, 0, 24)), r'num_heads must be positive ints, one per stage, got \(3, 6, 0, 24\)\.'),
    (dict(num_heads=8), r'num_heads must be a sequence with one entry per stage, got 8\.'),
    (dict(num_heads=(3, 6)), r'num_heads=\(3, 6\) needs one entry per stage \(4 stages'),
])
def test_bad_head_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        timm.create_model('alternet_50', device='meta', **kwargs)


def test_unknown_stem_and_bad_window():
    with pytest.raises(ValueError, match=r"Unknown stem_type 'tiny': choose one of imagenet, cifar"):
        AlterNet(depth=18, stem_type='tiny', device='meta')
    with pytest.raises(ValueError, match=r'window_size must be a positive integer, got 0'):
        AlterNet(depth=18, window_size=0, device='meta')


def test_gradients_stay_channels_last_through_every_block(tiny):
    """A train step on an NCHW input: the gradient of every block's input is channels-last like the input itself
    (an NCHW gradient anywhere makes every conv backward above it copy its operands: a slow train step)."""
    tiny.train()
    layouts = []

    def keep_grad_layout(module, args):
        args[0].register_hook(lambda g: layouts.append(
            (type(module).__name__, g.is_contiguous(memory_format=torch.channels_last) and not g.is_contiguous())))

    hooks = [block.register_forward_pre_hook(keep_grad_layout) for stage in tiny.stages for block in stage.blocks]
    tiny(torch.randn(2, 3, 32, 32)).square().mean().backward()
    for hook in hooks:
        hook.remove()
    assert len(layouts) == sum(len(stage.blocks) for stage in tiny.stages)
    assert [name for name, channels_last in layouts if not channels_last] == []
