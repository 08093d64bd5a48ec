"""Every classification config builds and trains one epoch end to end on a tiny demo set.

Each config runs through mmengine's Runner as a user would (dataset, pipeline, sampler, batch
augments, optimizer, schedule, validation), with only the backbone narrowed and shortened so
a step takes milliseconds; crop sizes, losses and optimizers stay those of the recipe.
"""
import re
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from vitdense.demo_data import make_demo_imagenet

from common import CONFIGS

CLASSIFICATION = re.compile(r'_(in1k(-\d+px)?|demo-in10-\d+px)$')
CLASSIFICATION_CONFIGS = sorted(p for family in ('vit', 'cait', 'xcit', 'convit')
                                for p in (CONFIGS / family).glob('*.py')
                                if CLASSIFICATION.search(p.stem))


@pytest.fixture(scope='module', autouse=True)
def single_thread():
    """Tiny models run fastest on one thread, above all on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def tiny_imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_imagenet(tmp_path_factory.mktemp('demo_in10'), num_train=1, num_val=1)


def shrink(cfg: Config, data_root: Path) -> None:
    """Four narrow blocks, a cheap teacher, no pretrained weights, the tiny data set."""
    backbone = cfg.model.backbone
    backbone.arch = dict(embed_dims=48, num_layers=4, num_heads=2)
    if backbone.type == 'vitdense.ConViT':
        backbone.arch.num_local_layers = 1
    if 'depth' in backbone:
        backbone.depth = 4
    cfg.model.head.in_channels = 48
    cfg.model.pop('init_cfg', None)
    if 'teacher' in cfg.model:
        cfg.model.teacher = dict(config='mmpretrain::regnet/regnetx-400mf_8xb128_in1k.py')
    for loader in ('train_dataloader', 'val_dataloader'):
        cfg[loader].update(batch_size=5, num_workers=0, persistent_workers=False)
        cfg[loader].dataset.data_root = str(data_root)
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.train_cfg.update(max_epochs=1, val_interval=1)


def test_every_family_has_configs() -> None:
    names = [p.name for p in CLASSIFICATION_CONFIGS]
    for family in ('vit', 'cait', 'xcit', 'convit'):
        assert any(n.startswith(family) and n.endswith('in1k.py') for n in names), family
        assert any(n.startswith(family) and n.endswith('in1k-384px.py') for n in names), family
        assert any(n.startswith(family) and 'demo-in10' in n for n in names), family


@pytest.mark.parametrize('path', CLASSIFICATION_CONFIGS,
                         ids=[p.stem for p in CLASSIFICATION_CONFIGS])
def test_config_trains_one_epoch(path: Path, tiny_imagenet: Path, tmp_path: Path) -> None:
    cfg = Config.fromfile(path)
    assert cfg.default_scope == 'mmpretrain'
    assert 'vitdense' in cfg.custom_imports.imports
    shrink(cfg, tiny_imagenet)
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    runner.train()
    hub = runner.message_hub
    assert runner.iter == 2  # 10 images in batches of 5
    assert torch.isfinite(torch.tensor(hub.get_scalar('train/loss').current()))
    assert 0.0 <= hub.get_scalar('val/accuracy/top1').current() <= 100.0
