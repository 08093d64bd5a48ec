"""vitdense/model_factory.py: a config's host library registered, its model built for
training, deployment or counting, and a host preprocessor's normalisation."""
from __future__ import annotations

import pytest
import torch
from mmengine.config import Config

from vitdense.model_factory import build_model, image_normalization

from common import CONFIGS, TINY_ARCH

DISTILLED = CONFIGS / 'cait/cait-xxs24-distilled_8xb128_in1k.py'
FINETUNE = CONFIGS / 'vit/vit-s-p16_8xb64_in1k-384px.py'
SEGMENTOR = CONFIGS / 'xcit/upernet_xcit-d6-p8_demo-ade.py'


def _tiny_segmentor() -> Config:
    cfg = Config.fromfile(SEGMENTOR)
    cfg.merge_from_dict(dict(model=dict(
        backbone=dict(arch=dict(TINY_ARCH)),
        decode_head=dict(in_channels=[32] * 4, channels=32),
        auxiliary_head=dict(in_channels=32, channels=16))))
    return cfg


def test_counting_builds_on_meta_without_teacher_or_pretrained_weights():
    """The distilled recipe's teacher is a download: counting never builds it."""
    cfg = Config.fromfile(DISTILLED)
    model = build_model(cfg, 'count', device='meta')
    assert model.teacher is None
    assert all(p.is_meta for p in model.parameters())
    assert 'teacher' in cfg.model  # the config itself is left as it was


def test_training_keeps_the_pretrained_init_and_merges_the_preprocessor():
    cfg = Config.fromfile(FINETUNE)
    trained = build_model(cfg, 'train', device='meta')
    counted = build_model(cfg, 'count', device='meta')
    assert trained.init_cfg['type'] == 'Pretrained' and counted.init_cfg is None
    # as the Runner does: the config's top-level preprocessor (on meta: its shapes only)
    mean, std = image_normalization(trained.data_preprocessor)
    assert mean.shape == std.shape == (3, 1, 1)
    assert trained.data_preprocessor.num_classes == cfg.data_preprocessor.num_classes == 1000


def test_deploying_loads_every_weight_of_the_checkpoint_in_eval_mode(tmp_path):
    cfg = _tiny_segmentor()
    torch.manual_seed(0)
    trained = build_model(cfg, 'train')
    torch.save(dict(state_dict=trained.state_dict()), tmp_path / 'model.pth')
    torch.manual_seed(1)
    deployed = build_model(cfg, 'deploy', str(tmp_path / 'model.pth'))
    assert not deployed.training
    for key, value in trained.state_dict().items():
        assert torch.equal(deployed.state_dict()[key], value), key
    partial = dict(trained.state_dict())
    partial.pop('decode_head.conv_seg.weight')
    torch.save(dict(state_dict=partial), tmp_path / 'partial.pth')
    with pytest.raises(RuntimeError, match='decode_head.conv_seg.weight'):
        build_model(cfg, 'deploy', str(tmp_path / 'partial.pth'))


def test_unknown_purposes_and_checkpoints_outside_deployment_are_refused():
    cfg = _tiny_segmentor()
    with pytest.raises(ValueError, match="unknown purpose 'test'"):
        build_model(cfg, 'test')
    with pytest.raises(ValueError, match="loaded for purpose 'deploy', not 'count'"):
        build_model(cfg, 'count', 'model.pth')
    with pytest.raises(ValueError, match="default_scope=None"):
        build_model(Config(dict(model=cfg.model)), 'train')


def test_a_preprocessor_without_mean_and_std_does_not_normalise():
    from mmseg.models import SegDataPreProcessor

    assert image_normalization(SegDataPreProcessor()) is None
    mean, std = image_normalization(SegDataPreProcessor(mean=[1., 2., 3.], std=[4., 5., 6.]))
    assert mean.shape == std.shape == (3, 1, 1) and std.flatten().tolist() == [4., 5., 6.]
