"""Exported models give PyTorch's outputs: every family's backbone exported once with dynamic
height and width and run at three sizes, a UperNet and a Mask R-CNN (tiny, initialised
weights), in onnxruntime and as torch.export programs; the tensor graphs equal mmseg's and
mmdet's own inference."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from common import CONFIGS, TINY_ARCH, TINY_BACKBONES, require_onnx
from mmengine.config import Config, ConfigDict

from vitdense.deploy import (ExportedModel, MaskRCNNGraph, SegmentorGraph, deployable,
                             export_module, max_abs_differences)
from vitdense.deploy.graphs import AdaptiveAvgPool2d, IntegerUpsample
from vitdense.model_factory import build_model
from vitdense.registry import MODELS

# square, non-square, and neither side a multiple of 32 (nor of the patch size 16)
SIZES = [(224, 224), (256, 320), (200, 333)]
TOLERANCE = 1e-4


def _export(module: torch.nn.Module, example: torch.Tensor, path, fmt: str = 'onnx'):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return ExportedModel(export_module(module, example, path, fmt, dynamic=True))


@pytest.fixture(scope='module', params=sorted(TINY_BACKBONES))
def exported_backbone(request, tmp_path_factory):
    require_onnx()
    torch.manual_seed(0)
    backbone = MODELS.build(TINY_BACKBONES[request.param]).eval()
    path = tmp_path_factory.mktemp('export') / f'{request.param}.onnx'
    return backbone, _export(backbone, torch.randn(1, 3, 224, 224), path)


@pytest.mark.parametrize('size', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
def test_backbone_onnx_matches_pytorch_at_any_size(exported_backbone, size):
    backbone, exported = exported_backbone
    image = torch.randn(1, 3, *size)
    with torch.no_grad():
        expected = backbone(image)
    got = exported(image)
    # the four pyramid levels, cropped to ceil(size / stride) whatever the size
    assert [tuple(t.shape[2:]) for t in got] == [
        (-(-size[0] // s), -(-size[1] // s)) for s in (4, 8, 16, 32)]
    assert max(max_abs_differences(expected, got)) < TOLERANCE


def test_backbone_export_leaves_no_state_and_program_runs_any_size(tmp_path):
    """A backbone that ran before (position table, Fourier features, GPSA offsets at one
    grid) still exports a graph for every size: nothing of a forward is kept."""
    torch.manual_seed(0)
    backbone = MODELS.build(TINY_BACKBONES['convit']).eval()
    with torch.no_grad():
        backbone(torch.randn(1, 3, 160, 160))
    exported = _export(backbone, torch.randn(1, 3, 224, 224), tmp_path / 'convit.pt2',
                       'torch-export')
    image = torch.randn(1, 3, 200, 333)
    with torch.no_grad():
        expected = backbone(image)
    assert max(max_abs_differences(expected, exported(image))) < TOLERANCE


def test_adapter_layout_exports_for_any_size(tmp_path):
    """ViT-Adapter's backbone (the demo adapter's layout, narrower and shallower) exported with
    dynamic height and width runs at sizes whose levels round differently from the traced
    one's."""
    torch.manual_seed(0)
    adapter = MODELS.build(dict(
        type='vitdense.ColumnarAdapter', conv_inplane=8, deform_num_heads=2,
        interaction_indexes=[[0, 0], [1, 1]], use_extra_extractor=False,
        norm_cfg=dict(type='BN'),
        backbone=dict(type='vitdense.ViT', arch=dict(TINY_ARCH, num_layers=2), patch_size=8,
                      img_size=64, dense_class_token=False))).eval()
    exported = _export(adapter, torch.randn(1, 3, 96, 128), tmp_path / 'adapter.pt2',
                       'torch-export')
    for size in ((80, 150), (101, 67)):
        image = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected = adapter(image)
        assert max(max_abs_differences(expected, exported(image))) < TOLERANCE


def _demo_model(config: str, **model_overrides) -> torch.nn.Module:
    """A demo recipe's model with the tiny XCiT and narrow heads, initialised weights."""
    cfg = Config.fromfile(CONFIGS / config)
    cfg.model.backbone.arch = dict(TINY_ARCH)
    cfg.merge_from_dict(dict(model=model_overrides))
    torch.manual_seed(0)
    return build_model(cfg, 'deploy')


@pytest.fixture(scope='module')
def segmentor():
    return _demo_model('xcit/upernet_xcit-d6-p8_demo-ade.py',
                       decode_head=dict(in_channels=[32] * 4, channels=32),
                       auxiliary_head=dict(in_channels=32, channels=16))


@pytest.fixture(scope='module')
def mask_rcnn():
    return _demo_model('xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py',
                       neck=dict(in_channels=[32] * 4, out_channels=32),
                       rpn_head=dict(in_channels=32, feat_channels=32),
                       roi_head=dict(bbox_roi_extractor=dict(out_channels=32),
                                     bbox_head=dict(in_channels=32, fc_out_channels=64),
                                     mask_roi_extractor=dict(out_channels=32),
                                     mask_head=dict(in_channels=32, conv_out_channels=32)))


def _image(*size: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, 3, *size), generator=torch.Generator().manual_seed(0)
                         ).float()


def test_adaptive_pool_equals_torch_for_any_bins():
    x = torch.randn(2, 3, 13, 22)
    for size in (1, 2, 3, 6, (4, None)):
        assert torch.allclose(AdaptiveAvgPool2d(size)(x), torch.nn.AdaptiveAvgPool2d(size)(x),
                              atol=1e-6)


def test_integer_upsample_equals_mmseg_upsample():
    from mmseg.models.utils import Upsample
    x = torch.randn(1, 4, 7, 11)
    for mode, align_corners in (('bilinear', False), ('nearest', None)):
        expected = Upsample(scale_factor=2, mode=mode, align_corners=align_corners)(x)
        assert torch.equal(IntegerUpsample(2, mode, align_corners)(x), expected)


def test_segmentor_graph_equals_mmseg_inference(segmentor):
    graph, kind = deployable(segmentor)
    assert kind == 'segmentor' and isinstance(graph, SegmentorGraph)
    image = _image(100, 141)
    data = segmentor.data_preprocessor(dict(inputs=list(image)), False)
    metas = [dict(img_shape=(100, 141), ori_shape=(100, 141), pad_shape=(100, 141),
                  padding_size=[0] * 4)]
    with torch.no_grad():
        expected = segmentor.inference(data['inputs'], metas)
        logits, labels = graph(image)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert torch.equal(labels, expected.argmax(1))


def test_segmentor_onnx_labels_match_at_any_size(segmentor, tmp_path):
    require_onnx()
    graph, _ = deployable(segmentor)
    exported = _export(graph, _image(128, 128), tmp_path / 'upernet.onnx')
    for size in ((128, 128), (96, 200), (150, 173)):
        image = _image(*size)
        with torch.no_grad():
            logits, labels = graph(image)
        got_logits, got_labels = exported(image)
        assert got_labels.shape == (1, *size)
        assert max_abs_differences([logits], [got_logits])[0] < TOLERANCE
        assert (got_labels == labels).double().mean() >= 0.999


@pytest.fixture(scope='module')
def sliding_segmentor(segmentor):
    sliding = copy.deepcopy(segmentor)
    sliding.test_cfg = ConfigDict(mode='slide', crop_size=(64, 64), stride=(48, 48))
    return sliding


def test_slide_graph_equals_mmseg_slide_inference(sliding_segmentor):
    """Overlapping windows (stride 48 < crop 64) and a last window flush with the edge."""
    graph, _ = deployable(sliding_segmentor)
    image = _image(100, 141)
    data = sliding_segmentor.data_preprocessor(dict(inputs=list(image)), False)
    metas = [dict(img_shape=(100, 141), ori_shape=(100, 141), pad_shape=(100, 141),
                  padding_size=[0] * 4)]
    with torch.no_grad():
        expected = sliding_segmentor.inference(data['inputs'], metas)
        logits, labels = graph(image)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert torch.equal(labels, expected.argmax(1))


def test_slide_segmentor_runs_in_onnxruntime_at_its_size(sliding_segmentor, tmp_path):
    """2 × 2 overlapping windows, the second row and column flush with the edge: the graph
    holds the network once per window, and its ONNX export time grows with the windows."""
    require_onnx()
    graph, _ = deployable(sliding_segmentor)
    image = _image(80, 100)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        exported = ExportedModel(export_module(graph, image, tmp_path / 'slide.onnx',
                                               dynamic=False))
        with pytest.raises(Exception, match='fixed size'):
            export_module(graph, image, tmp_path / 'dynamic.onnx', dynamic=True)
    with torch.no_grad():
        logits, labels = graph(image)
    got_logits, got_labels = exported(image)
    assert max_abs_differences([logits], [got_logits])[0] < TOLERANCE
    assert (got_labels == labels).double().mean() >= 0.999


def _mmdet_predict(detector, image: torch.Tensor):
    from mmdet.structures import DetDataSample
    size = tuple(image.shape[2:])
    sample = DetDataSample(metainfo=dict(img_shape=size, ori_shape=size, scale_factor=(1., 1.)))
    data = detector.data_preprocessor(dict(inputs=list(image), data_samples=[sample]), False)
    with torch.no_grad():
        return detector.predict(data['inputs'], data['data_samples'])[0].pred_instances


def test_mask_rcnn_graph_equals_mmdet_predict(mask_rcnn):
    graph, kind = deployable(mask_rcnn)
    assert kind == 'mask-rcnn' and isinstance(graph, MaskRCNNGraph)
    image = _image(120, 170)
    expected = _mmdet_predict(mask_rcnn, image)
    with torch.no_grad():
        boxes, scores, labels, masks = graph(image)
    assert len(expected) > 0
    assert torch.equal(boxes, expected.bboxes) and torch.equal(scores, expected.scores)
    assert torch.equal(labels, expected.labels) and torch.equal(masks, expected.masks)


def test_mask_rcnn_onnx_uses_standard_ops_and_matches(mask_rcnn, tmp_path):
    require_onnx()
    import onnx
    graph, _ = deployable(mask_rcnn)
    exported = _export(graph, _image(160, 160), tmp_path / 'mask_rcnn.onnx')
    nodes = onnx.load(str(exported.path)).graph.node
    assert {'NonMaxSuppression', 'RoiAlign'} <= {node.op_type for node in nodes}
    assert {node.domain for node in nodes} <= {'', 'ai.onnx'}
    for size in ((160, 160), (136, 200)):
        image = _image(*size)
        with torch.no_grad():
            expected = graph(image)
        got = exported(image)
        assert len(got[0]) == len(expected[0]) > 0
        assert got[3].shape[1:] == size
        assert max(max_abs_differences(expected[:2], got[:2])) < 1e-3
        assert torch.equal(got[2], expected[2])
        assert (got[3] == expected[3]).double().mean() >= 0.999


def test_deployable_names_what_it_cannot_export(segmentor):
    with pytest.raises(ValueError, match='unknown part'):
        deployable(segmentor, part='neck')
    cls_backbone = MODELS.build(dict(TINY_BACKBONES['vit'], out_type='cls_token'))
    with pytest.raises(ValueError, match="out_type='featmap'"):
        deployable(cls_backbone)
    unknown = torch.nn.Module()
    unknown.test_cfg = dict(mode='tiles')
    with pytest.raises(ValueError, match="'tiles'.*'whole' images or 'slide' windows"):
        SegmentorGraph(unknown)


def test_export_refuses_to_overwrite(tmp_path):
    out = tmp_path / 'model.onnx'
    out.write_text('user data')
    with pytest.raises(FileExistsError, match='exists'):
        export_module(torch.nn.Identity(), torch.zeros(1, 3, 64, 64), out)
    assert out.read_text() == 'user data'
