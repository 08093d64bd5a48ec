"""Image classification with mmpretrain: the only part of vitdense that imports mmpretrain.

Import it from a config with ``custom_imports=dict(imports=['vitdense', 'vitdense.cls'])`` to
register ``vitdense.ViTClassifier`` (hard distillation, attention-only fine-tuning) and the
split training pipeline: ``vitdense.LoadImageTensor`` decodes in the loader's workers,
``vitdense.DeviceAugmentPreprocessor`` augments on the device.
"""
from .classifier import ViTClassifier, build_teacher
from .device_augment import DeviceAugmentPreprocessor, LoadImageTensor
from .finetune import ATTENTION_ONLY, TrainableSummary, train_only

__all__ = ['ViTClassifier', 'build_teacher', 'ATTENTION_ONLY', 'TrainableSummary', 'train_only',
           'DeviceAugmentPreprocessor', 'LoadImageTensor']
