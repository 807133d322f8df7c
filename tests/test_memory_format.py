import pytest
import torch

from timm_ext.layers.memory_format import contiguous_like, is_channels_last

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def test_channels_last_is_told_from_nchw():
    x = torch.zeros(2, 3, 4, 5)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert not is_channels_last(x) and is_channels_last(cl)
    assert is_channels_last(contiguous_like(x, cl)) and contiguous_like(cl, x).is_contiguous()
    assert contiguous_like(cl, cl) is cl  # already in the format: no copy


def test_a_tensor_that_is_both_counts_as_nchw():
    one_pixel = torch.zeros(2, 3, 1, 1).contiguous(memory_format=torch.channels_last)
    assert one_pixel.is_contiguous() and not is_channels_last(one_pixel)
