"""EoMT's demo recipes as shipped: semantic (mmseg; every family) and instance (mmdet, ViT)
segmentation train through tools/train.py and are scored by the hosts' metrics (IoUMetric,
CocoMetric), panoptic (mmdet, ViT) trains in-process and is scored by CocoPanopticMetric; the
semantic loss (the hosts' Mask2Former losses on every prediction) goes down over a few
iterations, and the annealing hook leaves the masks off once the schedule ends."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner import Runner

from vitdense.demo_data import make_demo_ade, make_demo_coco, make_demo_panoptic
from vitdense.engine.tool_config import point_at_data_root
from vitdense.models import EoMT

from common import CHECKOUT_ENV, REPO_ROOT, load_tool_config

SEMANTIC = 'configs/vit/eomt_vit-d6-p8_demo-ade.py'
INSTANCE = 'configs/vit/eomt_vit-d6-p8_demo-coco.py'
PANOPTIC = 'configs/vit/eomt_vit-d6-p8_panoptic_demo-coco.py'
COCO_PANOPTIC = 'configs/vit/eomt_vit-l-p16-{}_panoptic_4xb4-12e_coco-panoptic-640x640.py'
CAIT_SEMANTIC = 'configs/cait/eomt_cait-d6-p8_demo-ade.py'
XCIT_SEMANTIC = 'configs/xcit/eomt_xcit-d6-p8_demo-ade.py'
CONVIT_SEMANTIC = 'configs/convit/eomt_convit-d6-p8_demo-ade.py'
SIZE = 64
#: the losses of a prediction: the final one's, then (``d<i>.``) before each masked block
LOSSES = ('loss_cls', 'loss_mask', 'loss_dice')


@pytest.fixture(scope='module')
def data_root(tmp_path_factory) -> Path:
    return make_demo_ade(tmp_path_factory.mktemp('ade'), num_train=4, num_val=2, size=SIZE)


@pytest.mark.parametrize('config, make, prefix, metric', [
    (SEMANTIC, make_demo_ade, 'decode.', 'mIoU'),
    (INSTANCE, make_demo_coco, '', 'coco/segm_mAP'),
    (CAIT_SEMANTIC, make_demo_ade, 'decode.', 'mIoU'),
    (XCIT_SEMANTIC, make_demo_ade, 'decode.', 'mIoU'),
    (CONVIT_SEMANTIC, make_demo_ade, 'decode.', 'mIoU'),
], ids=['semantic', 'instance', 'semantic-cait', 'semantic-xcit', 'semantic-convit'])
def test_demo_config_trains_through_the_tool_and_is_scored(config, make, prefix, metric,
                                                           tmp_path):
    """Two iterations of the shipped config through tools/train.py: finite losses for the
    final prediction and the one before each of the 2 masked blocks, then the host's
    metric."""
    data_root = make(tmp_path / 'data', num_train=4, num_val=2, size=SIZE)
    work = tmp_path / 'work'
    options = [f'{split}_dataloader.dataset.data_root={data_root}'
               for split in ('train', 'val', 'test')]
    if config == INSTANCE:
        options += [f'{split}_evaluator.ann_file={data_root}/annotations/instances_val.json'
                    for split in ('val', 'test')]
    else:
        options.append(f'model.data_preprocessor.size=({SIZE},{SIZE})')
    options += ['train_cfg.max_iters=2', 'train_cfg.val_interval=2',
                'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
                'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
                'val_dataloader.persistent_workers=False', 'default_hooks.logger.interval=1',
                'default_hooks.checkpoint.interval=2', 'randomness.seed=0']
    result = subprocess.run([sys.executable, 'tools/train.py', config, '--work-dir', str(work),
                             '--cfg-options', *options], cwd=REPO_ROOT, capture_output=True,
                            text=True, env={**CHECKOUT_ENV, 'OMP_WAIT_POLICY': 'PASSIVE'})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logged = [json.loads(line) for path in work.rglob('scalars.json')
              for line in path.read_text().splitlines()]
    steps = [entry for entry in logged if 'loss' in entry]
    assert [entry['iter'] for entry in steps] == [1, 2]
    names = [f'{prefix}{stage}{loss}' for stage in ('', 'd0.', 'd1.') for loss in LOSSES]
    for entry in steps:
        assert np.isfinite([entry['loss'], *(entry[name] for name in names)]).all()
    scores = [entry for entry in logged if metric in entry]
    assert len(scores) == 1 and 0 <= scores[0][metric] <= 100


def test_head_refuses_another_number_of_queries():
    cfg = load_tool_config(str(REPO_ROOT / SEMANTIC), None, 'none', None)
    cfg.model.decode_head.num_queries = 30
    with DefaultScope.overwrite_default_scope('mmseg'):
        from mmseg.registry import MODELS
        model = MODELS.build(cfg.model)
    with pytest.raises(ValueError, match='num_queries=30 but the backbone predicts 20'):
        model(torch.zeros(1, 3, SIZE, SIZE), mode='tensor')


@pytest.mark.parametrize('config', [SEMANTIC, XCIT_SEMANTIC, CONVIT_SEMANTIC],
                         ids=['vit', 'xcit', 'convit'])
def test_demo_recipe_learns_and_anneals_its_masks(config, data_root, tmp_path):
    """The shipped recipe, 12 iterations at batch 2 with the schedule shortened to fit: the
    loss of the last iterations is below the first ones', and the masks are annealed away
    (probability zero) when the schedule ends."""
    cfg = load_tool_config(str(REPO_ROOT / config), None, 'none', str(tmp_path / 'work'))
    point_at_data_root(cfg, data_root)
    cfg.model.data_preprocessor.size = (SIZE, SIZE)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_cfg.update(max_iters=12, val_interval=100)
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0,
                                end=3)]
    cfg.custom_hooks[0].update(start_iters=[2, 4], end_iters=[6, 10])
    cfg.default_hooks.checkpoint = None
    cfg.randomness = dict(seed=0)
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = np.array(runner.message_hub.get_scalar('train/loss').data[0])
    assert len(losses) == 12 and np.isfinite(losses).all()
    # the ratio of the means was 0.66 and 0.62 at seeds 1 and 2
    assert losses[-3:].mean() < 0.9 * losses[:3].mean()
    eomt = next(m for m in runner.model.modules() if isinstance(m, EoMT))
    assert eomt.mask_probabilities.tolist() == [0.0, 0.0]


def test_panoptic_demo_trains_and_is_scored_by_the_panoptic_metric(tmp_path):
    """Four iterations of the shipped panoptic demo (mmdet's Mask2Former detector around EoMT,
    stuff and things): finite losses for every prediction, then mmdet's MaskFormerFusionHead
    and CocoPanopticMetric on the demo set's PNGs (PQ, SQ, RQ of all, things and stuff)."""
    data_root = make_demo_panoptic(tmp_path / 'data', num_train=4, num_val=2, size=SIZE)
    cfg = load_tool_config(str(REPO_ROOT / PANOPTIC), None, 'none', str(tmp_path / 'work'))
    point_at_data_root(cfg, data_root)
    for pipeline in (cfg.train_dataloader.dataset.pipeline,
                     cfg.test_dataloader.dataset.pipeline):
        next(t for t in pipeline if t.type == 'Resize').scale = (SIZE, SIZE)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.test_dataloader.update(num_workers=0, persistent_workers=False)
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.train_cfg.update(max_iters=4)
    cfg.default_hooks.checkpoint = None
    cfg.randomness = dict(seed=0)
    runner = Runner.from_cfg(cfg)
    assert runner.model.panoptic_head.num_stuff_classes == 2
    runner.train()
    logged = runner.message_hub.log_scalars
    names = [f'train/{stage}{loss}' for stage in ('', 'd0.', 'd1.') for loss in LOSSES]
    assert np.isfinite([logged[name].current() for name in names]).all()
    scores = runner.test()
    print('PQ after 4 iterations:', scores['coco_panoptic/PQ'])
    assert {f'coco_panoptic/{kind}{part}' for kind in ('PQ', 'SQ', 'RQ')
            for part in ('', '_th', '_st')} <= set(scores)
    assert all(0 <= score <= 100 for score in scores.values())


def official_panoptic(class_logits: torch.Tensor, mask_logits: torch.Tensor,
                      stuff_classes: list[int], mask_thresh: float,
                      overlap_thresh: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's panoptic map as the official code makes it (``training/lightning_module.py``,
    ``to_per_pixel_preds_panoptic``), written out: (class, segment) per pixel, the class
    ``num_classes`` and segment -1 where nothing is kept."""
    num_classes = class_logits.shape[-1] - 1
    scores, classes = class_logits.softmax(-1).max(-1)
    classes_map = torch.full(mask_logits.shape[-2:], num_classes, dtype=torch.long)
    segments = torch.full(mask_logits.shape[-2:], -1, dtype=torch.long)
    keep = classes.ne(num_classes) & (scores > mask_thresh)
    if not keep.any():
        return classes_map, segments
    masks = mask_logits[keep].sigmoid()
    owner = (scores[keep][:, None, None] * masks).argmax(0)
    next_id, stuff_ids = 0, {}
    for k, label in enumerate(classes[keep].tolist()):
        own, mine = masks[k] >= 0.5, owner == k
        final = own & mine
        if own.sum() == 0 or mine.sum() == 0 or final.sum() == 0 or \
                mine.sum() / own.sum() < overlap_thresh:
            continue
        if label in stuff_classes and label in stuff_ids:
            segments[final] = stuff_ids[label]
            continue
        if label in stuff_classes:
            stuff_ids[label] = next_id
        segments[final] = next_id
        classes_map[final] = label
        next_id += 1
    # a stuff segment's later pixels take its class too (the official fills classes per id)
    for label, segment in stuff_ids.items():
        classes_map[segments == segment] = label
    return classes_map, segments


def test_panoptic_fusion_is_the_official_panoptic_inference():
    """mmdet's MaskFormerFusionHead with the panoptic base's settings (object score > 0.8,
    0.8 of a mask kept, things first) makes the official panoptic map from the same logits:
    the same class at every pixel and the same pixels in each segment (stuff of one class
    merged), on queries of which some are dropped by score, some are "no object", some
    overlap."""
    from mmdet.models.seg_heads import MaskFormerFusionHead
    from mmdet.structures import DetDataSample
    from mmdet.evaluation.functional import INSTANCE_OFFSET
    cfg = Config.fromfile(str(REPO_ROOT / 'configs/_base_/models/eomt-panoptic_columnar.py'))
    things, stuff = cfg.num_things_classes, cfg.num_stuff_classes
    fusion = MaskFormerFusionHead(num_things_classes=things, num_stuff_classes=stuff,
                                  test_cfg=cfg.model.test_cfg)
    generator = torch.Generator().manual_seed(0)
    num_queries, size = 40, 48
    for _ in range(5):
        labels = torch.randint(0, things + stuff + 1, (num_queries,), generator=generator)
        labels[:6] = things + torch.arange(6) % 3  # stuff queries sharing classes
        class_logits = torch.randn(num_queries, things + stuff + 1, generator=generator)
        peak = torch.rand(num_queries, generator=generator) * 12  # some below 0.8
        class_logits[torch.arange(num_queries), labels] += peak
        # half the queries split the image into regions, the others overlap them at random
        owners = torch.randint(0, num_queries // 2, (size // 8, size // 8), generator=generator)
        regions = (owners == torch.arange(num_queries)[:, None, None]).float() * 10 - 5
        coarse = (regions + torch.randn(regions.shape, generator=generator) * 3)[:, None]
        mask_logits = torch.nn.functional.interpolate(coarse, (size, size),
                                                      mode='bilinear')[:, 0]
        classes, segments = official_panoptic(class_logits, mask_logits,
                                              list(range(things, things + stuff)), 0.8, 0.8)
        result = fusion.predict(class_logits[None], mask_logits[None],
                                [DetDataSample(metainfo=dict(img_shape=(size, size),
                                                             ori_shape=(size, size)))],
                                rescale=True)[0]['pan_results'].sem_seg[0].long()
        assert torch.equal(result % INSTANCE_OFFSET, classes)
        assert segments.max() >= 3  # the draw keeps several segments
        pairs = torch.stack([segments.flatten(), result.flatten()]).unique(dim=1)
        assert len(pairs[0].unique()) == len(pairs[1].unique()) == pairs.shape[1]


#: what the official COCO panoptic eomt_large_640.yaml sets per backbone: its weights, lr,
#: warmup (heads + ViT), whether the query blocks decay, and the annealing steps
OFFICIAL_COCO_PANOPTIC = {
    'dinov2': ('vit_large_patch14_reg4_dinov2.lvd142m.pth', 1e-4, 500 + 1000, True,
               [14782, 29564, 44346, 59128], [29564, 44346, 59128, 73910]),
    'dinov3': ('dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth', 2e-4, 2000 + 3000, False,
               [0, 29564, 44346, 59128], [3000, 44346, 59128, 73910]),
}


@pytest.mark.parametrize('source', sorted(OFFICIAL_COCO_PANOPTIC))
def test_coco_panoptic_recipe_has_the_official_settings(source):
    """The full COCO panoptic recipes against the official eomt_large_640.yaml (DINOv2, DINOv3)
    and the defaults of MaskClassificationPanoptic, COCOPanoptic and LightningModule."""
    weights, lr, warmup, decay, starts, ends = OFFICIAL_COCO_PANOPTIC[source]
    cfg = Config.fromfile(str(REPO_ROOT / COCO_PANOPTIC.format(source)))
    eomt, head = cfg.model.backbone, cfg.model.panoptic_head
    assert (eomt.num_queries, eomt.num_blocks, eomt.num_classes) == (200, 4, 133)
    assert eomt.get('decay_query_blocks', True) == decay
    assert (head.num_things_classes, head.num_stuff_classes, head.num_queries) == (80, 53, 200)
    assert eomt.backbone.arch == 'large' and eomt.backbone.reg_tokens == 4
    assert eomt.backbone.init_cfg.checkpoint.endswith(weights)
    assert head.loss_cls.class_weight == [1.0] * 133 + [0.1]
    assert (cfg.model.train_cfg.num_points, cfg.model.train_cfg.oversample_ratio,
            cfg.model.train_cfg.importance_sample_ratio) == (12544, 3.0, 0.75)
    test_cfg = cfg.model.test_cfg
    assert test_cfg.panoptic_on and (test_cfg.object_mask_thr, test_cfg.iou_thr) == (0.8, 0.8)
    assert test_cfg.filter_low_score  # a segment is its mask's pixels it wins (official)
    # 640² crops of a 0.1-2.0 scale jitter, tested at long side 640, padded to 640²
    resize = next(t for t in cfg.train_pipeline if t.type == 'RandomResize')
    crop = next(t for t in cfg.train_pipeline if t.type == 'RandomCrop')
    assert (resize.scale, resize.ratio_range, crop.crop_size) == ((640, 640), (0.1, 2.0),
                                                                  (640, 640))
    assert next(t for t in cfg.test_pipeline if t.type == 'Resize').scale == (640, 640)
    assert cfg.model.data_preprocessor.pad_size_divisor == 640
    # batch 16 on 4 GPUs, 12 epochs, the official annealing steps
    assert cfg.train_dataloader.batch_size * 4 == 16
    assert cfg.train_cfg.max_iters == 12 * 7391
    annealing = cfg.custom_hooks[0]
    assert annealing.start_iters == starts and annealing.end_iters == ends
    assert annealing.power == 0.9
    assert cfg.optim_wrapper.optimizer.lr == lr
    assert cfg.param_scheduler[0].end == cfg.param_scheduler[1].begin == warmup
    assert cfg.param_scheduler[1].end == cfg.train_cfg.max_iters
    assert cfg.optim_wrapper.optimizer.weight_decay == 0.05
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == 0.8
    assert cfg.param_scheduler[-1].power == 0.9
    assert cfg.val_evaluator.type == 'CocoPanopticMetric'
