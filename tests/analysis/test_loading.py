"""Backbones to analyse from configs, timm names and checkpoints of whole models."""
import numpy as np
import pytest
import torch

from vitdense.analysis import (build_backbone, image_to_tensor, read_state_dict,
                               timm_random_state_dict)
from vitdense.checkpoint_io import UnsafeCheckpointError
from vitdense.models import ViT

from common import TINY_ARCH


def test_a_classifier_checkpoint_loads_its_backbone(tmp_path):
    source = ViT(TINY_ARCH, out_type='cls_token', img_size=32)
    state = {f'backbone.{k}': v for k, v in source.state_dict().items()}
    state['head.fc.weight'] = torch.zeros(10, 32)
    path = tmp_path / 'epoch_1.pth'
    torch.save(dict(meta={}, state_dict=state), path)
    config = dict(model=dict(backbone=dict(type='vitdense.ViT', arch=TINY_ARCH, img_size=32)))
    model = build_backbone(config=config, checkpoint=str(path))
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images), source.eval()(images))


def test_timm_weights_without_a_file_are_timm_initialisation():
    model = build_backbone(timm_name='vit_tiny_patch16_224')
    expected = timm_random_state_dict('vit_tiny_patch16_224')
    torch.testing.assert_close(model.pos_embed.weight, expected['pos_embed'])
    assert not model.training


def test_clear_errors():
    with pytest.raises(KeyError, match="no vitdense arch matches timm model 'resnet50'"):
        build_backbone(timm_name='resnet50')
    with pytest.raises(ValueError, match='exactly one of a config or a timm model name'):
        build_backbone()
    with pytest.raises(ValueError, match=r'53 missing, 0 unexpected(.|\n)*no option of ViT '
                                         r'loads it(.|\n)*missing: patch_embed.proj.weight'):
        build_backbone(config=dict(type='vitdense.ViT', arch=TINY_ARCH),
                       checkpoint=dict(state_dict={'cls_token': torch.zeros(1, 1, 32)}))
    with pytest.raises(FileNotFoundError, match='checkpoint not found: nowhere.pth'):
        read_state_dict('nowhere.pth')
    with pytest.raises(ValueError, match=r'checkpoint does not match ViT\(arch=custom'):
        build_backbone(config=dict(type='vitdense.ViT', arch=TINY_ARCH),
                       checkpoint=timm_random_state_dict('xcit_nano_12_p16_224'))


class Callback:
    """Code a checkpoint could smuggle in: unpickling it would import this module."""


def test_a_checkpoint_is_read_without_running_its_code(tmp_path):
    path = tmp_path / 'odd.pth'
    torch.save(dict(state_dict={}, callback=Callback()), path)
    with pytest.raises(UnsafeCheckpointError, match=r"refused to load checkpoint .*odd.pth"):
        read_state_dict(str(path))


def test_image_to_tensor_normalises_and_resizes():
    image = np.full((10, 20, 3), (123.675, 116.28, 103.53), dtype=np.float64)
    tensor = image_to_tensor(image.round().astype(np.uint8), size=(16, 32))
    assert tensor.shape == (1, 3, 16, 32)
    assert tensor.abs().max().item() < 0.01
    with pytest.raises(ValueError, match=r'RGB image of shape \(H, W, 3\)'):
        image_to_tensor(np.zeros((4, 4)))


def test_an_official_release_layout_loads():
    # official DeiT / CaiT / XCiT / ConViT releases wrap timm-like keys in 'model'
    release = dict(model=timm_random_state_dict('convit_tiny', seed=3), epoch=300)
    model = build_backbone(timm_name='convit_tiny', checkpoint=release)
    torch.testing.assert_close(model.blocks[0].attn.gating,
                               release['model']['blocks.0.attn.gating_param'])
