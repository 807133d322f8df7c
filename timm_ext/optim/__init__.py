"""Optimizers of timm-ext, registered with timm's optimizer factory on import.

``SAM`` wraps any torch/timm optimizer, ``GSAM``, ``LookSAM``, ``WSAM``, ``FriendlySAM``, ``SAMON`` and ``ESAM``
are SAM variants built the same way, ``MomentumSAM`` its one-pass kin over the base's momentum, ``BSAM`` (bSAM) a
SAM over an update of its own (one name, ``bsam``); ``MESA`` (``mesa<base>``) adds MESA's KL to an EMA of the model
to the loss of timm's training task, ``MESALoss`` the same term in a loop of your own;
``SAM.step()`` is one update, top to bottom in ``sam.py`` (a closure in torch's or davda54/sam's convention;
timm's training task replayed after ``replay_timm_task``; m-sharpness chunks in ``m_sharpness``).
``import timm_ext`` makes ``timm.optim.create_optimizer_v2`` (and a train.py recipe's ``opt:``) build
them under the names listed in ``sam_factory`` (``samadamw``, ``gsamadamw``, ``looksamadamw``, ...), each
name's class written there (``SAMAdamW``, ...). Each family's settings are declared once, in ``sam_settings``;
``sam_opt_kwargs()`` lists every optimizer keyword the family takes that a plain base optimizer does not.
"""
from timm_ext.optim.bsam import BSAM, register_bsam_optimizer
from timm_ext.optim.esam import ESAM
from timm_ext.optim.friendly_sam import FriendlySAM
from timm_ext.optim.gsam import GSAM
from timm_ext.optim.looksam import LookSAM
from timm_ext.optim.m_sharpness import BatchChunk
from timm_ext.optim.mesa import MESALoss
from timm_ext.optim.mesa_optimizer import MESA, register_mesa_optimizers
from timm_ext.optim.momentum_sam import MomentumSAM
from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_errors import NoSecondPassError
from timm_ext.optim.sam_factory import (
    ASAM_RHO,
    SAM_BASES,
    SAM_RHO,
    FactoryESAM,
    FactoryFriendlySAM,
    FactoryGSAM,
    FactoryLookSAM,
    FactoryMomentumSAM,
    FactorySAM,
    FactorySAMON,
    FactoryWSAM,
    list_sam_bases,
    register_sam_optimizers,
)
from timm_ext.optim.sam_on import SAMON
from timm_ext.optim.sam_settings import (
    BSAMSettings,
    ESAMSettings,
    FriendlySAMSettings,
    GSAMSettings,
    LookSAMSettings,
    MomentumSAMSettings,
    SAMONSettings,
    SAMSettings,
    WSAMSettings,
    sam_opt_kwargs,
)
from timm_ext.optim.task_replay import replay_timm_task
from timm_ext.optim.wsam import WSAM

register_sam_optimizers()
register_bsam_optimizer()
register_mesa_optimizers()

__all__ = ['ASAM_RHO', 'BSAM', 'BSAMSettings', 'BatchChunk', 'ESAM', 'ESAMSettings', 'FactoryESAM',
           'FactoryFriendlySAM', 'FactoryGSAM', 'FactoryLookSAM', 'FactoryMomentumSAM', 'FactorySAM', 'FactorySAMON',
           'FactoryWSAM', 'FriendlySAM', 'FriendlySAMSettings', 'GSAM', 'GSAMSettings', 'LookSAM', 'LookSAMSettings',
           'MESA', 'MESALoss', 'MomentumSAM', 'MomentumSAMSettings', 'NoSecondPassError', 'SAM', 'SAMON',
           'SAMONSettings', 'SAMSettings', 'SAM_BASES', 'SAM_RHO', 'WSAM', 'WSAMSettings', 'list_sam_bases',
           'register_bsam_optimizer', 'register_mesa_optimizers', 'register_sam_optimizers', 'replay_timm_task',
           'sam_opt_kwargs']
