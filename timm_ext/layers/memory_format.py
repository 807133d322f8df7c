"""Which memory format a 4-D tensor is in, so layers can keep (or route on) their input's format."""
import torch

__all__ = ['contiguous_like', 'is_channels_last']


def is_channels_last(x: torch.Tensor) -> bool:
    """Channels-last strides and not also plain contiguous (a 1x1 map or one channel is both: counts as NCHW)."""
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def contiguous_like(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` in ``like``'s memory format (channels-last when ``like`` is, else contiguous); no copy if it is."""
    return x.contiguous(memory_format=torch.channels_last if is_channels_last(like) else torch.contiguous_format)
