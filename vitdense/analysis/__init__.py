"""Analysis of trained backbones: the maths behind the papers' figures (attention maps,
rollout, attention distance, position-encoding similarity, patch-filter components, ConViT's
gates, dense features as colours), timm parity and model complexity. Plain tensors in and
out; drawing is left to ``tools/analysis_tools/``."""
from .attention import (AttentionRecord, AttentionRecorder, attention_rollout,
                        class_attention_maps, mean_attention_distance, nonlocality,
                        patch_grid_maps, query_attention_maps, record_attention, upsample_maps)
from .convit import gating_strengths
from .embeddings import (filter_components, patch_embedding_filters, position_encodings,
                         position_similarity)
from .features import pca_rgb
from .loading import (backbone_for_timm, backbone_from_config, build_backbone, image_to_tensor,
                      load_weights, read_state_dict, timm_random_state_dict)

__all__ = [
    'AttentionRecord', 'AttentionRecorder', 'attention_rollout', 'class_attention_maps',
    'mean_attention_distance', 'nonlocality', 'patch_grid_maps', 'query_attention_maps',
    'record_attention', 'upsample_maps', 'gating_strengths', 'filter_components',
    'patch_embedding_filters', 'position_encodings', 'position_similarity', 'pca_rgb',
    'backbone_for_timm', 'backbone_from_config', 'build_backbone', 'image_to_tensor',
    'load_weights', 'read_state_dict', 'timm_random_state_dict']
