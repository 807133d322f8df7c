"""Analysis on CUDA (marker `cuda`): Hessian top-k on the device equals the CPU result in float64, and the
second-order layers pass gradcheck / gradgradcheck on the device. ``TIMM_EXT_CUDA_TESTS_ON=cpu`` runs the bodies on
the CPU (where the device-vs-CPU comparison compares the CPU with itself)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from test_analysis_hessian import by_magnitude, data, exact_hessian, tiny_mlp

from timm_ext.analysis._second_order import batch_norm_eval, conv2d, gelu, layer_norm
from timm_ext.analysis.hessian import hessian_top_eigenvalues

pytestmark = pytest.mark.cuda


def test_hessian_top_eigenvalues_on_the_device_equal_the_cpu_in_float64(device):
    model, (x, y) = tiny_mlp(), data()
    cpu = hessian_top_eigenvalues(model, F.cross_entropy, (x, y), k=4, tol=1e-10, max_iter=2000)
    on_device = hessian_top_eigenvalues(copy.deepcopy(model).to(device), F.cross_entropy, (x.to(device), y.to(device)),
                                        k=4, tol=1e-10, max_iter=2000)
    assert on_device == pytest.approx(cpu, rel=1e-6, abs=1e-8)
    assert on_device == pytest.approx(by_magnitude(torch.linalg.eigvalsh(exact_hessian(model, x, y)), 4),
                                      rel=1e-6, abs=1e-8)


def _leaf(device, *shape, scale=1.0, shift=0.0):
    return (shift + scale * torch.randn(*shape, dtype=torch.float64)).to(device).requires_grad_()


def _cases(device):
    torch.manual_seed(0)
    x4 = _leaf(device, 2, 4, 6, 6)
    mean, var = torch.randn(4, dtype=torch.float64).to(device), (torch.rand(4, dtype=torch.float64) + 0.5).to(device)
    return {
        'gelu': (gelu, (_leaf(device, 4, 6, scale=2.0),)),
        'layer_norm': (lambda x, w, b: layer_norm(x, [6], w, b, 1e-5),
                       (_leaf(device, 2, 3, 6, scale=1.5, shift=0.3), _leaf(device, 6, scale=0.3, shift=1.0),
                        _leaf(device, 6, scale=0.1))),
        'conv2d': (lambda x, w, b: conv2d(x, w, b, 2, 1, 1, 2),
                   (x4, _leaf(device, 6, 2, 3, 3), _leaf(device, 6))),
        'batch_norm_eval': (lambda x, w, b: batch_norm_eval(x, mean, var, w, b, 1e-3),
                            (x4, _leaf(device, 4, shift=1.0), _leaf(device, 4))),
    }


@pytest.mark.parametrize('layer', ['gelu', 'layer_norm', 'conv2d', 'batch_norm_eval'])
def test_second_order_layers_pass_gradgradcheck_on_the_device(device, layer):
    fn, inputs = _cases(device)[layer]
    assert all(t.device.type == device.type for t in inputs)
    assert torch.autograd.gradcheck(fn, inputs) and torch.autograd.gradgradcheck(fn, inputs)
