"""EoMT's semantic segmentation in mmseg: an ``EncoderDecoder`` whose backbone is
``vitdense.EoMT`` (it makes the predictions) and whose decode head is :class:`EoMTHead`.

The head is mmseg's ``Mask2FormerHead`` without its pixel decoder and transformer decoder:
the ground truth conversion, mmdet's Hungarian matcher and losses on sampled points
(``loss_by_feat``) and the semantic inference are the hosts', applied to the prediction EoMT
makes before each masked block and after the last (Mask2Former's per-layer deep supervision,
as the official EoMT trains).
"""
from typing import Optional, Union

from mmdet.models.dense_heads.base_dense_head import BaseDenseHead
from mmseg.models.decode_heads import Mask2FormerHead
from mmseg.utils import SampleList

from ..det.eomt import Predictions, build_mask_classification_training, eomt_predictions
from ..registry import MODELS


@MODELS.register_module()
class EoMTHead(Mask2FormerHead):
    """mmseg's Mask2Former losses and inference on EoMT's predictions; no layers of its own.

    Args:
        num_classes: classes, without "no object".
        num_queries: the queries of the EoMT backbone (the matcher's sampling reads it).
        loss_cls, loss_mask, loss_dice: mmdet losses, as mmseg's ``Mask2FormerHead`` takes
            them (the official EoMT's: class 2.0 with "no object" weighted 0.1, mask BCE
            5.0, dice 5.0).
        train_cfg: ``assigner``, ``sampler``, ``num_points``, ``oversample_ratio``,
            ``importance_sample_ratio``, as mmdet's ``Mask2FormerHead`` takes them.
        test_cfg, align_corners, ignore_index, init_cfg: as mmseg's ``Mask2FormerHead``.
    """

    def __init__(self, num_classes: int, num_queries: int, loss_cls: dict, loss_mask: dict,
                 loss_dice: dict, train_cfg: dict, test_cfg: Optional[dict] = None,
                 align_corners: bool = False, ignore_index: int = 255,
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        # mmseg's and mmdet's constructors build the decoders EoMT does without
        BaseDenseHead.__init__(self, init_cfg=init_cfg)
        self.num_classes = self.out_channels = num_classes
        self.num_queries, self.align_corners = num_queries, align_corners
        self.ignore_index, self.test_cfg = ignore_index, test_cfg
        build_mask_classification_training(self, loss_cls, loss_mask, loss_dice, train_cfg)

    def init_weights(self) -> None:
        """Nothing to initialise (Mask2FormerHead's initialises its decoders)."""
        BaseDenseHead.init_weights(self)

    def forward(self, x: Predictions,
                batch_data_samples: Optional[SampleList] = None) -> Predictions:
        """EoMT's (class logits, mask logits) per prediction, as they come (mmseg's
        ``mode='tensor'`` passes no samples)."""
        return eomt_predictions(self, x)
