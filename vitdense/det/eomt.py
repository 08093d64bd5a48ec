"""EoMT's instance segmentation in mmdet: mmdet's ``Mask2Former`` detector whose backbone is
``vitdense.EoMT`` (it makes the predictions) and whose ``panoptic_head`` is
:class:`EoMTDetHead`.

The head is mmdet's ``Mask2FormerHead`` without its pixel decoder and transformer decoder:
the ground truth conversion, the Hungarian matcher and the losses on sampled points
(``loss_by_feat``) and the upsampling for mmdet's ``MaskFormerFusionHead`` are the host's,
applied to the prediction EoMT makes before each masked block and after the last.
"""
from typing import Optional, Union

from mmdet.models.dense_heads import Mask2FormerHead
from mmdet.models.dense_heads.base_dense_head import BaseDenseHead
from mmdet.registry import MODELS as MMDET_MODELS
from mmdet.registry import TASK_UTILS

from ..models.eomt import Predictions
from ..registry import MODELS


class EoMTPredictionHead:
    """What the mmdet and mmseg EoMT heads share, before the host's ``Mask2FormerHead``
    among their bases: the host's losses and matching built without its decoders, nothing
    to initialise, and EoMT's predictions passed on as the host's decoder would give
    them."""

    num_queries: int

    def build_without_decoders(self, num_queries: int, loss_cls: dict, loss_mask: dict,
                               loss_dice: dict, train_cfg: Optional[dict],
                               test_cfg: Optional[dict],
                               init_cfg: Optional[Union[dict, list]]) -> None:
        """What mmdet's ``Mask2FormerHead.loss_by_feat`` reads: its matcher and sampler,
        point sampling ratios and the three losses, built as that head builds them (the
        hosts' constructors build the decoders EoMT does without)."""
        BaseDenseHead.__init__(self, init_cfg=init_cfg)
        self.num_queries, self.test_cfg, self.train_cfg = num_queries, test_cfg, train_cfg
        if train_cfg:
            self.assigner = TASK_UTILS.build(train_cfg['assigner'])
            self.sampler = TASK_UTILS.build(train_cfg['sampler'],
                                            default_args=dict(context=self))
            self.num_points = train_cfg.get('num_points', 12544)
            self.oversample_ratio = train_cfg.get('oversample_ratio', 3.0)
            self.importance_sample_ratio = train_cfg.get('importance_sample_ratio', 0.75)
        self.class_weight = loss_cls.get('class_weight')
        self.loss_cls = MMDET_MODELS.build(loss_cls)
        self.loss_mask = MMDET_MODELS.build(loss_mask)
        self.loss_dice = MMDET_MODELS.build(loss_dice)

    def init_weights(self) -> None:
        """Nothing to initialise (Mask2FormerHead's initialises its decoders)."""
        BaseDenseHead.init_weights(self)

    def forward(self, x: Predictions, batch_data_samples: Optional[list] = None) -> Predictions:
        """EoMT's (class logits, mask logits) per prediction, as they come, checked against
        the head's ``num_queries`` (mmseg's ``mode='tensor'`` passes no samples)."""
        class_logits, mask_logits = x
        if class_logits[-1].shape[1] != self.num_queries:
            raise ValueError(f'{type(self).__name__} has num_queries={self.num_queries} but '
                             f'the backbone predicts {class_logits[-1].shape[1]} queries: set '
                             f'the same number in both')
        return class_logits, mask_logits


@MODELS.register_module()
class EoMTDetHead(EoMTPredictionHead, Mask2FormerHead):
    """mmdet's Mask2Former losses and inference on EoMT's predictions; no layers of its own.

    Args:
        num_things_classes, num_stuff_classes: as mmdet's ``Mask2FormerHead``.
        num_queries: the queries of the EoMT backbone.
        loss_cls, loss_mask, loss_dice: mmdet losses, as mmdet's ``Mask2FormerHead``.
        train_cfg, test_cfg: given by the detector (its ``train_cfg``: ``assigner``,
            ``sampler``, ``num_points``, ...).
        init_cfg: mmengine initialisation.
    """

    def __init__(self, num_things_classes: int, num_stuff_classes: int, num_queries: int,
                 loss_cls: dict, loss_mask: dict, loss_dice: dict,
                 train_cfg: Optional[dict] = None, test_cfg: Optional[dict] = None,
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        self.build_without_decoders(num_queries, loss_cls, loss_mask, loss_dice, train_cfg,
                                    test_cfg, init_cfg)
        self.num_things_classes, self.num_stuff_classes = num_things_classes, num_stuff_classes
        self.num_classes = num_things_classes + num_stuff_classes
