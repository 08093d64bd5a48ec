"""mmpretrain image classifier with the training options of the DeiT/CaiT/"Three things" papers.

``vitdense.ViTClassifier`` is a drop-in ``ImageClassifier`` that adds two config switches:

* ``teacher``: hard distillation (DeiT §5.2, CaiT §4.3 "Υ"): the teacher's argmax on the
  (mixed) input is a second target and the loss is the mean of the true-label and teacher-label
  losses. The teacher is frozen, always in eval mode and kept out of the student's checkpoints.
* ``finetune='attention'``: attention-only fine-tuning ("Three things" §4), see ``finetune.py``.

Both act at construction time, before the runner wraps the model in DDP, so distributed runs see
the frozen parameters as such.
"""
from __future__ import annotations

import re
from typing import Optional, Union

import torch
from mmengine.config import Config
from mmengine.hub import get_config
from mmengine.logging import MMLogger
from mmengine.runner.checkpoint import _load_checkpoint_to_model
from mmpretrain.models import ImageClassifier
from mmpretrain.registry import MODELS as MMPRETRAIN_MODELS
from mmpretrain.structures import DataSample
from torch import nn

from ..checkpoint_io import load_checkpoint
from ..model_factory import image_normalization
from ..registry import MODELS
from .finetune import ATTENTION_ONLY, train_only

_TEACHER_KEY = re.compile(r'(^|\.)teacher\.')


def build_teacher(config: Union[str, dict], checkpoint: Optional[str] = None) -> nn.Module:
    """Build a frozen classifier from a config file or a model dict.

    ``config`` is a path, a package config such as ``'mmpretrain::regnet/...py'`` (whose
    ``model`` and ``data_preprocessor`` are used) or a model dict. The checkpoint is loaded
    weights-only (:func:`vitdense.checkpoint_io.load_checkpoint`, whatever the environment
    says) after the teacher's own initialisation, which marks it initialised, so the
    student's ``init_weights`` leaves it alone.
    """
    if isinstance(config, str):
        cfg = get_config(config) if '::' in config else Config.fromfile(config)
        model_cfg = cfg.model
        if 'data_preprocessor' in cfg:
            model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    else:
        model_cfg = Config(config)
    if checkpoint is not None:
        model_cfg.init_cfg = None  # the checkpoint replaces the config's own initialisation
    teacher = MMPRETRAIN_MODELS.build(model_cfg)
    teacher.init_weights()
    if checkpoint is not None:
        _load_checkpoint_to_model(teacher, load_checkpoint(checkpoint), strict=False,
                                  logger='current')
    teacher.requires_grad_(False)
    return teacher.eval()


@MODELS.register_module()
class ViTClassifier(ImageClassifier):
    """``ImageClassifier`` with optional hard distillation and attention-only fine-tuning.

    Args:
        teacher: ``dict(config=<config file or model dict>, checkpoint=<path or None>)``;
            None trains without distillation.
        distill_weight: weight of the teacher-label loss; the true-label loss gets
            ``1 - distill_weight`` (0.5: the mean of both, as in DeiT/CaiT).
        distill_loss: loss against the teacher's hard labels (DeiT: plain cross-entropy).
        finetune: ``'full'`` trains every parameter, ``'attention'`` only attention, norms,
            position embeddings, class token and head.
        **kwargs: ``ImageClassifier`` arguments (backbone, neck, head, train_cfg, ...).
    """

    def __init__(self, *, teacher: Optional[dict] = None, distill_weight: float = 0.5,
                 distill_loss: dict = dict(type='CrossEntropyLoss'),
                 finetune: str = 'full', **kwargs) -> None:
        super().__init__(**kwargs)
        if finetune not in ('full', 'attention'):
            raise ValueError(f"finetune must be 'full' or 'attention', got {finetune!r}")
        if finetune == 'attention':
            summary = train_only(self, ATTENTION_ONLY)
            MMLogger.get_current_instance().info(f'attention-only fine-tuning: {summary}')
        self.teacher = None
        if teacher is not None:
            self.teacher = build_teacher(**teacher)
            self.distill_weight = distill_weight
            self.distill_loss = MMPRETRAIN_MODELS.build(distill_loss)
            self.register_state_dict_post_hook(_drop_teacher_keys)
            self.register_load_state_dict_post_hook(_ignore_missing_teacher_keys)

    def train(self, mode: bool = True) -> 'ViTClassifier':
        """Switch the student's mode; the teacher stays in eval mode (BN statistics, dropout)."""
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def loss(self, inputs: torch.Tensor, data_samples: list[DataSample]) -> dict:
        """Head loss on the labels, plus the teacher-label loss when distilling."""
        if self.teacher is None:
            return super().loss(inputs, data_samples)
        cls_score = self.head(self.extract_feat(inputs))
        with torch.no_grad():
            teacher_inputs = renormalize(inputs, self.data_preprocessor,
                                         self.teacher.data_preprocessor)
            teacher_labels = self.teacher(teacher_inputs, mode='tensor').argmax(dim=1)
        # ``_get_loss`` is the head's loss on given scores: both losses see the same output.
        losses = self.head._get_loss(cls_score, data_samples)
        losses['loss'] = losses['loss'] * (1 - self.distill_weight)
        losses['loss_distill'] = self.distill_weight * self.distill_loss(
            cls_score, teacher_labels)
        return losses


def renormalize(inputs: torch.Tensor, src: nn.Module, dst: nn.Module) -> torch.Tensor:
    """Re-express a batch normalised by preprocessor ``src`` as ``dst`` would normalise it.

    The teacher sees the student's (mixed) batch in its own mean / std / channel order, e.g. a
    BGR-normalised mmpretrain RegNet teaching an RGB-normalised transformer.
    """
    src_norm, dst_norm = image_normalization(src), image_normalization(dst)
    raw = inputs if src_norm is None else inputs * src_norm[1] + src_norm[0]
    if src.to_rgb != dst.to_rgb:
        raw = raw.flip(1)
    return raw if dst_norm is None else (raw - dst_norm[0]) / dst_norm[1]


def _drop_teacher_keys(module: nn.Module, state_dict: dict, prefix: str,
                       local_metadata: dict) -> None:
    """The teacher comes from its own config and checkpoint; students' checkpoints skip it."""
    for key in [k for k in state_dict if k.startswith(prefix + 'teacher.')]:
        del state_dict[key]


def _ignore_missing_teacher_keys(module: nn.Module, incompatible_keys) -> None:
    """Loading a student checkpoint (which has no teacher) reports no missing teacher keys."""
    incompatible_keys.missing_keys[:] = [
        k for k in incompatible_keys.missing_keys if not _TEACHER_KEY.search(k)]
