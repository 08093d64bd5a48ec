"""A fifth family is one file: ``toy_family.py`` (beside this test, imported by nothing in
the package) registers ``ToyFormer`` through the public hooks. Nothing else is edited, yet
the registry lists it, it builds in the classifier, pyramid and ViTDet layouts, and it trains
in the demo configs of another family (classifier, UperNet, ViTDet, Mask R-CNN) with only the
backbone's type changed."""
import importlib
import sys

import numpy as np
import pytest
import torch
from mmengine.runner import Runner

from vitdense.demo_data import make_demo_ade, make_demo_coco, make_demo_imagenet
from vitdense.engine.tool_config import point_at_data_root
from vitdense.models import SimpleFeaturePyramid, backbone_families
from vitdense.registry import MODELS

from common import (REPO_ROOT, arch_reads_while_building, load_tool_config,
                    options_missing_from_signature)

DEMO_CONFIGS = {
    'classifier': 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py',
    'pyramid': 'configs/vit/upernet_vit-d6-p8_demo-ade.py',
    'vitdet': 'configs/vit/upernet_vit-d6-p8_vitdet_demo-ade.py',
    'mask-rcnn': 'configs/vit/mask-rcnn_vit-d6-p8_fpn_demo-coco.py',
}


@pytest.fixture(scope='module')
def toy_family():
    """The toy family's class, registered for this module's tests only."""
    module = importlib.import_module('toy_family')
    yield module.ToyFormer
    MODELS.module_dict.pop('ToyFormer')
    sys.modules.pop('toy_family')


def test_the_registry_lists_the_new_family(toy_family):
    assert list(backbone_families())[-1] == 'toyformer'
    assert backbone_families()['toyformer'] is toy_family


def test_its_signature_names_its_options(toy_family):
    assert not options_missing_from_signature(toy_family, 'mini')
    assert not arch_reads_while_building(toy_family, 'mini')


def test_it_builds_in_every_layout(toy_family):
    images = torch.randn(2, 3, 64, 96)
    classifier = toy_family('mini', img_size=64, out_type='cls_token').eval()
    assert classifier(images)[0].shape == (2, 32)
    assert len(classifier.cls_blocks) == 2
    pyramid = toy_family('mini', img_size=64).eval()
    assert [f.shape for f in pyramid(images)] == [
        (2, 32, 64 // s, 96 // s) for s in (4, 8, 16, 32)]
    plain = toy_family('mini', img_size=64, patch_size=8, pyramid=False, out_indices=(-1,),
                       dense_class_token=False, window_size=4, window_block_indexes=(0, 2),
                       use_rel_pos=True).eval()
    assert [block.window_size for block in plain.blocks] == [4, 0, 4, 0]
    neck = SimpleFeaturePyramid(32, 16, scale_factors=(2.0, 1.0, 0.5, 0.25), num_outs=4)
    assert [f.shape for f in neck(plain(images))] == [
        (2, 16, 64 // s, 96 // s) for s in (4, 8, 16, 32)]
    assert {'blocks.0.ls1.gamma', 'blocks.0.attn.rel_pos.height'} <= plain.no_weight_decay()


@pytest.mark.parametrize('layout', DEMO_CONFIGS)
def test_it_trains_in_the_demo_configs(toy_family, layout, tmp_path):
    config = str(REPO_ROOT / DEMO_CONFIGS[layout])
    cfg = load_tool_config(config, None, 'none', str(tmp_path / 'work'))
    cfg.model.backbone.type = 'vitdense.ToyFormer'
    if layout == 'classifier':
        data_root = make_demo_imagenet(tmp_path / 'data', num_train=1, num_val=1, size=64)
    elif layout == 'mask-rcnn':
        data_root = make_demo_coco(tmp_path / 'data', num_train=2, num_val=1, size=64)
        resize = next(step for step in cfg.train_dataloader.dataset.pipeline
                      if step.type == 'Resize')
        resize.scale = (64, 64)
    else:
        data_root = make_demo_ade(tmp_path / 'data', num_train=2, num_val=1, size=64)
        cfg.model.data_preprocessor.size = (64, 64)
    point_at_data_root(cfg, data_root)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=2, val_interval=100)
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = None
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    runner = Runner.from_cfg(cfg)
    backbone = runner.model.backbone
    assert type(backbone) is toy_family
    before = [p.detach().clone() for p in backbone.parameters()]
    runner.train()
    losses = np.array(runner.message_hub.get_scalar('train/loss').data[0])
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert any(not torch.equal(a, b) for a, b in zip(before, backbone.parameters()))
