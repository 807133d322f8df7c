"""Official AlterNet state_dict -> timm-ext, on official-layout state dicts generated here.

The official key/shape listing of the official code's ``dnn_50`` (MSA blocks (0, 1, 3, 2), models/alternet.py
with its pre-activation Bottleneck and AttentionBlockB) is written out below from that architecture for
CIFAR-100 (3x3 stem, window 4) and ImageNet (7x7 stem, window 7); its parameter counts equal the official
code's (research note: 34,062,538 and 35,915,038). Tensors are random; the converted model is checked against
an independent functional forward of the official architecture, so key mapping, q/kv split, head layout and
the relative-position orientation are all checked on numbers.
"""
import functools
import math
from typing import Dict, List, Tuple

import pytest
import timm
import torch
import torch.nn.functional as F

from timm_ext.models.alternet import checkpoint_filter_fn
from timm_ext.models.alternet_convert import convert_official_alternet, is_official_alternet_state_dict

# kind -> (our model name, its kwargs, official stem kernel, window, classes)
KINDS = {
    'cifar': ('alternet_50_cifar', dict(msa_blocks=(0, 1, 3, 2)), 3, 4, 100),
    'imagenet': ('alternet_50', {}, 7, 7, 1000),
}
_BN = ('weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked')


def _bn_keys(prefix: str, chs: int) -> List[Tuple[str, Tuple[int, ...]]]:
    return [(f'{prefix}.{n}', () if n == 'num_batches_tracked' else (chs,)) for n in _BN]


def _official_listing(kind: str) -> List[Tuple[str, Tuple[int, ...]]]:
    """(key, shape) of the official dnn_50 state_dict, in its order (layers (3, 4, 6, 4), MSA (0, 1, 3, 2))."""
    _, _, stem_k, ws, classes = KINDS[kind]
    rows = [('layer0.layer0.0.weight', (64, 3, stem_k, stem_k))]
    c_in = 64
    for s, (n, m, heads) in enumerate(zip((3, 4, 6, 4), (0, 1, 3, 2), (3, 6, 12, 24)), start=1):
        w, c = 64 << (s - 1), 256 << (s - 1)  # bottleneck width, block output
        alt = [False] * (n - 2 * m) + [False, True] * m  # official _make_layer
        for i, is_msa in enumerate(alt):
            p = f'layer{s}.{i}'
            if is_msa:  # AttentionBlockB: norm1, conv (C -> C/4), norm2, LocalAttention(Attention2d)
                inner = heads * 64
                rows += _bn_keys(f'{p}.norm1', c) + [(f'{p}.conv.weight', (w, c, 1, 1))] + _bn_keys(f'{p}.norm2', w)
                rows += [(f'{p}.attn.pos_embedding', (2 * ws - 1, 2 * ws - 1)),
                         (f'{p}.attn.attn.to_q.weight', (inner, w, 1, 1)),
                         (f'{p}.attn.attn.to_kv.weight', (2 * inner, w, 1, 1)),
                         (f'{p}.attn.attn.to_out.0.weight', (c, inner, 1, 1)),
                         (f'{p}.attn.attn.to_out.0.bias', (c,))]
            else:  # pre-activation Bottleneck: shortcut only where the shape changes
                cin = c_in if i == 0 else c
                if i == 0:
                    rows.append((f'{p}.shortcut.0.weight', (c, cin, 1, 1)))
                rows += _bn_keys(f'{p}.bn', cin) + [(f'{p}.conv1.weight', (w, cin, 1, 1))]
                rows += _bn_keys(f'{p}.conv2.0', w) + [(f'{p}.conv2.2.weight', (w, w, 3, 3))]
                rows += _bn_keys(f'{p}.conv3.0', w) + [(f'{p}.conv3.2.weight', (c, w, 1, 1))]
        c_in = c
    rows += _bn_keys('classifier.0.bn', c_in)
    return rows + [('classifier.0.dense.weight', (classes, c_in)), ('classifier.0.dense.bias', (classes,))]


@pytest.mark.parametrize('kind, params', [('cifar', 34_062_538), ('imagenet', 35_915_038)])
def test_official_listing_has_the_official_parameter_count(kind, params):
    rows = _official_listing(kind)
    counted = [shape for key, shape in rows if not key.endswith(('running_mean', 'running_var', 'batches_tracked'))]
    assert sum(math.prod(shape) for shape in counted) == params
    assert len(rows) == len({key for key, _ in rows}) == 306


def _random_official(kind: str) -> Dict[str, torch.Tensor]:
    """A fresh dict (tests may add or replace entries) of cached random tensors."""
    return dict(_cached_random_official(kind))


@functools.lru_cache(maxsize=None)
def _cached_random_official(kind: str) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    sd = {}
    for key, shape in _official_listing(kind):
        if key.endswith('num_batches_tracked'):
            sd[key] = torch.tensor(7)
        elif key.endswith('running_var'):
            sd[key] = torch.rand(shape, generator=gen, dtype=torch.float32) + 0.5
        elif len(shape) >= 2 and not key.endswith('pos_embedding'):
            fan_in = math.prod(shape[1:])
            sd[key] = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
        elif key.endswith('bn.weight') or key.endswith('0.weight') or 'norm' in key and key.endswith('weight'):
            sd[key] = 1 + 0.1 * torch.randn(shape, generator=gen)
        else:  # biases, running means, pos_embedding
            sd[key] = 0.5 * torch.randn(shape, generator=gen)
    return sd


def _bn(x, sd, p):
    return F.batch_norm(x, sd[f'{p}.running_mean'], sd[f'{p}.running_var'], sd[f'{p}.weight'], sd[f'{p}.bias'],
                        training=False, eps=1e-5)


def _conv(x, w, stride=1, bias=None):
    return F.conv2d(x, w, bias, stride=stride, padding=w.shape[-1] // 2)


def _official_local_attention(t, sd, p, ws):
    """models/alternet.py LocalAttention + models/attentions.py Attention2d, per the research note."""
    B, C, H, W = t.shape
    table = sd[f'{p}.attn.pos_embedding']
    n = ws * ws
    bias = torch.empty(n, n, dtype=t.dtype)
    for q in range(n):
        for k in range(n):
            (rq, cq), (rk, ck) = divmod(q, ws), divmod(k, ws)
            bias[q, k] = table[rk - rq + ws - 1, ck - cq + ws - 1]  # key minus query
    win = t.reshape(B, C, H // ws, ws, W // ws, ws).permute(0, 2, 4, 1, 3, 5).reshape(-1, C, ws, ws)
    to_q, to_kv = sd[f'{p}.attn.attn.to_q.weight'], sd[f'{p}.attn.attn.to_kv.weight']
    heads, d = to_q.shape[0] // 64, 64

    def split_heads(z):  # 'b (h d) x y -> b h (x y) d'
        return z.reshape(z.shape[0], heads, d, n).transpose(-1, -2)

    q = split_heads(_conv(win, to_q))
    k, v = (split_heads(z) for z in _conv(win, to_kv).chunk(2, dim=1))
    out = torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5 + bias, dim=-1) @ v
    out = out.transpose(-1, -2).reshape(-1, heads * d, ws, ws)
    out = _conv(out, sd[f'{p}.attn.attn.to_out.0.weight'], bias=sd[f'{p}.attn.attn.to_out.0.bias'])
    c_out = out.shape[1]
    return out.reshape(B, H // ws, W // ws, c_out, ws, ws).permute(0, 3, 1, 4, 2, 5).reshape(B, c_out, H, W)


def _official_forward(sd, x, imagenet: bool, ws: int):
    x = _conv(x, sd['layer0.layer0.0.weight'], stride=2 if imagenet else 1)
    if imagenet:
        x = F.max_pool2d(x, 3, 2, 1)
    for s in range(1, 5):
        i = 0
        while f'layer{s}.{i}.conv1.weight' in sd or f'layer{s}.{i}.conv.weight' in sd:
            p = f'layer{s}.{i}'
            if f'{p}.conv.weight' in sd:  # AttentionBlockB
                t = _bn(_conv(F.gelu(_bn(x, sd, f'{p}.norm1')), sd[f'{p}.conv.weight']), sd, f'{p}.norm2')
                x = x + _official_local_attention(t, sd, p, ws)
            else:  # pre-activation Bottleneck
                stride = 2 if i == 0 and s > 1 else 1
                a = F.relu(_bn(x, sd, f'{p}.bn'))
                skip = _conv(a, sd[f'{p}.shortcut.0.weight'], stride) if f'{p}.shortcut.0.weight' in sd else x
                y = _conv(a, sd[f'{p}.conv1.weight'])
                y = _conv(F.relu(_bn(y, sd, f'{p}.conv2.0')), sd[f'{p}.conv2.2.weight'], stride)
                y = _conv(F.relu(_bn(y, sd, f'{p}.conv3.0')), sd[f'{p}.conv3.2.weight'])
                x = y + skip
            i += 1
    x = F.relu(_bn(x, sd, 'classifier.0.bn')).mean((2, 3))
    return F.linear(x, sd['classifier.0.dense.weight'], sd['classifier.0.dense.bias'])


def _model(kind: str):
    name, kwargs = KINDS[kind][:2]
    return timm.create_model(name, **kwargs).eval()


@pytest.mark.timm_models_only
@pytest.mark.parametrize('kind', ['cifar', 'imagenet'])
def test_every_official_key_converts_and_loads_strictly(kind):
    official = _random_official(kind)
    model = _model(kind)
    converted = convert_official_alternet(official, model)
    assert model.load_state_dict(converted, strict=True)
    assert len(converted) == len(model.state_dict()) == len(official) - sum('to_kv' in k for k in official)
    # spot checks of the renames
    torch.testing.assert_close(model.stem.conv.weight, official['layer0.layer0.0.weight'])
    torch.testing.assert_close(model.head.fc.bias, official['classifier.0.dense.bias'])
    torch.testing.assert_close(model.stages[1].blocks[0].downsample.conv.weight, official['layer2.0.shortcut.0.weight'])


def _assert_converted_forward_matches(kind: str, shape: tuple, ws: int) -> None:
    """A random official checkpoint, converted: the timm-ext model's forward equals the official one's."""
    official = _random_official(kind)
    model = _model(kind)
    model.load_state_dict(convert_official_alternet(official, model))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = _official_forward(official, x, imagenet=kind == 'imagenet', ws=ws)
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.timm_models_only
def test_converted_model_matches_the_official_forward_cifar():
    _assert_converted_forward_matches('cifar', (2, 3, 32, 32), ws=4)


@pytest.mark.slow
def test_converted_model_matches_the_official_forward_imagenet():
    _assert_converted_forward_matches('imagenet', (1, 3, 224, 224), ws=7)


def test_official_checkpoint_file_loads_through_create_model(tmp_path):
    """An official ``{'name', 'state_dict'}`` .pth.tar with a DataParallel prefix, via pretrained_cfg_overlay."""
    official = {f'module.{k}': v for k, v in _random_official('cifar').items()}
    path = tmp_path / 'cifar100_alternet_50_abc.pth.tar'
    torch.save({'name': 'alternet_50', 'state_dict': official}, path)
    model = timm.create_model('alternet_50_cifar', msa_blocks=(0, 1, 3, 2), pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(path)))
    torch.testing.assert_close(
        model.stages[3].blocks[3].attn.proj.weight, official['module.layer4.3.attn.attn.to_out.0.weight'][:, :, 0, 0])


def test_filter_passes_our_own_layout_through():
    model = timm.create_model('alternet_18_cifar', num_classes=10)
    sd = model.state_dict()
    assert not is_official_alternet_state_dict(sd)
    assert checkpoint_filter_fn(sd, model) is sd


def test_mismatches_are_listed_in_one_error():
    official = _random_official('cifar')
    del official['layer1.0.conv1.weight']
    official['layer9.0.extra.weight'] = torch.zeros(3)
    official['classifier.0.dense.weight'] = torch.zeros(10, 2048)
    model = _model('cifar')
    with pytest.raises(ValueError, match='Official AlterNet state_dict does not match AlterNet') as info:
        convert_official_alternet(official, model)
    message = str(info.value)
    assert 'layer9.0.extra.weight' in message  # converted key the model lacks
    assert 'stages.0.blocks.0.conv1.weight' in message  # not filled
    assert 'classifier.0.dense.weight (10, 2048) -> head.fc.weight: converted (10, 2048), model expects (100, 2048)' \
        in message


def test_wrong_msa_layout_is_reported():
    """The official (0, 1, 3, 2) checkpoint into the paper's (0, 1, 1, 2) model: block types differ."""
    official = _random_official('cifar')
    model = timm.create_model('alternet_50_cifar')
    with pytest.raises(ValueError, match=r'layer3\.1\.attn\.pos_embedding -> '
                                         r'stages\.2\.blocks\.1\.attn\.relative_position_bias_table'):
        convert_official_alternet(official, model)


@pytest.mark.timm_models_only
def test_kv_downsampling_checkpoint_is_rejected():
    """Attention2d(k=2) has a strided 2x2 to_kv; our attention has no KV reduction."""
    official = _random_official('cifar')
    official['layer2.3.attn.attn.to_kv.weight'] = torch.zeros(768, 128, 2, 2)
    with pytest.raises(ValueError, match=r'expected 1x1 convs \(k=1, no KV downsampling\)'):
        convert_official_alternet(official, _model('cifar'))


def test_unknown_official_key_is_reported():
    official = _random_official('cifar')
    official['layer1.0.mystery.weight'] = torch.zeros(1)
    with pytest.raises(ValueError, match=r'official keys with no counterpart in our layout \(1\):\n'
                                         r'    layer1\.0\.mystery\.weight \(1,\)'):
        convert_official_alternet(official, _model('cifar'))
