"""Fine-tuning at a higher resolution: a 224 classification checkpoint loads into a 384 model.

Checkpoints go through ``init_cfg=dict(type='Pretrained')`` exactly as the ``*-384px`` configs
load them; the backbone's load hook resamples learned position tables to the new grid.
"""
from pathlib import Path

import pytest
import torch
from mmpretrain.registry import MODELS

import vitdense.cls  # noqa: F401  (registers vitdense.ViTClassifier and the backbones)

from common import TINY_BACKBONES


def classifier(family: str, img_size: int, checkpoint: Path | None = None) -> torch.nn.Module:
    init_cfg = None if checkpoint is None else dict(type='Pretrained',
                                                    checkpoint=str(checkpoint))
    model = MODELS.build(dict(
        type='vitdense.ViTClassifier', neck=None, init_cfg=init_cfg,
        backbone=dict(TINY_BACKBONES[family], img_size=img_size, patch_size=8,
                      out_type='cls_token'),
        head=dict(type='LinearClsHead', num_classes=5, in_channels=32)))
    model.init_weights()
    return model.eval()


@pytest.fixture(params=sorted(TINY_BACKBONES))
def pretrained(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, dict]:
    """A randomly initialised 'pretrained' 32-pixel classifier (4x4 grid) and its checkpoint."""
    torch.manual_seed(0)
    model = classifier(request.param, img_size=32)
    with torch.no_grad():  # make position tables non-trivial so resampling errors show
        for name, param in model.named_parameters():
            if 'pos_embed' in name:
                param.normal_()
    path = tmp_path / 'pretrained.pth'
    torch.save({'state_dict': model.state_dict()}, path)
    return request.param, path, model.state_dict()


def test_same_grid_keeps_logits_identical(pretrained: tuple[str, Path, dict]) -> None:
    family, path, _ = pretrained
    original = classifier(family, img_size=32)
    original.load_state_dict(torch.load(path)['state_dict'])
    reloaded = classifier(family, img_size=32, checkpoint=path)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(reloaded(images, mode='tensor'), original(images, mode='tensor'))


def test_higher_resolution_resamples_only_the_position_table(
        pretrained: tuple[str, Path, dict]) -> None:
    family, path, state = pretrained
    model = classifier(family, img_size=64, checkpoint=path)  # 4x4 -> 8x8 grid
    loaded = model.state_dict()
    assert loaded.keys() == state.keys()
    resampled = [k for k, v in state.items() if loaded[k].shape != v.shape]
    # XCiT's Fourier encoding has no table; the others resample exactly their position table
    assert bool(resampled) == (family != 'xcit')
    for key, value in state.items():
        if key in resampled:
            assert 'pos_embed' in key and loaded[key].numel() > value.numel()
        elif key.endswith('pos_embed.table_grid'):  # the table's grid, saved with it
            assert value.tolist() == [4, 4] and loaded[key].tolist() == [8, 8]
        else:
            assert torch.equal(loaded[key], value), key
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 64, 64), mode='tensor')
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
