"""timm_ext.arg_types: a bad count or size gets the same one-line message everywhere."""
import math

import pytest
import torch

from timm_ext.arg_types import is_positive_int, positive_int, positive_number

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


@pytest.mark.parametrize('value, ok', [(1, True), (7, True), (0, False), (-2, False), (True, False), (2.0, False),
                                       ('3', False), (None, False)])
def test_is_positive_int(value, ok):
    assert is_positive_int(value) is ok


def test_positive_int_returns_the_value_or_names_it():
    assert positive_int('k', 3) == 3
    with pytest.raises(ValueError, match=r"^--batches must be a positive integer, got 0$"):
        positive_int('--batches', 0)
    with pytest.raises(ValueError, match=r"^head_dim must be a positive integer, got 32\.0$"):
        positive_int('head_dim', 32.0)


@pytest.mark.parametrize('value', [0.5, 2, torch.tensor(0.1)])
def test_positive_number_accepts(value):
    assert positive_number('span', value) is value


@pytest.mark.parametrize('value, shown', [(0, '0'), (-1.0, '-1.0'), (math.nan, 'nan'), ('1', "'1'"), (None, 'None')])
def test_positive_number_refuses(value, shown):
    with pytest.raises(ValueError, match=rf"^sigma must be > 0, got {shown}$"):
        positive_number('sigma', value)
