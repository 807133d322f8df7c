"""Optimizers of timm-ext, registered with timm's optimizer factory on import.

``SAM`` wraps any torch/timm optimizer, ``GSAM`` and ``LookSAM`` are SAM variants built the same way;
``step()``'s passes are run by ``sam_step`` (a closure, m-sharpness chunks, timm's training task replayed
after ``replay_timm_task``), installed on the core class here.
``import timm_ext`` makes ``timm.optim.create_optimizer_v2`` (and a train.py recipe's ``opt:``) build
them under the names listed in ``sam_factory`` (``samadamw``, ``gsamadamw``, ``looksamadamw``, ...).
Each family's settings are declared once, in ``sam_settings``; ``sam_opt_kwargs()`` lists every
optimizer keyword the family takes that a plain base optimizer does not.
"""
from timm_ext.optim.gsam import GSAM
from timm_ext.optim.looksam import LookSAM
from timm_ext.optim.m_sharpness import BatchChunk
from timm_ext.optim.replay_passes import NoSecondPassError
from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_factory import (
    ASAM_RHO,
    SAM_BASES,
    SAM_RHO,
    FactoryGSAM,
    FactoryLookSAM,
    FactorySAM,
    create_gsam,
    create_looksam,
    create_sam,
    list_sam_bases,
    register_sam_optimizers,
)
from timm_ext.optim.sam_settings import GSAMSettings, LookSAMSettings, SAMSettings, sam_opt_kwargs
from timm_ext.optim.sam_step import run_step
from timm_ext.optim.task_replay import replay_timm_task

SAM.driver = staticmethod(run_step)  # step()'s passes: the drivers above the core
register_sam_optimizers()

__all__ = ['ASAM_RHO', 'BatchChunk', 'FactoryGSAM', 'FactoryLookSAM', 'FactorySAM', 'GSAM', 'GSAMSettings', 'LookSAM',
           'LookSAMSettings', 'NoSecondPassError', 'SAM', 'SAMSettings', 'SAM_BASES', 'SAM_RHO', 'create_gsam',
           'create_looksam', 'create_sam', 'list_sam_bases', 'register_sam_optimizers', 'replay_timm_task',
           'sam_opt_kwargs']
