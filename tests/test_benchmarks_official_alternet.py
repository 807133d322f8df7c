"""benchmarks/official_alternet.py: the output check that comes before timing ours against the official code."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'benchmarks'))  # scripts beside the package
import official_alternet  # noqa: E402

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def _net():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten())


def test_norms_are_randomized_and_equal_weights_give_the_same_outputs():
    a, b = _net(), _net()
    official_alternet.randomize_norms(a)
    bn = a[1]
    assert not torch.equal(bn.running_var, torch.ones(4)) and not torch.equal(bn.weight, torch.ones(4))
    b.load_state_dict(a.state_dict())
    assert official_alternet.check_same_outputs(a, b, torch.randn(2, 3, 5, 5)) == 0.0
    official_alternet.randomize_norms(b, seed=1)
    with pytest.raises(AssertionError):
        official_alternet.check_same_outputs(a, b, torch.randn(2, 3, 5, 5))


def test_a_folder_without_the_official_code_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match='no models/alternet.py there'):
        official_alternet.official_model(tmp_path, imagenet=False)
