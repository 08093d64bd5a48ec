"""The installed stack: versions, and mmcv's compiled ops on CPU against hand-computed values."""
from __future__ import annotations

from importlib.metadata import version

import pytest
import torch


def test_stack_imports_at_the_pinned_versions():
    import mmcv
    import mmcv.ops  # noqa: F401  (the compiled extension)
    import mmdet
    import mmengine
    import mmpretrain
    import mmseg
    import timm  # noqa: F401

    import vitdense
    assert torch.__version__.split('+')[0] == '2.14.1'
    assert mmcv.__version__ == '2.1.0'
    assert mmengine.__version__.startswith('0.10.')
    assert mmdet.__version__.startswith('3.3.')
    assert mmseg.__version__.startswith('1.2.')
    assert mmpretrain.__version__.startswith('1.2.')
    assert version('vitdense') == vitdense.__version__


def test_roi_align_matches_hand_computed_bilinear_samples():
    from mmcv.ops import RoIAlign
    feat = torch.zeros(1, 1, 4, 4)
    feat[0, 0, 1, 1] = 1.0
    # aligned=True shifts by half a pixel: box (1,1)-(2,2) covers [0.5, 1.5]^2; with 2x2
    # samples at 0.75 and 1.25 each sees pixel (1, 1) with weight 0.75 * 0.75.
    rois = torch.tensor([[0., 1., 1., 2., 2.]])
    out = RoIAlign((1, 1), spatial_scale=1.0, sampling_ratio=2, aligned=True)(feat, rois)
    assert out.item() == pytest.approx(0.5625)

    # A linear map is reproduced exactly: value = 4 y + x at the bin centres.
    ramp = torch.arange(16.).reshape(1, 1, 4, 4)
    rois = torch.tensor([[0., 1., 1., 3., 3.]])  # [0.5, 2.5]^2, bin centres at 1 and 2
    out = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)(ramp, rois)
    torch.testing.assert_close(out[0, 0], torch.tensor([[5., 6.], [9., 10.]]))


def test_nms_keeps_boxes_by_hand_computed_iou():
    from mmcv.ops import nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.]])
    scores = torch.tensor([0.7, 0.9, 0.8])
    # IoU(box0, box1) = 81 / (100 + 100 - 81) = 0.68
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [1, 2]
    torch.testing.assert_close(dets[:, 4], torch.tensor([0.9, 0.8]))
    torch.testing.assert_close(dets[:, :4], boxes[[1, 2]])
    _, keep = nms(boxes, scores, iou_threshold=0.7)
    assert keep.tolist() == [1, 2, 0]
