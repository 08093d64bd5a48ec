"""tools/data/make_demo_data.py writes each demo set the demo configs read, from one command
line, and refuses options a set does not have."""
from __future__ import annotations

import pytest

from vitdense.demo_data import DEMO_IMAGENET_CLASSES, default_folder, demo_set_at

from common import REPO_ROOT, load_tool_config
from tools.data import make_demo_data


def test_imagenet_per_class_counts(tmp_path, capsys):
    out = tmp_path / 'in10'
    make_demo_data.main(['imagenet', '--out', str(out), '--num-train', '2', '--num-val', '1',
                         '--size', '32'])
    assert f'wrote imagenet demo set: {out}' in capsys.readouterr().out
    assert len(list((out / 'train').rglob('*.JPEG'))) == 2 * len(DEMO_IMAGENET_CLASSES)
    assert len(list((out / 'val').rglob('*.JPEG'))) == len(DEMO_IMAGENET_CLASSES)


def test_shape_options_refused_for_imagenet(tmp_path, capsys):
    with pytest.raises(SystemExit):
        make_demo_data.main(['imagenet', '--out', str(tmp_path), '--max-objects', '2'])
    assert '--max-objects: the imagenet demo set has no shapes to place' in \
        capsys.readouterr().err


@pytest.mark.parametrize('config, kind', [
    ('configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py', 'coco'),
    ('configs/xcit/upernet_xcit-d6-p8_demo-ade.py', 'ade'),
    ('configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py', 'imagenet')])
def test_default_folder_is_the_demo_configs_data_root(config, kind, tmp_path):
    cfg = load_tool_config(str(REPO_ROOT / config), None, 'none', str(tmp_path))
    data_root = cfg.train_dataloader.dataset.get('data_root') or \
        cfg.train_dataloader.dataset.dataset.data_root
    assert demo_set_at(data_root) == kind
    assert data_root.rstrip('/') == default_folder(kind)
