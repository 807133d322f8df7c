"""``timm.create_model`` for ``hf-hub:`` / ``local-dir:`` names, with one-line errors that name the file and the fix.

timm's own failures here are a hub exception with a multi-line message, ``RuntimeError: Unknown model``
without the config file it came from, or a ``load_state_dict`` report of every mismatched tensor. Each is
recognised by its exception type, where it was raised, or a check of config.json, never by its wording.
"""
from typing import Any

import timm
import torch.nn as nn

from timm_ext.load_errors import HubError, explain_load_error

__all__ = ['load_model']


def load_model(model_name: str, pretrained: bool = True, **kwargs: Any) -> nn.Module:
    """``timm.create_model(model_name, pretrained=pretrained, **kwargs)`` with timm-ext registered; failures to
    find, read or fit a hub checkpoint become one HubError naming the file and the fix."""
    try:
        return timm.create_model(model_name, pretrained=pretrained, **kwargs)
    except Exception as e:
        message = explain_load_error(model_name, kwargs.get('cache_dir'), e, pretrained)
        if message is None:
            raise
        raise HubError(message) from e
