"""``timm_ext.analysis.runner``: options reach the library functions under their own names and defaults."""
import inspect
import json

import pytest
import torch
import torch.nn as nn

from timm_ext.analysis import hessian_spectrum_density, hessian_trace, loss_landscape_1d, loss_landscape_2d, noisy_loss
from timm_ext.analysis.runner import metric_options, option_default, progress_total, run_metric

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def test_defaults_are_the_library_functions_own():
    assert option_default('trace', 'samples') == _default(hessian_trace, 'samples')
    assert option_default('noise', 'samples') == _default(noisy_loss, 'samples')
    assert option_default('density', 'runs') == _default(hessian_spectrum_density, 'runs')
    assert option_default('landscape', 'steps') == _default(loss_landscape_1d, 'steps')
    assert progress_total('landscape', 3) == _default(loss_landscape_1d, 'steps')
    assert progress_total('landscape2d', 3) == _default(loss_landscape_2d, 'steps') ** 2
    assert progress_total('landscape2d', 3, dict(steps=3, k=9)) == 9
    with pytest.raises(ValueError, match="^density takes no option 'samples'$"):
        option_default('density', 'samples')


def test_each_metric_gets_only_the_options_its_function_takes():
    given = dict(k=3, samples=7, runs=2, steps=5, sigma=0.1, seed=1)
    assert metric_options('trace', given) == dict(samples=7, seed=1)
    assert metric_options('noise', given | dict(runs=None)) == dict(samples=7, sigma=0.1, seed=1)
    assert metric_options('attention', given) == {}
    with pytest.raises(ValueError, match=r'^density counts Lanczos runs with runs= \(--runs\), not samples=$'):
        metric_options('density', dict(samples=2))
    with pytest.raises(ValueError, match="^unknown analysis option 'draws': choose from k, max_iter, "):
        metric_options('noise', dict(draws=2))


def test_density_runs_option_sets_the_lanczos_runs(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    batches = [(torch.randn(6, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2]))]
    result = run_metric('density', model, batches, tmp_path, dict(runs=3, iterations=4), plot=False)
    weights = json.loads(result.json.read_text())['weights']
    assert len(weights) == 3 * 4 and sum(weights) == pytest.approx(1.0)
