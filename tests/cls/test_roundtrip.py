"""A classification checkpoint trained with vitdense initialises dense-prediction backbones.

Train a demo config a few steps with mmpretrain, then build a Mask R-CNN (mmdet) and an
UperNet (mmseg) whose backbone is the same architecture in dense mode with
``init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')``: every trunk weight
must equal the trained one.
"""
import importlib
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

from vitdense.checkpoint_io import safe_load
from vitdense.demo_data import make_demo_imagenet

from common import CONFIGS, TINY_ARCH


@pytest.fixture(scope='module', params=['xcit', 'cait'])
def trained(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """(backbone config in dense form, trained classification state dict)."""
    work = tmp_path_factory.mktemp(f'{request.param}_cls')
    cfg = Config.fromfile(
        CONFIGS / request.param / f'{request.param}-mini-p16_1xb64-8e_demo-in10-64px.py')
    cfg.model.backbone.arch = TINY_ARCH
    cfg.model.head.in_channels = TINY_ARCH['embed_dims']
    cfg.train_dataloader.update(batch_size=5, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.data_root = str(make_demo_imagenet(work / 'data', 1, 0))
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.train_cfg = dict(by_epoch=True, max_epochs=1)
    cfg.default_hooks.checkpoint = dict(type='vitdense.SafeCheckpointHook', interval=1)
    cfg.work_dir = str(work)
    runner = Runner.from_cfg(cfg)
    runner.train()
    checkpoint = work / 'epoch_1.pth'
    dense = dict(cfg.model.backbone, out_type='featmap', pyramid=True,
                 init_cfg=dict(type='Pretrained', checkpoint=str(checkpoint),
                               prefix='backbone.'))
    state = safe_load(checkpoint, map_location='cpu')['state_dict']
    return dense, {k[len('backbone.'):]: v for k, v in state.items()
                   if k.startswith('backbone.')}


def package_config(package: str, relative: str) -> Config:
    """A config shipped inside an installed OpenMMLab package (``<package>/.mim/configs``)."""
    root = Path(importlib.import_module(package).__file__).parent
    return Config.fromfile(root / '.mim' / 'configs' / relative)


def assert_trunk_loaded(backbone: torch.nn.Module, trained_state: dict) -> None:
    loaded = backbone.state_dict()
    trunk = [k for k in trained_state if k.startswith(('blocks.', 'patch_embed.', 'pos_embed'))]
    assert any(k.startswith('blocks.') for k in trunk)
    for key in trunk:
        assert torch.equal(loaded[key], trained_state[key]), key


def test_mask_rcnn_backbone_loads_the_classification_weights(trained: tuple[dict, dict]) -> None:
    from mmdet.registry import MODELS
    dense, trained_state = trained
    init_default_scope('mmdet')
    cfg = package_config('mmdet', '_base_/models/mask-rcnn_r50_fpn.py').model
    cfg.backbone = dense
    cfg.neck.in_channels = [TINY_ARCH['embed_dims']] * 4
    model = MODELS.build(cfg)
    model.init_weights()
    assert_trunk_loaded(model.backbone, trained_state)


def test_upernet_backbone_loads_the_classification_weights(trained: tuple[dict, dict]) -> None:
    from mmseg.registry import MODELS
    dense, trained_state = trained
    init_default_scope('mmseg')
    cfg = package_config('mmseg', '_base_/models/upernet_r50.py').model
    cfg.pop('pretrained', None)
    cfg.backbone = dense
    cfg.decode_head.in_channels = [TINY_ARCH['embed_dims']] * 4
    cfg.auxiliary_head.in_channels = TINY_ARCH['embed_dims']
    for key in ('decode_head', 'auxiliary_head'):
        cfg[key].norm_cfg = dict(type='BN', requires_grad=True)
    cfg.data_preprocessor.pop('size', None)
    model = MODELS.build(cfg)
    model.init_weights()
    assert_trunk_loaded(model.backbone, trained_state)
