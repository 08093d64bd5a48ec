"""Image classification with mmpretrain: the only part of vitdense that imports mmpretrain.

Import it from a config with ``custom_imports=dict(imports=['vitdense', 'vitdense.cls'])`` to
register ``vitdense.ViTClassifier`` (hard distillation, attention-only fine-tuning).
"""
from .classifier import ViTClassifier, build_teacher
from .finetune import ATTENTION_ONLY, TrainableSummary, train_only

__all__ = ['ViTClassifier', 'build_teacher', 'ATTENTION_ONLY', 'TrainableSummary', 'train_only']
