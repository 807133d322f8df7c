"""Every registered model on CUDA (marker `cuda`): forward + backward finite under bf16 and fp16 autocast,
channels-last equal to NCHW, torch.compile (inductor) equal to eager for one model of each family, AlterNet on
CUDA equal to the CPU model in float64, window attention's fused SDPA kernels equal to the math path.
``TIMM_EXT_CUDA_TESTS_ON=cpu`` runs the bodies on the CPU where the feature exists there."""
import pytest
import timm
import torch
from _cuda import no_tf32, only_on_cuda
from test_models import TIMM_EXT_MODELS, create_small
from timm.models import model_entrypoint

from timm_ext.layers.window_attention import WindowAttention2d

pytestmark = pytest.mark.cuda

# one model of each family (the smallest), for the checks that cost a compile
ONE_PER_FAMILY = ['alternet_18_cifar', 'mixer_s8_224', 'mixer_s16_cb', 'pit_b_cb', 'resnet50_cifar', 'vit_tiny_cb',
                  'vit_tiny_convstem', 'volo_d1_convstem']
# channels-last vs NCHW in float32 without TF32: different kernels, the same sums in another order
CHANNELS_LAST_TOL = dict(rtol=1e-4, atol=1e-4)


def test_one_per_family_covers_every_family():
    family = {n: model_entrypoint(n).__module__ for n in TIMM_EXT_MODELS}
    assert sorted(family[n] for n in ONE_PER_FAMILY) == sorted(set(family.values()))


def _small(name, device):
    torch.manual_seed(0)
    model, shape = create_small(name)
    return model.to(device), torch.randn(2, *shape, device=device)


def _skip_on_cpu_unless_one_per_family(name, device):
    if device.type == 'cpu' and (name not in ONE_PER_FAMILY or name == 'pit_b_cb'):  # pit_b: ~40 s on 2 cores
        pytest.skip(f'{name}: on CUDA only; the CPU run of these bodies checks one model per family but PiT-B')


@pytest.mark.parametrize('name', TIMM_EXT_MODELS)
def test_autocast_forward_backward_is_finite_and_channels_last_equals_nchw(device, name):
    _skip_on_cpu_unless_one_per_family(name, device)
    model, x = _small(name, device)
    model.train()
    for dtype in (torch.bfloat16, torch.float16):
        model.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            out = model(x)
        assert out.dtype == dtype and torch.isfinite(out).all(), (dtype, out)
        out.float().logsumexp(-1).mean().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), dtype
    model.eval()
    with torch.no_grad(), no_tf32():
        nchw = model(x)
        channels_last = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    scale = nchw.abs().max().item()
    torch.testing.assert_close(channels_last, nchw, rtol=CHANNELS_LAST_TOL['rtol'],
                               atol=CHANNELS_LAST_TOL['atol'] * max(1.0, scale))


@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_torch_compile_inductor_equals_eager(device, name):
    only_on_cuda(device, 'torch.compile (inductor) in this set')
    model, x = _small(name, device)
    model.eval()
    with torch.no_grad(), no_tf32():
        compiled = torch.compile(model, backend='inductor')
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def _tiny_alternet():
    torch.manual_seed(0)
    return timm.create_model(
        'alternet_50_cifar', layers=(1, 2, 2, 2), msa_blocks=(0, 1, 1, 1), channels=(16, 32, 64, 64),
        num_heads=(1, 1, 1, 1), head_dim=8, stem_chs=8, num_classes=3, drop_path_rate=0.0).double()


@pytest.mark.parametrize('training', [False, True], ids=['eval', 'train'])
def test_alternet_on_the_device_equals_the_cpu_model_in_float64(device, training):
    """On the CPU (TIMM_EXT_CUDA_TESTS_ON=cpu) this compares the CPU with itself: only the body is checked."""
    cpu = _tiny_alternet().train(training)
    dev = _tiny_alternet().to(device).train(training)
    x = torch.randn(2, 3, 20, 20, dtype=torch.float64)  # 20: windows that do not divide the maps (padding)
    expected = cpu(x)
    out = dev(x.to(device))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-10, atol=1e-10)
    expected.logsumexp(-1).sum().backward()
    out.logsumexp(-1).sum().backward()
    for (n, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-9, atol=1e-10, msg=n)
    if training:
        for (n, b), c in zip(cpu.named_buffers(), dev.buffers()):
            torch.testing.assert_close(c.cpu(), b, rtol=1e-10, atol=1e-10, msg=n)


def _window_layer(device, dtype):
    torch.manual_seed(0)
    layer = WindowAttention2d(16, 16, num_heads=2, head_dim=16, window_size=4).eval()
    with torch.no_grad():
        layer.relative_position_bias_table.normal_(0, 1.0)  # large enough to matter in the comparison
    return layer.to(device, dtype)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=['fp32', 'fp16'])
@pytest.mark.parametrize('size', [(8, 12), (7, 5)], ids=['divisible', 'padded'])
def test_window_attention_memory_efficient_sdpa_equals_the_math_path(device, dtype, size):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    only_on_cuda(device, 'the memory-efficient SDPA kernel')
    layer = _window_layer(device, dtype)
    x = torch.randn(2, 16, *size, device=device, dtype=dtype)
    with torch.no_grad(), no_tf32():
        with sdpa_kernel([SDPBackend.MATH]):
            expected = layer(x)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            out = layer(x)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-3)
    torch.testing.assert_close(out, expected, **tol)

