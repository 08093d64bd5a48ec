"""The demo recipes: XCiT Mask R-CNN and UperNet learn on the generated sets (loss goes down
over a few iterations) and are scored by the real evaluators, so is ViT Mask2Former panoptic
(PQ by mmdet's CocoPanopticMetric); missing data and unknown backbones fail with messages
that name them; the LoRA demos train their adapters at their own learning rate."""
from pathlib import Path

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DATASETS, MODELS, DefaultScope
from mmengine.runner import Runner

from vitdense.analysis.complexity import load_config
from vitdense.demo_data import make_demo_ade, make_demo_coco, make_demo_panoptic
from vitdense.engine.tool_config import point_at_data_root
from vitdense.model_factory import build_model

from common import REPO_ROOT, load_tool_config

DET = 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py'
SEG = 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py'
PANOPTIC = 'configs/vit/mask2former_vit-d6-p8_panoptic_demo-coco.py'
LORA_DEMOS = sorted(str(path.relative_to(REPO_ROOT))
                    for path in REPO_ROOT.glob('configs/*/upernet_*-d6-p8_lora_demo-ade.py'))


def _short_run(config: str, data_root: Path, work_dir: Path, iters: int) -> Config:
    cfg = load_tool_config(str(REPO_ROOT / config), None, 'none', str(work_dir))
    point_at_data_root(cfg, data_root)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.val_dataloader.update(num_workers=0, persistent_workers=False)
    cfg.test_dataloader = cfg.val_dataloader
    cfg.train_cfg.update(max_iters=iters, val_interval=iters)
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0,
                                end=5)]
    cfg.default_hooks.checkpoint = None
    cfg.randomness = dict(seed=0)
    return cfg


def _losses(runner: Runner) -> np.ndarray:
    return np.array(runner.message_hub.get_scalar('train/loss').data[0])


@pytest.mark.parametrize('config, make, metrics', [
    (DET, make_demo_coco, ('coco/bbox_mAP', 'coco/segm_mAP')),
    (SEG, make_demo_ade, ('mIoU', 'aAcc')),
], ids=['mask-rcnn', 'upernet'])
def test_demo_recipe_learns_and_is_evaluated(config, make, metrics, tmp_path):
    data_root = make(tmp_path / 'data', num_train=4, num_val=2, size=96)
    cfg = _short_run(config, data_root, tmp_path / 'work', iters=16)
    if cfg.default_scope == 'mmseg':
        cfg.model.data_preprocessor.size = (96, 96)
    else:
        for pipeline in (cfg.train_dataloader.dataset.pipeline,
                         cfg.val_dataloader.dataset.pipeline):
            next(t for t in pipeline if t.type == 'Resize').scale = (96, 96)
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = _losses(runner)
    assert len(losses) == 16 and np.isfinite(losses).all()
    assert losses[-4:].mean() < 0.9 * losses[:4].mean()
    scores = runner.val_loop.run()
    for name in metrics:
        assert 0 <= scores[name] <= 100


def test_panoptic_demo_trains_and_is_scored_by_the_panoptic_metric(tmp_path):
    """Two iterations of the shipped demo config, then mmdet's CocoPanopticMetric on the
    demo set's PNGs: PQ, SQ and RQ of all, things and stuff (the metric's own correctness on
    this set: tests/demo_data/test_panoptic.py)."""
    data_root = make_demo_panoptic(tmp_path / 'data', num_train=4, num_val=2, size=64)
    cfg = _short_run(PANOPTIC, data_root, tmp_path / 'work', iters=2)
    for pipeline in (cfg.train_dataloader.dataset.pipeline, cfg.val_dataloader.dataset.pipeline):
        next(t for t in pipeline if t.type == 'Resize').scale = (64, 64)
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert np.isfinite(_losses(runner)).all()
    scores = runner.val_loop.run()
    assert {f'coco_panoptic/{kind}{part}' for kind in ('PQ', 'SQ', 'RQ')
            for part in ('', '_th', '_st')} <= set(scores)
    assert all(0 <= score <= 100 for score in scores.values())


def test_missing_dataset_names_the_path(tmp_path):
    for config in (DET, SEG):
        cfg = load_tool_config(str(REPO_ROOT / config), None, 'none', str(tmp_path))
        point_at_data_root(cfg, tmp_path / 'no_such_set')
        with DefaultScope.overwrite_default_scope(cfg.default_scope), \
                pytest.raises(Exception, match='no_such_set'):
            DATASETS.build(cfg.train_dataloader.dataset)


@pytest.mark.parametrize('backbone, message', [
    (dict(type='vitdense.XCiTT'), 'XCiTT'),
    (dict(arch='small_13'), 'small_13'),
])
def test_unknown_backbone_names_it(backbone, message, tmp_path):
    cfg = load_tool_config(str(REPO_ROOT / DET), None, 'none', str(tmp_path))
    cfg.model.backbone.update(backbone)
    with DefaultScope.overwrite_default_scope(cfg.default_scope), \
            pytest.raises(KeyError, match=message):
        MODELS.build(cfg.model)



def test_every_family_has_a_lora_demo():
    assert [Path(config).parent.name for config in LORA_DEMOS] == [
        'cait', 'convit', 'vit', 'xcit']


@pytest.mark.parametrize('config', LORA_DEMOS)
def test_lora_demo_trains_its_adapters_at_three_times_the_learning_rate(config):
    """The shipped optimizer (meta device): each adapter tensor at 3x the recipe's rate, every
    other trained tensor (pyramid, heads) at the recipe's own."""
    cfg = load_config(str(REPO_ROOT / config))
    model = build_model(cfg, 'count', device='meta')
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    base_lr = cfg.optim_wrapper.optimizer.lr
    names = {id(param): name for name, param in model.named_parameters()}
    lrs = {names[id(param)]: group['lr'] for group in optimizer.param_groups
           for param in group['params']}
    trained = {name for name, param in model.named_parameters() if param.requires_grad}
    adapters = {name for name in trained if '.lora_' in name}
    assert adapters and all(name.startswith('backbone.blocks.') for name in adapters)
    assert all(lrs[name] == pytest.approx(3 * base_lr) for name in adapters)
    assert all(lrs[name] == pytest.approx(base_lr) for name in trained - adapters)
