"""Frozen-backbone probes: every family's linear and multi-layer probe configs build a
segmentor whose backbone has no trainable tensor; a demo probe trained a few iterations leaves
every backbone tensor (buffers included) bit-identical, keeps no optimiser state for it and
holds it in eval mode, while its head learns; with the class token where the trunk has one at
the probed blocks, refused where it has none."""
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.runner import Runner

from vitdense.demo_data import make_demo_ade
from vitdense.model_factory import build_model
from vitdense.engine.tool_config import point_at_data_root

from common import CONFIGS, load_tool_config

CLASS_TOKEN_OPTIONS = {'model.backbone.output_cls_token': True,
                       'model.decode_head.use_cls_token': True}
FAMILIES = {'xcit': ('xcit-s12-p16', 384), 'vit': ('vit-s-p16', 384),
            'cait': ('cait-xxs24-p16', 192), 'convit': ('convit-s-p16', 432)}


def _load(path: Path, work_dir: Path, cfg_options: Optional[dict] = None):
    cfg = load_tool_config(str(path), cfg_options, 'none', str(work_dir))
    return cfg


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('probe, layers', [('linear-probe', 1), ('ms-probe', 4)])
def test_ade20k_probe_freezes_the_whole_backbone(family, probe, layers, tmp_path):
    name, width = FAMILIES[family]
    cfg = _load(CONFIGS / family / f'{probe}_{name}_8xb2-40k_ade20k-512x512.py', tmp_path)
    assert cfg.model.test_cfg == dict(mode='slide', crop_size=(512, 512), stride=(341, 341))
    model = build_model(cfg, 'count')
    assert type(model).__name__ == 'FrozenBackboneSegmentor'
    assert len(model.backbone.out_indices) == layers
    assert not any(p.requires_grad for p in model.backbone.parameters())
    model.train()
    assert not model.backbone.training
    head = model.decode_head
    assert head.conv_seg.in_channels == width * layers == head.bn.num_features
    assert all(p.requires_grad for p in head.parameters())


def test_probe_head_needs_one_width_per_map():
    from vitdense.seg import LinearProbeHead
    with pytest.raises(ValueError, match=r'in_channels \[384\] for in_index \[0, 1\]'):
        LinearProbeHead(in_channels=[384], in_index=[0, 1], num_classes=5)


def test_probe_head_concatenates_each_blocks_class_token():
    """DINOv2's head with the class token: each block's token, normalised as its patch
    tokens, broadcast over the grid beside them: twice the channels, and the logits move with
    the class token alone."""
    from vitdense.seg import LinearProbeHead
    torch.manual_seed(0)
    head = LinearProbeHead(in_channels=[32, 32], in_index=[0, 1], use_cls_token=True,
                           num_classes=5, norm_cfg=dict(type='BN')).eval()
    assert head.conv_seg.in_channels == head.bn.num_features == 128
    maps = [torch.randn(2, 32, 4, 6), torch.randn(2, 32, 2, 3)]
    cls_tokens = [torch.randn(2, 32), torch.randn(2, 32)]
    with torch.no_grad():
        logits = head(list(zip(maps, cls_tokens)))
        other_token = head([(maps[0], cls_tokens[0]), (maps[1], torch.randn(2, 32))])
    assert logits.shape == other_token.shape == (2, 5, 4, 6)
    assert not torch.allclose(logits, other_token)
    with pytest.raises(ValueError, match=r'reads \(map, class token\) pairs: build the '
                                         r'backbone with output_cls_token=True'):
        head(maps)
    plain = LinearProbeHead(in_channels=[32], in_index=[0], num_classes=5)
    with pytest.raises(ValueError, match=r'set LinearProbeHead\(use_cls_token=True\)'):
        plain([(maps[0], cls_tokens[0])])


def test_probe_head_normalises_the_class_token_as_the_patch_tokens():
    """What reaches the BatchNorm: each map's tokens and its class token, broadcast over the
    grid, both layer-normalised by the map's norm (weight and bias of its own)."""
    from vitdense.seg import LinearProbeHead
    torch.manual_seed(0)
    head = LinearProbeHead(in_channels=[8], in_index=[0], use_cls_token=True, num_classes=3,
                           norm_cfg=dict(type='BN')).eval()
    norm = head.token_norms[0]
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    feature_map, cls_token = 3 + 2 * torch.randn(2, 8, 3, 4), 5 + 3 * torch.randn(2, 8)
    seen = []
    head.bn.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        head([(feature_map, cls_token)])

    def layer_norm(tokens: torch.Tensor) -> torch.Tensor:   # (..., C)
        return F.layer_norm(tokens, (8,), norm.weight, norm.bias, eps=1e-6)
    expected = torch.cat([layer_norm(feature_map.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
                          layer_norm(cls_token)[:, :, None, None].expand(-1, -1, 3, 4)], 1)
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=1e-5)


def test_ade20k_probe_with_the_class_token(tmp_path):
    """The shipped probes take the class token by two options: ViT's linear probe segments
    with it; ConViT's last-four-blocks probe reads two blocks before its class token joins,
    and CaiT's trunk has none: both are refused naming why."""
    cfg = _load(CONFIGS / 'vit' / 'linear-probe_vit-s-p16_8xb2-40k_ade20k-512x512.py', tmp_path,
                CLASS_TOKEN_OPTIONS)
    model = build_model(cfg, 'count').eval()
    assert model.decode_head.conv_seg.in_channels == 2 * 384
    with torch.no_grad():
        logits = model.decode_head(model.extract_feat(torch.randn(1, 3, 64, 48)))
    assert logits.shape == (1, 150, 4, 3)
    for config, match in [
            ('convit/ms-probe_convit-s-p16', r'joins before block 10, so block 8 of out_indices'),
            ('cait/linear-probe_cait-xxs24-p16', 'dense trunk of CaiT carries no class token')]:
        cfg = _load(CONFIGS / f'{config}_8xb2-40k_ade20k-512x512.py', tmp_path,
                    CLASS_TOKEN_OPTIONS)
        with pytest.raises(ValueError, match=match):
            build_model(cfg, 'count')


class BackboneModeProbe(Hook):
    """Records whether the backbone was in training mode at every training step."""

    def __init__(self) -> None:
        self.modes = []

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.modes.append(runner.model.backbone.training)


@pytest.mark.parametrize('family, cfg_options', [
    ('xcit', None), ('convit', None),
    pytest.param('convit', CLASS_TOKEN_OPTIONS, id='convit-with-class-token')])
def test_demo_probe_training_leaves_the_backbone_bit_identical(family, cfg_options, tmp_path):
    """XCiT (BatchNorm in its blocks) and ConViT (a class token joining late in the trunk),
    its probe with and without the class token."""
    data_root = make_demo_ade(tmp_path / 'data', num_train=4, num_val=1, size=64)
    cfg = _load(CONFIGS / family / f'linear-probe_{family}-d6-p8_demo-ade.py', tmp_path / 'work',
                cfg_options)
    point_at_data_root(cfg, data_root)
    cfg.model.data_preprocessor.size = (64, 64)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_cfg.update(max_iters=4, val_interval=100)
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.pop('visualization')
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.test_dataloader = cfg.test_cfg = cfg.test_evaluator = None
    cfg.randomness = dict(seed=0)
    runner = Runner.from_cfg(cfg)
    modes = BackboneModeProbe()
    runner.register_hook(modes)
    backbone = {k: v.clone() for k, v in runner.model.backbone.state_dict().items()}
    head = {k: v.clone() for k, v in runner.model.decode_head.state_dict().items()}
    runner.train()
    after = runner.model.backbone.state_dict()
    assert backbone.keys() == after.keys()
    for key, value in backbone.items():
        assert torch.equal(after[key], value), key
    assert any(not torch.equal(runner.model.decode_head.state_dict()[k], v)
               for k, v in head.items())
    assert modes.modes == [False] * 4
    optimizer = runner.optim_wrapper.optimizer
    backbone_params = {id(p) for p in runner.model.backbone.parameters()}
    assert not any(id(p) in backbone_params for p in optimizer.state)
    assert optimizer.state


def test_frozen_backbone_mask_rcnn_trains_the_pyramid_only(tmp_path):
    cfg = _load(CONFIGS / 'xcit' / 'mask-rcnn_xcit-s12-p16-frozen_fpn_3x_coco.py', tmp_path)
    backbone = build_model(cfg, 'count').backbone.train()
    trainable = {name.split('.')[0] for name, p in backbone.named_parameters() if p.requires_grad}
    assert trainable == {'pyramid'}
    assert not any(block.training for block in backbone.blocks)
    assert backbone.pyramid.training
