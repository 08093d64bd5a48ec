"""Each mechanism of the four families, once."""
from .attention import (ClassAttention, CrossCovarianceAttention,
                        GatedPositionalSelfAttention, MultiheadSelfAttention)
from .blocks import (ClassAttentionBlock, FeedForward, LayerScale, LocalPatchInteraction,
                     QuickGELU, TransformerBlock, XCiTClassAttentionBlock)
from .branched import BranchedLayerNorm, BranchedLinear
from .embed import (ConvPatchEmbed, FourierPositionEncoding, HMLPPatchEmbed,
                    LearnedPositionEmbedding, PatchEmbed, resample_position_table)
from .norm import LayerNorm2d, build_norm2d
from .pyramid import MultiLevelPyramid
from .relative_bias import RelativePositionBias
from .rotary import RotaryPositionEmbedding
from .simple_pyramid import SimpleFeaturePyramid
from .swiglu import SwiGLU
from .window_attention import DecomposedRelativePosition, window_attention

__all__ = [
    'ClassAttention', 'CrossCovarianceAttention', 'GatedPositionalSelfAttention',
    'MultiheadSelfAttention', 'ClassAttentionBlock', 'FeedForward', 'LayerScale',
    'LocalPatchInteraction', 'TransformerBlock', 'XCiTClassAttentionBlock',
    'BranchedLayerNorm', 'BranchedLinear', 'ConvPatchEmbed', 'FourierPositionEncoding',
    'HMLPPatchEmbed', 'LearnedPositionEmbedding', 'PatchEmbed', 'LayerNorm2d',
    'build_norm2d', 'MultiLevelPyramid', 'SimpleFeaturePyramid', 'DecomposedRelativePosition',
    'window_attention', 'resample_position_table', 'QuickGELU', 'RelativePositionBias',
    'RotaryPositionEmbedding', 'SwiGLU',
]
