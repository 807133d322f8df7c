"""Hub checkpoints of timm-ext (and timm) models: export, check, push and load.

* :func:`load_checkpoint` reads a train.py checkpoint (``last.pth.tar``, ``model_best.pth.tar``; its EMA
  weights on request) or a safetensors file, with ``torch.load(weights_only=True)`` only;
* :func:`export` writes a hub folder: ``model.safetensors`` (only), ``config.json`` (``architecture``,
  ``num_classes``, ``num_features``, ``model_args``, ``pretrained_cfg``) and a model card ``README.md``;
  the same on every timm release timm-ext supports;
* :func:`check_folder` checks a folder loads (it is rebuilt from its config on the meta device);
* :func:`push` uploads a checked folder through ``huggingface_hub.HfApi``;
* :func:`load_model` is ``timm.create_model('hf-hub:ORG/NAME' or 'local-dir:DIR')`` with one-line errors.

Loading needs ``import timm_ext`` first: timm has no plugin discovery, so an architecture registered by
timm-ext is unknown to ``timm.create_model`` until this package is imported.
"""
from timm_ext.hub._card import PAPERS, CardInfo, model_card
from timm_ext.hub._checkpoint import Checkpoint, load_checkpoint, load_weights
from timm_ext.hub._files import save_safetensors
from timm_ext.hub._folder import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME, check_folder, export, hub_config
from timm_ext.hub._load import load_model
from timm_ext.hub._push import PushResult, push
from timm_ext.load_errors import HubError

__all__ = [
    'CARD_NAME', 'CONFIG_NAME', 'PAPERS', 'WEIGHTS_NAME', 'CardInfo', 'Checkpoint', 'HubError', 'PushResult',
    'check_folder', 'export', 'hub_config', 'load_checkpoint', 'load_model', 'load_weights', 'model_card', 'push',
    'save_safetensors',
]
