"""Weight files written with the mode every other file of the user gets: ``0o666`` less the umask.

``safetensors.torch.save_file`` writes a private temporary file and renames it, so the result is ``0600``
whatever the umask; a folder meant to be shared or pushed would then hold one file others cannot read.
"""
import os
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from timm_ext._files import user_file_mode

__all__ = ['save_safetensors']


def save_safetensors(
        tensors: Dict[str, torch.Tensor],
        path: Union[str, Path],
        metadata: Optional[Dict[str, str]] = None,
) -> None:
    """``safetensors.torch.save_file`` (written whole, then renamed into place) with the mode of a new file."""
    from safetensors.torch import save_file
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, user_file_mode())
