"""Optimizers of timm-ext, registered with timm's optimizer factory on import.

``SAM`` wraps any torch/timm optimizer; ``import timm_ext`` makes ``timm.optim.create_optimizer_v2``
(and a train.py recipe's ``opt:``) build it under the names listed in ``sam_factory``.
"""
from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_factory import ASAM_RHO, SAM_BASES, SAM_RHO, create_sam, list_sam_bases, register_sam_optimizers

register_sam_optimizers()

__all__ = ['ASAM_RHO', 'SAM', 'SAM_BASES', 'SAM_RHO', 'create_sam', 'list_sam_bases', 'register_sam_optimizers']
