"""how-do-vits-work's CIFAR-100 baselines with their released weights (``*.hdvw_cifar100``).

No official file is downloaded and no official code is used: each test writes a checkpoint in the official
layout (``{'state_dict': ..., 'name': ...}``, keys and shapes from a table written here after the official
code and timm 0.5's modules) with random values, places it where timm's ``url`` loader looks
(``<cache_dir>/<release file name>``), loads the registered tag with ``pretrained=True``, and compares the
logits with a forward pass computed here, with torch.nn.functional, straight from the official state_dict.
"""
import math
from typing import Dict, Tuple

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models import get_pretrained_cfg

import timm_ext  # noqa: F401  (registers the models)

RELEASE = 'https://github.com/xxxnell/how-do-vits-work-storage/releases/download/v0.1/'
FILES = {
    'vit_tiny_patch2_32': 'vit_ti_cifar100_9857b21357.pth.tar',
    'pit_ti_patch2_32': 'pit_ti_cifar100_0645889efb.pth.tar',
    'swin_tiny_patch1_window4_32': 'swin_ti_cifar100_ec2894492b.pth.tar',
    'resnet50_cifar': 'resnet_50_cifar100_691cc9a9e4.pth.tar',
}
Shapes = Dict[str, Tuple[int, ...]]


# --- the official layouts: key -> shape ------------------------------------------------------------------

def _block(p: str, dim: int, qkv_bias: bool) -> Shapes:
    """A ViT block of timm 0.5 (norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2)."""
    t = {p + 'norm1.weight': (dim,), p + 'norm1.bias': (dim,), p + 'attn.qkv.weight': (3 * dim, dim),
         p + 'attn.proj.weight': (dim, dim), p + 'attn.proj.bias': (dim,), p + 'norm2.weight': (dim,),
         p + 'norm2.bias': (dim,), p + 'mlp.fc1.weight': (4 * dim, dim), p + 'mlp.fc1.bias': (4 * dim,),
         p + 'mlp.fc2.weight': (dim, 4 * dim), p + 'mlp.fc2.bias': (dim,)}
    if qkv_bias:
        t[p + 'attn.qkv.bias'] = (3 * dim,)
    return t


def vit_ti_layout() -> Shapes:
    t = {'cls_token': (1, 1, 192), 'pos_embed': (1, 257, 192), 'patch_embed.proj.weight': (192, 3, 2, 2),
         'patch_embed.proj.bias': (192,)}
    for i in range(12):
        t.update(_block(f'blocks.{i}.', 192, qkv_bias=False))
    return dict(t, **{'norm.weight': (192,), 'norm.bias': (192,), 'head.weight': (100, 192), 'head.bias': (100,)})


def pit_ti_layout() -> Shapes:
    """timm 0.5's PiT: a stage's pool (depthwise conv + fc of the class token) at the end of the stage."""
    t = {'pos_embed': (1, 64, 31, 31), 'cls_token': (1, 1, 64), 'patch_embed.conv.weight': (64, 3, 2, 2),
         'patch_embed.conv.bias': (64,)}
    for s, (depth, dim) in enumerate(zip((2, 6, 4), (64, 128, 256))):
        for j in range(depth):
            t.update(_block(f'transformers.{s}.blocks.{j}.', dim, qkv_bias=True))
        if s < 2:
            p = f'transformers.{s}.pool.'
            t.update({p + 'conv.weight': (2 * dim, 1, 3, 3), p + 'conv.bias': (2 * dim,),
                      p + 'fc.weight': (2 * dim, dim), p + 'fc.bias': (2 * dim,)})
    return dict(t, **{'norm.weight': (256,), 'norm.bias': (256,), 'head.weight': (100, 256), 'head.bias': (100,)})


SWIN_RES, SWIN_DIMS, SWIN_HEADS, SWIN_DEPTHS = (32, 16, 8, 4), (96, 192, 384, 768), (3, 6, 12, 24), (2, 2, 6, 2)


def swin_ti_layout() -> Shapes:
    """timm 0.5's Swin: patch merging at the end of a stage, persistent index/mask buffers, ``head``."""
    t = {'patch_embed.proj.weight': (96, 3, 1, 1), 'patch_embed.proj.bias': (96,), 'patch_embed.norm.weight': (96,),
         'patch_embed.norm.bias': (96,)}
    for i, (res, dim, heads, depth) in enumerate(zip(SWIN_RES, SWIN_DIMS, SWIN_HEADS, SWIN_DEPTHS)):
        for j in range(depth):
            p = f'layers.{i}.blocks.{j}.'
            t.update(_block(p, dim, qkv_bias=False))
            t[p + 'attn.relative_position_bias_table'] = (49, heads)
            t[p + 'attn.relative_position_index'] = (16, 16)
            if j % 2 == 1 and res > 4:
                t[p + 'attn_mask'] = ((res // 4) ** 2, 16, 16)
        if i < 3:
            p = f'layers.{i}.downsample.'
            t.update({p + 'norm.weight': (4 * dim,), p + 'norm.bias': (4 * dim,),
                      p + 'reduction.weight': (2 * dim, 4 * dim)})
    return dict(t, **{'norm.weight': (768,), 'norm.bias': (768,), 'head.weight': (100, 768), 'head.bias': (100,)})


def _bn(p: str, dim: int) -> Shapes:
    return {p + 'weight': (dim,), p + 'bias': (dim,), p + 'running_mean': (dim,), p + 'running_var': (dim,),
            p + 'num_batches_tracked': ()}


def resnet50_layout() -> Shapes:
    """The official post-activation ResNet-50 with ``stem=False`` (models/resnet.py, resnet_dnn_block.py)."""
    t = {'layer0.0.weight': (64, 3, 3, 3), **_bn('layer0.1.', 64)}
    in_chs = 64
    for s, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for i in range(blocks):
            p = f'layer{s}.{i}.'
            if i == 0:
                t.update({p + 'shortcut.0.weight': (4 * width, in_chs, 1, 1), **_bn(p + 'shortcut.1.', 4 * width)})
            t.update({p + 'conv1.0.weight': (width, in_chs, 1, 1), **_bn(p + 'conv1.1.', width),
                      p + 'conv2.0.weight': (width, width, 3, 3), **_bn(p + 'conv2.1.', width),
                      p + 'conv3.0.weight': (4 * width, width, 1, 1), **_bn(p + 'conv3.1.', 4 * width)})
            in_chs = 4 * width
    return dict(t, **{'classifier.0.dense.weight': (100, 2048), 'classifier.0.dense.bias': (100,)})


def random_weights(layout: Shapes, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Values that keep activations in range and make every tensor matter (no zeros, no ones)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in layout.items():
        leaf = key.rsplit('.', 1)[-1]
        if leaf == 'num_batches_tracked':
            out[key] = torch.tensor(100)
        elif leaf in ('relative_position_index', 'attn_mask'):  # buffers the filter drops: their values are unused
            out[key] = torch.zeros(shape, dtype=torch.long if leaf.endswith('index') else torch.float32)
        elif leaf == 'running_var':
            out[key] = 0.5 + torch.rand(shape, generator=g)
        elif len(shape) == 1 and ('norm' in key or key.split('.')[-2].isdigit() or '.1.' in key) and leaf == 'weight':
            out[key] = 1.0 + 0.1 * torch.randn(shape, generator=g)  # LayerNorm / BatchNorm scales
        elif len(shape) >= 2 and leaf == 'weight':
            fan_in = math.prod(shape[1:])
            out[key] = torch.randn(shape, generator=g) / math.sqrt(fan_in)
        else:  # biases, running means, tokens, position embeddings, relative position biases
            out[key] = 0.1 * torch.randn(shape, generator=g)
    return out


# --- independent forward passes from the official state_dicts -----------------------------------------------

def _attention(x, sd, p, heads, bias=None):
    B, N, C = x.shape
    qkv = F.linear(x, sd[p + 'qkv.weight'], sd.get(p + 'qkv.bias')).reshape(B, N, 3, heads, C // heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    a = (q * (C // heads) ** -0.5) @ k.transpose(-2, -1)
    if bias is not None:
        a = a + bias
    out = (a.softmax(-1) @ v).transpose(1, 2).reshape(B, N, C)
    return F.linear(out, sd[p + 'proj.weight'], sd[p + 'proj.bias'])


def _ln(x, sd, p, eps=1e-6):
    return F.layer_norm(x, x.shape[-1:], sd[p + 'weight'], sd[p + 'bias'], eps)


def _mlp(x, sd, p):
    return F.linear(F.gelu(F.linear(x, sd[p + 'fc1.weight'], sd[p + 'fc1.bias'])), sd[p + 'fc2.weight'],
                    sd[p + 'fc2.bias'])


def _vit_block(x, sd, p, heads):
    x = x + _attention(_ln(x, sd, p + 'norm1.'), sd, p + 'attn.', heads)
    return x + _mlp(_ln(x, sd, p + 'norm2.'), sd, p + 'mlp.')


def vit_ti_reference(sd, img):
    x = F.conv2d(img, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=2).flatten(2).transpose(1, 2)
    x = torch.cat([sd['cls_token'].expand(len(img), -1, -1), x], 1) + sd['pos_embed']
    for i in range(12):
        x = _vit_block(x, sd, f'blocks.{i}.', 3)
    return F.linear(_ln(x, sd, 'norm.')[:, 0], sd['head.weight'], sd['head.bias'])


def pit_ti_reference(sd, img):
    x = F.conv2d(img, sd['patch_embed.conv.weight'], sd['patch_embed.conv.bias'], stride=1) + sd['pos_embed']
    cls = sd['cls_token'].expand(len(img), -1, -1)
    for s, (depth, heads) in enumerate(zip((2, 6, 4), (2, 4, 8))):
        B, C, H, W = x.shape
        tokens = torch.cat([cls, x.flatten(2).transpose(1, 2)], 1)
        for j in range(depth):
            tokens = _vit_block(tokens, sd, f'transformers.{s}.blocks.{j}.', heads)
        cls, x = tokens[:, :1], tokens[:, 1:].transpose(1, 2).reshape(B, C, H, W)
        if s < 2:  # the pool at the end of the stage
            p = f'transformers.{s}.pool.'
            x = F.conv2d(x, sd[p + 'conv.weight'], sd[p + 'conv.bias'], stride=2, padding=1, groups=C)
            cls = F.linear(cls, sd[p + 'fc.weight'], sd[p + 'fc.bias'])
    return F.linear(_ln(cls, sd, 'norm.')[:, 0], sd['head.weight'], sd['head.bias'])


def _windows(x, ws):
    """(B, H, W, C) -> (B * H/ws * W/ws, ws * ws, C), windows in row-major order."""
    B, H, W, C = x.shape
    return x.reshape(B, H // ws, ws, W // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)


def _unwindows(w, ws, B, H, W):
    return w.reshape(B, H // ws, W // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, -1)


def _relative_index(ws):
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
    return rel[..., 0] * (2 * ws - 1) + rel[..., 1]


def _shift_mask(res, ws, shift):
    """-100 between tokens of a window that come from different regions of the rolled image, else 0."""
    region = torch.zeros(1, res, res, 1)
    bounds = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    for n, (h, w) in enumerate((h, w) for h in bounds for w in bounds):
        region[:, h, w] = n
    labels = _windows(region, ws).squeeze(-1)
    return (labels[:, None, :] != labels[:, :, None]).float() * -100.0


def swin_ti_reference(sd, img):
    x = F.conv2d(img, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias']).flatten(2).transpose(1, 2)
    x = _ln(x, sd, 'patch_embed.norm.', eps=1e-5)
    B = len(img)
    for i, (res, dim, heads, depth) in enumerate(zip(SWIN_RES, SWIN_DIMS, SWIN_HEADS, SWIN_DEPTHS)):
        ws = min(4, res)
        for j in range(depth):
            p = f'layers.{i}.blocks.{j}.'
            shift = ws // 2 if j % 2 == 1 and res > ws else 0
            h = _ln(x, sd, p + 'norm1.', eps=1e-5).reshape(B, res, res, dim)
            if shift:
                h = torch.roll(h, (-shift, -shift), dims=(1, 2))
            table = sd[p + 'attn.relative_position_bias_table']
            bias = table[_relative_index(ws).flatten()].reshape(ws * ws, ws * ws, heads).permute(2, 0, 1)
            if shift:
                mask = _shift_mask(res, ws, shift)  # (nW, N, N), the same for every image
                bias = (bias[None] + mask[:, None]).repeat(B, 1, 1, 1)
            h = _unwindows(_attention(_windows(h, ws), sd, p + 'attn.', heads, bias), ws, B, res, res)
            if shift:
                h = torch.roll(h, (shift, shift), dims=(1, 2))
            x = x + h.reshape(B, res * res, dim)
            x = x + _mlp(_ln(x, sd, p + 'norm2.', eps=1e-5), sd, p + 'mlp.')
        if i < 3:  # patch merging at the end of the stage: 2x2 neighbours concatenated as x0, x1, x2, x3
            p = f'layers.{i}.downsample.'
            g = x.reshape(B, res, res, dim)
            g = torch.cat([g[:, 0::2, 0::2], g[:, 1::2, 0::2], g[:, 0::2, 1::2], g[:, 1::2, 1::2]], -1)
            x = F.linear(_ln(g.reshape(B, -1, 4 * dim), sd, p + 'norm.', eps=1e-5), sd[p + 'reduction.weight'])
    x = _ln(x, sd, 'norm.', eps=1e-5).mean(1)
    return F.linear(x, sd['head.weight'], sd['head.bias'])


def _conv_bn(x, sd, p, stride=1, padding=0):
    x = F.conv2d(x, sd[p + '0.weight'], stride=stride, padding=padding)
    return F.batch_norm(x, sd[p + '1.running_mean'], sd[p + '1.running_var'], sd[p + '1.weight'], sd[p + '1.bias'],
                        training=False, eps=1e-5)


def resnet50_reference(sd, img):
    x = F.relu(_conv_bn(img, sd, 'layer0.', padding=1))
    for s, blocks in enumerate((3, 4, 6, 3), start=1):
        for i in range(blocks):
            p, stride = f'layer{s}.{i}.', 2 if s > 1 and i == 0 else 1
            skip = _conv_bn(x, sd, p + 'shortcut.', stride=stride) if i == 0 else x
            h = F.relu(_conv_bn(x, sd, p + 'conv1.'))
            h = F.relu(_conv_bn(h, sd, p + 'conv2.', stride=stride, padding=1))
            x = F.relu(_conv_bn(h, sd, p + 'conv3.') + skip)
    return F.linear(x.mean((2, 3)), sd['classifier.0.dense.weight'], sd['classifier.0.dense.bias'])


CASES = {
    'vit_tiny_patch2_32': (vit_ti_layout, vit_ti_reference),
    'pit_ti_patch2_32': (pit_ti_layout, pit_ti_reference),
    'swin_tiny_patch1_window4_32': (swin_ti_layout, swin_ti_reference),
    'resnet50_cifar': (resnet50_layout, resnet50_reference),
}


@pytest.mark.slow  # full-size models: 5-10 s each on 2 busy cores
@pytest.mark.parametrize('name', list(CASES))
def test_released_checkpoint_loads_with_equal_outputs(name, tmp_path):
    layout, reference = CASES[name]
    official = random_weights(layout())
    # the official code's torch.save({'state_dict': ..., 'name': ...}), where timm's url loader finds a download
    torch.save({'state_dict': official, 'name': name}, tmp_path / FILES[name])
    model = timm.create_model(f'{name}.hdvw_cifar100', pretrained=True, cache_dir=tmp_path).eval()
    img = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(img), reference(official, img), rtol=1e-4, atol=1e-4)


@pytest.mark.timm_models_only
def test_registered_tags_point_at_the_release():
    for name, filename in FILES.items():
        cfg = get_pretrained_cfg(f'{name}.hdvw_cifar100')
        assert cfg.url == RELEASE + filename and cfg.hf_hub_id is None and cfg.num_classes == 100
        assert cfg.input_size == (3, 32, 32) and cfg.mean == (0.5071, 0.4867, 0.4408) and cfg.std == (0.2675, 0.2565,
                                                                                                         0.2761)
        assert cfg.crop_pct == 1.0 and cfg.interpolation == 'bilinear'  # the official test transform
        assert timm.create_model(name, device='meta').num_classes == 100  # the tag is the default


@pytest.mark.timm_models_only
def test_official_sizes():
    counts = {n: sum(p.numel() for p in timm.create_model(n, device='meta').parameters()) for n in FILES}
    assert counts['resnet50_cifar'] == 23_705_252  # the official dnn_50(num_classes=100, stem=False): 23.71M
    for name, (layout, _) in CASES.items():  # every learnable official tensor, and nothing else
        learnable = {k: s for k, s in layout().items()
                     if not k.endswith(('running_mean', 'running_var', 'num_batches_tracked', 'relative_position_index',
                                        'attn_mask'))}
        assert counts[name] == sum(math.prod(s) for s in learnable.values()), name


def test_pit_needs_the_pool_remap(tmp_path):
    """timm's own PiT filter knows the original ``pools.i`` layout but not timm 0.5's ``transformers.i.pool``."""
    from timm.models.pit import checkpoint_filter_fn

    model = timm.create_model('pit_ti_patch2_32')
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "transformers\.0\.pool'):
        model.load_state_dict(checkpoint_filter_fn(random_weights(pit_ti_layout()), model))


@pytest.mark.timm_models_only
def test_resnet50_cifar_features():
    model = timm.create_model('resnet50_cifar', features_only=True).eval()
    assert model.feature_info.reduction() == [1, 1, 2, 4, 8]
    with torch.no_grad():
        shapes = [tuple(f.shape[1:]) for f in model(torch.randn(1, 3, 32, 32))]
    assert shapes == [(64, 32, 32), (256, 32, 32), (512, 16, 16), (1024, 8, 8), (2048, 4, 4)]
