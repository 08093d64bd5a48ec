"""tools/test.py --tta: the config's tta_model wraps its model, the test set is read through its
tta_pipeline (inside dataset wrappers too), a config without them is refused by name, and the
demo Mask R-CNN is evaluated with multi-scale + flip views, masks included."""
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from tools.test import use_tta
from vitdense.demo_data import make_demo_coco
from vitdense.model_factory import build_model

from common import CHECKOUT_ENV, REPO_ROOT, load_tool_config

DEMO_DET = 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py'


def _config(**keys) -> Config:
    return Config(dict(model=dict(type='Segmentor'),
                       test_dataloader=dict(dataset=dict(
                           type='RepeatDataset', dataset=dict(type='Set', pipeline=['single']))),
                       **keys))


def test_tta_wraps_the_model_and_reads_the_test_set_through_the_tta_pipeline():
    cfg = _config(tta_model=dict(type='SegTTAModel'), tta_pipeline=['views'])
    use_tta(cfg)
    assert cfg.model == dict(type='SegTTAModel', module=dict(type='Segmentor'))
    assert cfg.test_dataloader.dataset.dataset.pipeline == ['views']


@pytest.mark.parametrize('keys, missing', [
    (dict(tta_pipeline=['views']), 'tta_model'),
    (dict(tta_model=dict(type='SegTTAModel')), 'tta_pipeline'),
    (dict(), 'tta_model and tta_pipeline'),
])
def test_tta_without_the_config_keys_names_them(keys, missing):
    with pytest.raises(ValueError, match=f'lacks {missing}'):
        use_tta(_config(**keys))


def test_demo_mask_rcnn_is_evaluated_with_tta(tmp_path):
    data_root = make_demo_coco(tmp_path / 'data', num_train=0, num_val=2, size=96)
    cfg = load_tool_config(str(REPO_ROOT / DEMO_DET), None, 'none', str(tmp_path / 'build'))
    torch.manual_seed(0)
    checkpoint = tmp_path / 'untrained.pth'
    torch.save(dict(state_dict=build_model(cfg, 'train').state_dict()), checkpoint)
    ann_file = str(data_root / 'annotations' / 'instances_val.json')
    options = [f'test_dataloader.dataset.data_root={data_root}',
               f'test_evaluator.ann_file={ann_file}',
               'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']
    result = subprocess.run(
        [sys.executable, 'tools/test.py', DEMO_DET, str(checkpoint), '--tta',
         '--work-dir', str(tmp_path / 'work'), '--cfg-options', *options],
        cwd=REPO_ROOT, env=CHECKOUT_ENV | {'OMP_NUM_THREADS': '1'}, capture_output=True,
        text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'coco/segm_mAP' in result.stdout + result.stderr
