"""EoMT's semantic segmentation in mmseg: an ``EncoderDecoder`` whose backbone is
``vitdense.EoMT`` (it makes the predictions) and whose decode head is :class:`EoMTHead`.

The head is mmseg's ``Mask2FormerHead`` without its pixel decoder and transformer decoder:
the ground truth conversion, mmdet's Hungarian matcher and losses on sampled points
(``loss_by_feat``) and the semantic inference are the hosts', applied to the prediction EoMT
makes before each masked block and after the last (Mask2Former's per-layer deep supervision,
as the official EoMT trains).
"""
from typing import Optional, Union

from mmseg.models.decode_heads import Mask2FormerHead

from ..det.eomt import EoMTPredictionHead
from ..registry import MODELS


@MODELS.register_module()
class EoMTHead(EoMTPredictionHead, Mask2FormerHead):
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
        self.build_without_decoders(num_queries, loss_cls, loss_mask, loss_dice, train_cfg,
                                    test_cfg, init_cfg)
        self.num_classes = self.out_channels = num_classes
        self.align_corners, self.ignore_index = align_corners, ignore_index
