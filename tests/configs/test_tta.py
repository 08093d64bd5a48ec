"""Evaluation as the papers do it: every dense recipe's test-time augmentation (views, flips
undone, views merged), mask-keeping detection merging, and sliding-window inference equal to
whole-image inference where the crop tiles the image exactly."""
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import ConfigDict
from mmengine.dataset import pseudo_collate
from mmengine.model import BaseModule
from mmengine.registry import DATASETS, MODELS, TRANSFORMS, DefaultScope
from mmengine.structures import InstanceData
from torch import nn

from vitdense.demo_data import make_demo_ade
from vitdense.model_factory import build_model
from vitdense.engine.tool_config import point_at_data_root

from common import CONFIGS, REPO_ROOT, RegressToOne, load_tool_config

DEMO_SEG = 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py'
#: one recipe of each dense base (the family leaves inherit their test parts unchanged)
DENSE_RECIPES = {
    'mask-rcnn_xcit-s12-p16_fpn_3x_coco.py': 6,
    'mask-rcnn_xcit-s12-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py': 6,
    'cascade-mask-rcnn_xcit-s12-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py': 6,
    'mask-rcnn_xcit-d6-p8_fpn_demo-coco.py': 6,
    'mask-rcnn_xcit-d6-p8_vitdet_demo-coco.py': 6,
    'upernet_xcit-s12-p16_8xb2-160k_ade20k-512x512.py': 12,
    'upernet_xcit-s12-p16_vitdet_8xb2-160k_ade20k-512x512.py': 12,
    'fpn_xcit-s12-p16_8xb2-80k_ade20k-512x512.py': 12,
    'upernet_xcit-d6-p8_demo-ade.py': 12,
    'upernet_xcit-d6-p8_vitdet_demo-ade.py': 12,
}


def _config(name: str, tmp_path: Path):
    cfg = load_tool_config(str(CONFIGS / 'xcit' / name), None, 'none', str(tmp_path))
    return cfg


@pytest.mark.parametrize('name, views', DENSE_RECIPES.items())
def test_every_dense_recipe_has_multi_scale_flip_tta(name, views, tmp_path):
    cfg = _config(name, tmp_path)
    merging = 'SegTTAModel' if cfg.default_scope == 'mmseg' else 'vitdense.InstanceTTAModel'
    assert cfg.tta_model.type == merging
    augment = next(t for t in cfg.tta_pipeline if t.type == 'TestTimeAug')
    scales, flips = augment.transforms[:2]
    assert len(scales) * len(flips) == views
    assert sorted(flip.prob for flip in flips) == [0.0, 1.0]
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        assert len(TRANSFORMS.build(augment).subroutines) == views


def test_ade20k_tta_scales_the_single_scale(tmp_path):
    """0.5-1.75 × the single-scale (2048, 512), not × the image as loaded."""
    cfg = _config('upernet_xcit-s12-p16_8xb2-160k_ade20k-512x512.py', tmp_path)
    single = next(t for t in cfg.test_pipeline if t.type == 'Resize').scale
    scales = next(t for t in cfg.tta_pipeline if t.type == 'TestTimeAug').transforms[0]
    assert single == (2048, 512)
    assert [s.scale for s in scales] == [(1024, 256), (1536, 384), (2048, 512), (2560, 640),
                                         (3072, 768), (3584, 896)]


def test_slide_inference_for_the_paper_recipes_that_use_it(tmp_path):
    """ViTDet-layout UperNet evaluates as BEiT / ViT-Adapter: 512² windows, stride 341."""
    cfg = _config('upernet_xcit-s12-p16_vitdet_8xb2-160k_ade20k-512x512.py', tmp_path)
    assert cfg.model.test_cfg == dict(mode='slide', crop_size=(512, 512), stride=(341, 341))


# ---------------------------------------------------------------- semantic segmentation
class Pointwise(BaseModule):
    """A per-pixel backbone: its predictions move with the image (horizontally symmetric)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.tanh(self.proj(x)),)


MODELS.register_module('PointwiseTTATestBackbone', module=Pointwise, force=True)


@pytest.fixture(scope='module')
def pointwise_tta(tmp_path_factory):
    """The demo UperNet config's SegTTAModel around a per-pixel segmentor, and a batch of one
    demo image read through the config's tta_pipeline."""
    tmp_path = tmp_path_factory.mktemp('tta')
    data_root = make_demo_ade(tmp_path / 'data', num_train=0, num_val=1, size=64)
    cfg = load_tool_config(str(REPO_ROOT / DEMO_SEG), None, 'none', str(tmp_path / 'work'))
    point_at_data_root(cfg, data_root)
    torch.manual_seed(0)
    cfg.model.backbone = dict(type='mmengine.PointwiseTTATestBackbone')
    cfg.model.decode_head = dict(type='FCNHead', in_channels=8, channels=8, num_convs=0,
                                 concat_input=False, num_classes=5, dropout_ratio=0.0)
    cfg.model.auxiliary_head = None
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.tta_model | dict(module=cfg.model)).eval()
        dataset = DATASETS.build(cfg.test_dataloader.dataset | dict(pipeline=cfg.tta_pipeline))
        batch = pseudo_collate([dataset[0]])
    return model, batch, dataset.get_data_info(0)['img_path']


def _view(batch: dict, index: int) -> dict:
    return {key: value[index] for key, value in batch.items()}


def test_symmetric_model_predicts_the_same_flipped_and_unflipped(pointwise_tta):
    model, batch, _ = pointwise_tta
    with torch.no_grad():
        views = [model.module.test_step(_view(batch, i))[0] for i in range(12)]
    for unflipped, flipped in zip(views[0::2], views[1::2]):
        assert not unflipped.flip and flipped.flip
        torch.testing.assert_close(flipped.seg_logits.data, unflipped.seg_logits.data,
                                   rtol=0, atol=1e-5)
        assert torch.equal(flipped.pred_sem_seg.data, unflipped.pred_sem_seg.data)


def test_scale_merging_is_the_mean_of_each_view_probabilities(pointwise_tta):
    """The merged prediction is the arg-max of the views' softmax averaged, each view computed
    here by hand: the image resized (OpenCV bilinear), flipped, normalised, segmented, brought
    back to the original size and unflipped."""
    model, batch, image_path = pointwise_tta
    segmentor = model.module
    image = cv2.imread(image_path)
    height, width = image.shape[:2]
    probabilities = []
    with torch.no_grad():
        for ratio in (0.5, 0.75, 1.0, 1.25, 1.5, 1.75):
            resized = cv2.resize(image, (int(width * ratio + 0.5), int(height * ratio + 0.5)),
                                 interpolation=cv2.INTER_LINEAR)
            for flip in (False, True):
                view = np.ascontiguousarray(resized[:, ::-1] if flip else resized)
                inputs = torch.from_numpy(view).permute(2, 0, 1).float()[[2, 1, 0]]
                inputs = (inputs - segmentor.data_preprocessor.mean) / \
                    segmentor.data_preprocessor.std
                logits = segmentor.encode_decode(inputs[None], [dict(img_shape=view.shape[:2])])
                logits = F.interpolate(logits, (height, width), mode='bilinear',
                                       align_corners=False)
                probabilities.append((logits.flip(-1) if flip else logits).softmax(dim=1))
        expected = torch.stack(probabilities).mean(dim=0).argmax(dim=1)[0]
        merged = model.test_step(batch)[0].pred_sem_seg.data[0]
    assert len(probabilities) == 12
    assert torch.equal(merged, expected)


# ---------------------------------------------------------------- instance segmentation
def _instance_sample(boxes, scores, labels, masks, flip: bool):
    from mmdet.structures import DetDataSample
    sample = DetDataSample(metainfo=dict(ori_shape=(8, 10), img_shape=(8, 10), flip=flip,
                                         flip_direction='horizontal' if flip else None))
    sample.pred_instances = InstanceData(bboxes=torch.tensor(boxes, dtype=torch.float32),
                                         scores=torch.tensor(scores),
                                         labels=torch.tensor(labels), masks=masks)
    return sample


def test_instance_tta_keeps_each_detection_mask_flipped_back():
    """A symmetric detector's flipped view repeats the unflipped view in mirror image: the
    merged result is that view's detections, masks included; views' own detections survive."""
    from vitdense.det import InstanceTTAModel
    masks = torch.zeros(2, 8, 10, dtype=torch.bool)
    masks[0, 1:4, 0:3] = True
    masks[1, 5:8, 6:10] = True
    unflipped = _instance_sample([[0, 1, 3, 4], [6, 5, 10, 8]], [0.9, 0.8], [0, 2], masks,
                                 flip=False)
    mirrored = _instance_sample([[7, 1, 10, 4], [0, 5, 4, 8]], [0.9, 0.8], [0, 2],
                                masks.flip(-1), flip=True)
    tta = InstanceTTAModel(module=RegressToOne(nn.Identity()),
                           tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5),
                                        max_per_img=100))
    merged = tta.merge_preds([[unflipped, mirrored]])[0].pred_instances
    assert merged.bboxes.tolist() == [[0, 1, 3, 4], [6, 5, 10, 8]]
    assert merged.labels.tolist() == [0, 2]
    assert torch.equal(merged.masks, masks)

    extra_mask = torch.zeros(1, 8, 10, dtype=torch.bool)
    extra_mask[0, 0:2, 8:10] = True  # seen flipped at the left edge: top-right once unflipped
    only_flipped = _instance_sample([[0, 0, 2, 2]], [0.7], [1], extra_mask.flip(-1), flip=True)
    merged = tta.merge_preds([[unflipped, only_flipped]])[0].pred_instances
    assert merged.bboxes.tolist()[-1] == [8, 0, 10, 2]
    assert torch.equal(merged.masks[-1], extra_mask[0])


def test_instance_tta_keeps_the_best_detections_with_their_own_labels_and_masks():
    """Past ``max_per_img`` the highest scores are kept, each with its label and mask."""
    from vitdense.det import InstanceTTAModel
    masks = torch.zeros(3, 8, 10, dtype=torch.bool)
    for k in range(3):
        masks[k, k, k] = True
    view = _instance_sample([[0, 0, 2, 2], [4, 0, 6, 2], [8, 0, 10, 2]], [0.5, 0.9, 0.7],
                            [3, 4, 5], masks, flip=False)
    tta = InstanceTTAModel(module=RegressToOne(nn.Identity()),
                           tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5),
                                        max_per_img=2))
    merged = tta.merge_preds([[view]])[0].pred_instances
    assert merged.bboxes.tolist() == [[4, 0, 6, 2], [8, 0, 10, 2]]
    assert merged.scores.tolist() == pytest.approx([0.9, 0.7])
    assert merged.labels.tolist() == [4, 5]
    assert torch.equal(merged.masks, masks[[1, 2]])


@pytest.mark.parametrize('name', [name for name in DENSE_RECIPES if 'mask-rcnn' in name])
def test_shipped_instance_tta_suppresses_at_mmdets_iou(name, tmp_path):
    """The recipes' merging is mmdet's (class-wise NMS at IoU 0.5, 100 per image): two
    views' boxes of one class overlapping at IoU 0.6 merge into one, at 0.4 both stay."""
    cfg = _config(name, tmp_path)
    from vitdense.det import InstanceTTAModel
    tta = InstanceTTAModel(module=RegressToOne(nn.Identity()), tta_cfg=cfg.tta_model.tta_cfg)
    assert tta.tta_cfg['max_per_img'] == 100
    masks = torch.zeros(1, 8, 10, dtype=torch.bool)
    first = _instance_sample([[0, 0, 10, 6]], [0.9], [1], masks, flip=False)
    # the same box shifted: IoU 0.6 (width 10, overlap 7.5) and 0.4 (overlap 5.71...)
    for shift, kept in ((2.5, 1), (4.2857, 2)):
        second = _instance_sample([[shift, 0, 10 + shift, 6]], [0.8], [1], masks, flip=False)
        merged = tta.merge_preds([[first, second]])[0].pred_instances
        assert len(merged.bboxes) == kept


# ---------------------------------------------------------------- sliding windows
@pytest.fixture(scope='module')
def demo_segmentor(tmp_path_factory):
    cfg = load_tool_config(str(REPO_ROOT / DEMO_SEG), None, 'none',
                         str(tmp_path_factory.mktemp('slide')))
    torch.manual_seed(0)
    return build_model(cfg, 'count').eval()


def _logits(segmentor, image: torch.Tensor, test_cfg: dict) -> torch.Tensor:
    segmentor.test_cfg = test_cfg
    metas = [dict(img_shape=image.shape[2:], ori_shape=image.shape[2:])] * image.shape[0]
    with torch.no_grad():
        return segmentor.inference(image, metas)


def test_slide_with_the_crop_the_image_size_is_whole_image_inference(demo_segmentor):
    image = torch.randn(2, 3, 128, 128)
    whole = _logits(demo_segmentor, image, ConfigDict(mode='whole'))
    slide = _logits(demo_segmentor, image, ConfigDict(mode='slide', crop_size=(128, 128),
                                                      stride=(85, 85)))
    assert torch.equal(slide, whole)


def test_slide_over_exact_tiles_is_whole_image_inference_of_each_tile(demo_segmentor):
    """64² windows at stride 64 tile a 128×192 image: each window's logits are the whole-image
    logits of that tile, written in place."""
    image = torch.randn(1, 3, 128, 192)
    slide = _logits(demo_segmentor, image, ConfigDict(mode='slide', crop_size=(64, 64),
                                                      stride=(64, 64)))
    for top in (0, 64):
        for left in (0, 64, 128):
            tile = image[:, :, top:top + 64, left:left + 64]
            whole = _logits(demo_segmentor, tile, ConfigDict(mode='whole'))
            assert torch.equal(slide[:, :, top:top + 64, left:left + 64], whole)
