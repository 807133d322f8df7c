"""reproduction/run_metrics.py: the per-run quantities the claims, the tables and the why-paragraphs share."""
import math

import pytest
from _reproduction import run_metrics

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def test_cb_layers_and_the_early_epoch():
    r = {'vit': [dict(entropy=[2.0, 1.8, 1.5, 1.4])], 'vit_cb': [dict(cb_layers=[2, 3])]}
    assert run_metrics.deep_layers(r) == [2, 3]  # where CB sits: the CB paper reads its entropy there
    assert run_metrics.deep_layers({'vit': r['vit']}) == [3]  # no CB run: the last layer
    assert [run_metrics.early_epoch(dict(top1_curve=[0.0] * n)) for n in (4, 60, 240)] == [1, 6, 24]


def test_metrics_read_each_quantity_by_name():
    m = dict(top1=91.0, top1_curve=[10.0] * 5 + [50.0] * 5, lambda_max=math.e, entropy=[1.0, 2.0, 4.0],
             kinds={'b1': 'conv', 'b2': 'msa', 'b3': 'msa'}, variance_ratio={'b2': math.e, 'b3': 1.0},
             fourier_at_pi={'b1': -1.0, 'b2': -0.5, 'b3': -0.9})
    r = {'vit': [dict(entropy=m['entropy'])], 'vit_cb': [dict(cb_layers=[1, 2])]}
    assert run_metrics.metric_fn('top1_early', r)(m) == 10.0  # epoch 1 of 10
    assert run_metrics.metric_fn('log_lambda_max', r)(m) == pytest.approx(1.0)
    assert run_metrics.metric_fn('entropy_all_deep', r)(m) == pytest.approx(3.0)
    assert run_metrics.metric_fn('msa_log_variance_ratio', r)(m) == pytest.approx(0.5)  # MSA blocks only
    assert run_metrics.metric_fn('msa_delta_pi', r)(m) == pytest.approx((0.5 - 0.4) / 2)
