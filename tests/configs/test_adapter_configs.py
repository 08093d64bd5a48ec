"""The ViT-Adapter recipes: every family's Mask R-CNN 3x and UperNet 160k configs build with the
paper's parameter counts where it reports the size, and every family's demo adapter config
trains two iterations on the demo sets and is scored by the real evaluators."""
from pathlib import Path

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.runner import Runner

from vitdense.demo_data import make_demo_ade, make_demo_coco
from vitdense.model_factory import build_model
from vitdense.engine.tool_config import point_at_data_root

from common import REPO_ROOT, load_tool_config

FAMILIES = ('vit', 'cait', 'xcit', 'convit')
#: the full recipes with the parameters (millions, one decimal) of the paper's Tables 1 and 4
#: (Chen et al., ICLR 2023) where it reports the size: None where it does not
FULL_CONFIGS = {
    'vit/mask-rcnn_vit-t-p16_adapter_3x_coco.py': 28.1,
    'vit/mask-rcnn_vit-s-p16_adapter_3x_coco.py': 47.8,
    'vit/mask-rcnn_vit-b-p16_adapter_3x_coco.py': 120.2,
    'vit/upernet_vit-t-p16_adapter_8xb2-160k_ade20k-512x512.py': 36.1,
    'vit/upernet_vit-s-p16_adapter_8xb2-160k_ade20k-512x512.py': 57.6,
    'vit/upernet_vit-b-p16_adapter_8xb2-160k_ade20k-512x512.py': 133.6,
    'cait/mask-rcnn_cait-s24-p16_adapter_3x_coco.py': None,
    'cait/upernet_cait-s24-p16_adapter_8xb2-160k_ade20k-512x512.py': None,
    'xcit/mask-rcnn_xcit-s12-p16_adapter_3x_coco.py': None,
    'xcit/upernet_xcit-s12-p16_adapter_8xb2-160k_ade20k-512x512.py': None,
    'convit/mask-rcnn_convit-s-p16_adapter_3x_coco.py': None,
    'convit/upernet_convit-s-p16_adapter_8xb2-160k_ade20k-512x512.py': None,
}


@pytest.mark.parametrize('config', sorted(FULL_CONFIGS))
def test_full_adapter_config_builds_with_the_papers_parameters(config):
    cfg = Config.fromfile(str(REPO_ROOT / 'configs' / config))
    model = build_model(cfg, 'count', device='meta')
    assert type(model.backbone).__name__ == 'ColumnarAdapter'
    assert type(model.backbone.trunk).__name__.lower() == config.split('/')[0]
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    if FULL_CONFIGS[config] is not None:
        assert round(millions, 1) == FULL_CONFIGS[config]


@pytest.mark.parametrize('config', sorted(FULL_CONFIGS) + [
    f'{family}/{task}_{family}-d6-p8_adapter_{suffix}.py' for family in FAMILIES
    for task, suffix in (('mask-rcnn', 'demo-coco'), ('upernet', 'demo-ade'))])
def test_adapter_recipes_follow_the_official_code_of_their_task(config):
    """Detection: the trunk's last map on every level; segmentation: the map after interaction
    i on level i, and the official test mode (512² windows at stride 341) in the full
    recipes."""
    cfg = Config.fromfile(str(REPO_ROOT / 'configs' / config))
    segmentation = 'upernet' in config
    assert cfg.model.backbone.vit_features == ('per_interaction' if segmentation else 'last')
    if segmentation and 'demo' not in config:
        assert cfg.model.test_cfg == dict(mode='slide', crop_size=(512, 512),
                                          stride=(341, 341))


def _demo_run(config: str, data_root: Path, work_dir: Path) -> Config:
    cfg = load_tool_config(str(REPO_ROOT / config), None, 'none', str(work_dir))
    point_at_data_root(cfg, data_root)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.val_dataloader.update(num_workers=0, persistent_workers=False)
    cfg.test_dataloader = cfg.val_dataloader
    cfg.train_cfg.update(max_iters=2, val_interval=2)
    cfg.default_hooks.checkpoint = None
    cfg.randomness = dict(seed=0)
    return cfg


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('task, make, metrics', [
    ('mask-rcnn', make_demo_coco, ('coco/bbox_mAP', 'coco/segm_mAP')),
    ('upernet', make_demo_ade, ('mIoU', 'aAcc')),
])
def test_demo_adapter_config_trains_and_is_evaluated(family, task, make, metrics, tmp_path):
    suffix = 'demo-coco' if task == 'mask-rcnn' else 'demo-ade'
    config = f'configs/{family}/{task}_{family}-d6-p8_adapter_{suffix}.py'
    data_root = make(tmp_path / 'data', num_train=2, num_val=1, size=96)
    runner = Runner.from_cfg(_demo_run(config, data_root, tmp_path / 'work'))
    runner.train()
    losses = np.array(runner.message_hub.get_scalar('train/loss').data[0])
    assert len(losses) == 2 and np.isfinite(losses).all()
    scores = runner.val_loop.run()
    for name in metrics:
        assert 0 <= scores[name] <= 100


MASK2FORMER_DEMO = 'configs/vit/mask2former_vit-adapter-d6-p8_demo-ade.py'


def test_mask2former_demo_adapter_config_trains_and_is_evaluated(tmp_path):
    """Two iterations of the shipped Mask2Former demo in the adapter's layout: finite losses
    for the final prediction and each of the 3 decoder layers' (mmseg's ``d<i>.`` keys), then
    mmseg's IoUMetric."""
    data_root = make_demo_ade(tmp_path / 'data', num_train=2, num_val=1, size=96)
    cfg = _demo_run(MASK2FORMER_DEMO, data_root, tmp_path / 'work')
    cfg.model.data_preprocessor.size = (96, 96)
    runner = Runner.from_cfg(cfg)
    assert cfg.model.backbone.vit_features == 'per_interaction'
    runner.train()
    losses = np.array(runner.message_hub.get_scalar('train/loss').data[0])
    assert len(losses) == 2 and np.isfinite(losses).all()
    logged = runner.message_hub.log_scalars
    # the pixel decoder's query before the first layer is scored as d0 (mmdet's Mask2Former)
    names = [f'train/decode.{stage}{loss}' for stage in ('', 'd0.', 'd1.', 'd2.')
             for loss in ('loss_cls', 'loss_mask', 'loss_dice')]
    assert all(np.isfinite(logged[name].current()) for name in names)
    scores = runner.val_loop.run()
    assert 0 <= scores['mIoU'] <= 100 and 0 <= scores['aAcc'] <= 100
