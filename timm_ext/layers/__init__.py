"""Layers of timm-ext: one idea per module, usable in any timm or torch model."""
from timm_ext.layers.context_broadcast import CBMlp, ContextBroadcast
from timm_ext.layers.conv_stem import STEM_ALIASES, STEM_VARIANTS, ConvStemPatchEmbed, StemVariant, resolve_stem
from timm_ext.layers.small_map_conv import SMALL_MAP_PIXELS, SmallMapConv2d, create_small_map_conv2d
from timm_ext.layers.window_attention import WindowAttention2d

__all__ = ['CBMlp', 'ContextBroadcast']
__all__ += ['ConvStemPatchEmbed', 'StemVariant', 'STEM_VARIANTS', 'STEM_ALIASES', 'resolve_stem']
__all__ += ['SMALL_MAP_PIXELS', 'SmallMapConv2d', 'create_small_map_conv2d']
__all__ += ['WindowAttention2d']
