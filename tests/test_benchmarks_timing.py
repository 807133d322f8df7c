"""benchmarks/timing.py, the helpers every speed benchmark shares: each step does what its name says, medians."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'benchmarks'))  # scripts beside the package
import timing  # noqa: E402

from timm_ext.machine import cpu_name  # noqa: E402

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))


def test_steps_train_backpropagate_and_infer_without_a_graph():
    x, y = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    timing.train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y)()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the optimizer stepped
    model = _model()
    timing.forward_backward(model, x, y)()
    grads = [p.grad.clone() for p in model.parameters()]
    assert all(g.abs().sum() > 0 for g in grads)
    timing.forward_backward(model, x, y)()  # gradients are reset, not accumulated
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    seen = []
    model.register_forward_hook(lambda m, i, out: seen.append(torch.is_inference(out)))
    timing.inference_step(model, x)()
    assert seen == [True]  # under torch.inference_mode: no autograd graph


def test_interleaved_medians_run_each_fn_in_turn_and_name_the_cpu():
    calls = []
    times = timing.interleaved_median_seconds({'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')},
                                              torch.device('cpu'), warmup=1, reps=3)
    assert calls == ['a', 'b'] * 4 and set(times) == {'a', 'b'} and all(t >= 0 for t in times.values())
    assert timing.device_name(torch.device('cpu')) == cpu_name() != ''
