"""Model families of timm-ext, registered with timm on import."""
from timm_ext.models import (
    mlp_mixer_p8,  # noqa: F401  (registers mixer_s8_224, mixer_b8_224)
    vision_transformer_convstem,  # noqa: F401  (registers vit_*_convstem)
)
from timm_ext.models.alternet import AlterNet
from timm_ext.models.alternet_convert import convert_official_alternet
from timm_ext.models.cb_retrofit import add_context_broadcast
from timm_ext.models.hdvw_baselines import CifarStemResNet
from timm_ext.models.mlp_mixer_cb import MlpMixerCB
from timm_ext.models.pit_cb import PoolingVisionTransformerCB
from timm_ext.models.vision_transformer_cb import VisionTransformerCB
from timm_ext.models.volo_convstem import VOLOConvStem

__all__ = ['MlpMixerCB', 'PoolingVisionTransformerCB', 'VisionTransformerCB', 'add_context_broadcast']
__all__ += ['VOLOConvStem']
__all__ += ['AlterNet', 'convert_official_alternet']
__all__ += ['CifarStemResNet']
