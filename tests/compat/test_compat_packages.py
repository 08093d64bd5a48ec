"""Configs that inherit from package files (``mmdet::...``) load without pkg_resources."""
from __future__ import annotations

import os.path as osp
import sys

import pytest
from mmengine.config import Config
from mmengine import utils

import vitdense  # noqa: F401  (applies vitdense.compat)


@pytest.fixture
def no_pkg_resources(monkeypatch):
    """setuptools >= 81 ships no pkg_resources: make sure nothing falls back to it."""
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
