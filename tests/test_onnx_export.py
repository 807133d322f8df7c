"""ONNX export with torch's default exporter (``torch.onnx.export(model, (x,), path)``, no ``dynamo=`` argument:
the dynamo-based exporter from torch 2.9, TorchScript's before) for one small model of every family timm-ext
registers; the exported graph is checked with ``onnx.checker`` and, where onnxruntime is installed, its outputs
are compared with eager PyTorch. Models are shrunk (fewer blocks, small inputs, 3 classes) so each case takes
seconds on 2 CPU cores. Skipped without onnx / onnxscript (the dynamo exporter needs both: ``pip install
"timm-ext[test]"``).
"""
import importlib.util

import pytest
import timm
import torch
from timm.models import model_entrypoint

import timm_ext  # noqa: F401
from timm_ext.layers.window_attention import windows_to_raster_rows

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

ALTERNET_SMALL = dict(channels=(16, 32, 64, 128), num_heads=(1, 1, 2, 2), head_dim=8)
# (family = the timm_ext.models module that registers it, model, input side, create_model kwargs)
CASES = [
    # one 4x4 window per image in the last stage: the map the default exporter failed on before the fix
    ('alternet', 'alternet_18_cifar', 32, ALTERNET_SMALL),
    ('alternet', 'alternet_18', 64, ALTERNET_SMALL),  # windows of 7 on 16/8/4/2 maps: padded and masked
    ('vision_transformer_cb', 'vit_tiny_cb', 32, dict(img_size=32, depth=4)),  # CB in the upper 2 blocks
    ('vision_transformer_convstem', 'vit_tiny_convstem', 32, dict(img_size=32, depth=2)),
    ('mlp_mixer_cb', 'mixer_s16_cb', 32, dict(img_size=32, num_blocks=2)),
    ('pit_cb', 'pit_b_cb', 56, dict(img_size=56, depth=[1, 1, 1])),
    ('volo_convstem', 'volo_d1_convstem', 64, dict(img_size=64, layers=(1, 1, 1, 1))),
    ('mlp_mixer_p8', 'mixer_s8_224', 32, dict(img_size=32, num_blocks=2)),
    ('hdvw_baselines', 'vit_tiny_patch2_32', 32, dict(depth=2)),
]


@pytest.fixture
def onnx():
    onnx = pytest.importorskip('onnx', reason='torch.onnx.export needs onnx (pip install "timm-ext[test]")')
    pytest.importorskip('onnxscript', reason='torch.onnx.export needs onnxscript (pip install "timm-ext[test]")')
    return onnx


def test_cases_cover_every_registered_family():
    families = {model_entrypoint(n).__module__.rsplit('.', 1)[-1] for n in timm.list_models()
                if model_entrypoint(n).__module__.startswith('timm_ext.')}
    assert {family for family, *_ in CASES} == families


@pytest.mark.parametrize('family, name, size, kwargs', CASES, ids=[f'{c[1]}-{c[2]}' for c in CASES])
def test_default_exporter(onnx, tmp_path, family, name, size, kwargs):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=3, **kwargs).eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        expected = model(x)
    path = str(tmp_path / f'{name}.onnx')
    torch.onnx.export(model, (x,), path)
    onnx.checker.check_model(path, full_check=True)
    if importlib.util.find_spec('onnxruntime') is None:
        return  # the graph is valid ONNX; its numbers need onnxruntime
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    # measured max |diff| <= 1.2e-6 (fp32 logits of size ~0.1 to 1)
    torch.testing.assert_close(torch.from_numpy(out), expected, rtol=1e-4, atol=1e-5)


def test_raster_rows_are_a_copy_whatever_the_attention_output_strides():
    """The attention output goes to raster rows by one copy, never a view: SDPA's CPU kernel hands it back
    token-major, its math path head-major, and torch.onnx traces SDPA with either in different passes; a view that
    only one layout allows broke the default exporter on maps of one window."""
    B, heads, d, ws = 2, 3, 4, 4
    head_major = torch.randn(B, heads, ws * ws, d)  # (B * nW, heads, N, d), one window per image
    token_major = head_major.transpose(1, 2).contiguous().transpose(1, 2)
    like = torch.empty(B, 1, ws, ws)
    expected = torch.stack([head_major[:, h] for h in range(heads)], dim=2).flatten(2).flatten(0, 1)
    for out in (head_major, token_major):
        rows = windows_to_raster_rows(out.transpose(1, 2), like, ws)
        assert torch.equal(rows, expected) and rows.is_contiguous()
        assert rows.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
