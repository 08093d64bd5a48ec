"""The data check before training names the broken file: an annotation file that is not
JSON, an empty data set, a zero-byte image, a truncated label map, a truncated JPEG that
still decodes; during training a
failing sample is named, or skipped and counted when asked."""
from __future__ import annotations

from pathlib import Path

import mmcv
import pytest
from mmengine.registry import DefaultScope
from PIL import ImageFile

from vitdense.demo_data import make_demo_ade, make_demo_coco
from vitdense.engine.preflight import CheckedDataset, DataError, check_data
from vitdense.engine.tool_config import point_at_data_root

from common import REPO_ROOT, load_tool_config

ADE = str(REPO_ROOT / 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py')
COCO = str(REPO_ROOT / 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py')
PANOPTIC = str(REPO_ROOT / 'configs/vit/mask2former_vit-d6-p8_panoptic_demo-coco.py')


@pytest.fixture
def ade(tmp_path) -> Path:
    return make_demo_ade(tmp_path / 'ade', num_train=4, num_val=2, size=64)


def _config(path: str, data_root: Path, work_dir: Path):
    cfg = load_tool_config(path, None, 'none', str(work_dir))
    point_at_data_root(cfg, data_root)
    cfg.train_dataloader.batch_size = 2
    return cfg


def test_good_data_passes_and_training_set_is_wrapped(ade, tmp_path):
    cfg = _config(ADE, ade, tmp_path)
    check_data(cfg)
    assert cfg.train_dataloader.dataset.type == 'vitdense.CheckedDataset'


def test_annotation_file_that_is_not_json(tmp_path):
    coco = make_demo_coco(tmp_path / 'coco', num_train=2, num_val=1, size=64)
    (coco / 'annotations' / 'instances_train.json').write_text('{"images": [')
    with pytest.raises(DataError, match=r'instances_train\.json is not valid JSON'):
        check_data(_config(COCO, coco, tmp_path))


def test_empty_data_set(ade, tmp_path):
    for image in (ade / 'images' / 'training').iterdir():
        image.unlink()
    with pytest.raises(DataError, match=r'train_dataloader: the data set is empty \(data_root='):
        check_data(_config(ADE, ade, tmp_path))


@pytest.mark.parametrize('damage', ['zero-byte image', 'truncated label map'])
def test_broken_sample_is_named(ade, tmp_path, damage):
    if damage == 'zero-byte image':
        broken = sorted((ade / 'images' / 'training').iterdir())[1]
        broken.write_bytes(b'')
    else:
        broken = sorted((ade / 'annotations' / 'training').iterdir())[1]
        broken.write_bytes(broken.read_bytes()[:60])
    with pytest.raises(DataError, match=rf'sample 1 \(.*{broken.name}.*\) failed to load'):
        check_data(_config(ADE, ade, tmp_path))


def test_bad_sample_during_training_is_skipped_and_counted(ade, tmp_path):
    cfg = _config(ADE, ade, tmp_path)
    broken = sorted((ade / 'images' / 'training').iterdir())[3]  # after the checked batches
    check_data(cfg)
    broken.write_bytes(b'')
    with DefaultScope.overwrite_default_scope('mmseg'):
        dataset = CheckedDataset(cfg.train_dataloader.dataset.dataset, skip_bad=True)
        with pytest.raises(DataError, match=broken.name):
            CheckedDataset(cfg.train_dataloader.dataset.dataset)[3]
    sample = dataset[3]
    assert sample['data_samples'].img_path.endswith(sorted(
        (ade / 'images' / 'training').iterdir())[0].name)
    assert len(dataset.skipped) == 1 and broken.name in dataset.skipped[0]


def test_truncated_jpeg_that_decodes_is_named(ade, tmp_path, monkeypatch):
    # Pillow told to accept truncated files (as many training scripts do) decodes the first
    # rows and fills the rest: the loader raises nothing, the check must.
    monkeypatch.setattr(ImageFile, 'LOAD_TRUNCATED_IMAGES', True)
    cfg = _config(ADE, ade, tmp_path)
    for step in cfg.train_dataloader.dataset.pipeline:
        if step.type == 'LoadImageFromFile':
            step.imdecode_backend = 'pillow'
    broken = sorted((ade / 'images' / 'training').iterdir())[1]
    assert broken.suffix == '.jpg'
    broken.write_bytes(broken.read_bytes()[:broken.stat().st_size * 2 // 3])
    assert mmcv.imread(str(broken), backend='pillow').shape == (64, 64, 3)  # the premise
    with pytest.raises(DataError, match=rf'sample 1 \(.*{broken.name}.*\) failed to load.*'
                                        'truncated or damaged'):
        check_data(cfg)


def test_jpeg_with_bytes_after_its_end_passes(ade, tmp_path):
    image = sorted((ade / 'images' / 'training').iterdir())[1]
    image.write_bytes(image.read_bytes() + b'appended by a camera' * 10)
    check_data(_config(ADE, ade, tmp_path))


@pytest.mark.parametrize('config, kind, folder', [
    (COCO, 'coco', 'demo_coco'), (ADE, 'ade', 'demo_ade'),
    (PANOPTIC, 'panoptic', 'demo_coco_panoptic')], ids=['coco', 'ade', 'panoptic'])
def test_missing_demo_set_names_the_command_that_writes_it(config, kind, folder, tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # the configs' own relative data_root, absent here
    cfg = load_tool_config(config, None, 'none', str(tmp_path / 'work'))
    with pytest.raises(DataError, match=rf'the demo {kind} set is not at data/{folder}/?: '
                                        rf'write it with `python tools/data/make_demo_data\.py '
                                        rf'{kind}`'):
        check_data(cfg)


def test_missing_demo_set_elsewhere_names_its_folder(tmp_path):
    root = tmp_path / 'data' / 'demo_ade'
    with pytest.raises(DataError, match=rf'write it with `python tools/data/make_demo_data\.py '
                                        rf'ade --out {root}`'):
        check_data(_config(ADE, root, tmp_path))
