"""The start-up fixes (``vitdense_startup``): host libraries import and resolve package config
bases before (and without) ``import vitdense``, mmdet's and mmseg's own ``tools/train.py``
train our configs, and a library version a fix was not written for is refused loudly."""
from __future__ import annotations

import importlib.util
import os.path as osp
import subprocess
import sys
from pathlib import Path

import pytest
from mmengine import utils
from mmengine.config import Config

import vitdense  # noqa: F401  (installs the start-up finder, in case the .pth did not run)
from vitdense_startup import MMCV_EXT_WRITTEN_FOR, HostVersionError, require

from data import make_demo_ade, make_demo_coco

from common import REPO_ROOT


def _python(code: str, *args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment (its .pth files run)."""
    return subprocess.run([sys.executable, '-c', code, *args], cwd=cwd, capture_output=True,
                          text=True)


@pytest.fixture
def no_pkg_resources(monkeypatch):
    """setuptools >= 82 ships no pkg_resources: make sure nothing falls back to it."""
    monkeypatch.setitem(sys.modules, 'pkg_resources', None)


def test_package_base_configs_resolve(no_pkg_resources, tmp_path):
    cfg_file = tmp_path / 'leaf.py'
    cfg_file.write_text("_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py',\n"
                        "          'mmseg::_base_/schedules/schedule_20k.py']\n"
                        "model = dict(backbone=dict(depth=18))\n")
    cfg = Config.fromfile(str(cfg_file))
    assert cfg.model.type == 'MaskRCNN' and cfg.model.backbone.depth == 18
    assert cfg.train_cfg.max_iters == 20000


def test_installed_paths_follow_distribution_names(no_pkg_resources):
    import mmseg
    assert utils.is_installed('mmsegmentation') and utils.is_installed('mmdet')
    assert not utils.is_installed('vitdense_no_such_package')
    assert utils.get_installed_path('mmsegmentation') == osp.dirname(mmseg.__file__)
    assert utils.package_utils.package2module('mmsegmentation') == 'mmseg'


def test_host_libraries_import_and_load_configs_without_vitdense(tmp_path):
    result = _python(
        'import sys\n'
        "sys.modules['pkg_resources'] = None\n"
        'import mmdet.models, mmseg.models\n'
        'from mmengine.config import Config\n'
        "cfg = Config.fromfile(sys.argv[1], import_custom_modules=False)\n"
        "assert 'vitdense' not in sys.modules, 'imported vitdense'\n"
        "print(sys.modules['mmcv._ext'].__file__, cfg.model.type)\n",
        str(REPO_ROOT / 'configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py'), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    ext_file, model = result.stdout.split()  # the installed vitdense's stand-in
    assert ext_file.endswith('/vitdense/compat/mmcv_ext.py') and model == 'MaskRCNN'


def test_fixes_refuse_versions_they_were_not_written_for():
    require('torch-native mmcv ops', 'mmcv', '2.1.0', MMCV_EXT_WRITTEN_FOR)
    with pytest.raises(HostVersionError, match=r'"torch-native mmcv ops" was written for '
                                               r'mmcv>=2.0.0,<2.2.0, but mmcv 2.2.0 is'):
        require('torch-native mmcv ops', 'mmcv', '2.2.0', MMCV_EXT_WRITTEN_FOR)
    result = _python("import mmcv; mmcv.__version__ = '2.2.0'; import mmcv.ops")
    assert result.returncode != 0
    assert 'HostVersionError' in result.stderr and 'mmcv 2.2.0 is installed' in result.stderr


def _host_train(package: str, config: str, data_root: Path, work: Path,
                options: list[str]) -> str:
    """Train ``config`` for one iteration with the host library's own tools/train.py."""
    tool = Path(importlib.util.find_spec(package).origin).parent / '.mim/tools/train.py'
    loaders = [f'{split}_dataloader.dataset.data_root={data_root}'
               for split in ('train', 'val', 'test')]
    workers = [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
               for key in ('num_workers=0', 'persistent_workers=False')]
    result = subprocess.run(
        [sys.executable, str(tool), str(REPO_ROOT / config), '--work-dir', str(work),
         '--cfg-options', *loaders, *workers, 'train_cfg.max_iters=1',
         'train_cfg.val_interval=100', 'default_hooks.checkpoint.interval=1',
         'train_dataloader.batch_size=2', *options],
        cwd=work.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (work / 'iter_1.pth').exists()
    return result.stdout + result.stderr


def test_mmdet_and_mmseg_train_tools_run_our_configs(tmp_path):
    coco = make_demo_coco(tmp_path / 'coco', num_train=2, num_val=1, size=64)
    annotations = coco / 'annotations/instances_val.json'
    _host_train('mmdet', 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py', coco,
                tmp_path / 'det', [f'val_evaluator.ann_file={annotations}',
                                   f'test_evaluator.ann_file={annotations}'])
    ade = make_demo_ade(tmp_path / 'ade', num_train=2, num_val=1, size=64)
    _host_train('mmseg', 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py', ade, tmp_path / 'seg',
                ['model.data_preprocessor.size=(64,64)'])
